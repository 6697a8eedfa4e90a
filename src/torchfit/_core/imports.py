"""Optional dependencies, loaded lazily (``import torchfit`` needs only torch and numpy)."""

from __future__ import annotations

import functools
import importlib
import importlib.util
from types import ModuleType

__all__ = ["is_available", "require"]

#: The extra that brings each optional package.
_EXTRA: dict[str, str] = {
    "transformers": "hf",
    "accelerate": "hf",
    "huggingface_hub": "hf",
    "timm": "timm",
    "torchvision": "vision",
    "bitsandbytes": "quantize",
    "matplotlib": "plot",
    "tqdm": "test",
    "lightning": "lightning",
    "peft": "lora",
}


@functools.cache
def is_available(package: str) -> bool:
    """True when ``package`` can be imported, without importing it."""
    return importlib.util.find_spec(package) is not None


def require(package: str, *, feature: str) -> ModuleType:
    """Import ``package`` or raise an ImportError that names the extra to install.

    Example:
        >>> require("math", feature="the doctest").sqrt(4.0)
        2.0
    """
    try:
        return importlib.import_module(package)
    except ImportError:
        extra = _EXTRA.get(package)
        fix = f"pip install 'torchfit[{extra}]'" if extra else f"pip install {package}"
        raise ImportError(f"{feature} needs {package}: {fix}") from None
