"""Optional dependencies, loaded lazily (``import torchfit`` needs only torch and numpy)."""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import logging
from collections.abc import Iterator
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
        with _quiet_import_logs():
            return importlib.import_module(package)
    except ImportError:
        extra = _EXTRA.get(package)
        fix = f"pip install 'torchfit[{extra}]'" if extra else f"pip install {package}"
        raise ImportError(f"{feature} needs {package}: {fix}") from None


@contextlib.contextmanager
def _quiet_import_logs() -> Iterator[None]:
    """Hold back the warnings optional packages log while they import.

    bitsandbytes 0.50 logs "Failed to load CPU gemm_4bit_forward from kernels-community"
    when it is imported on an AVX-512-BF16 CPU without the ``kernels`` package's trusted
    repository (``bitsandbytes/backends/cpu/ops.py``); peft imports it. torchfit imports
    these packages for itself (to build adapters on the meta device), and a CPU kernel it
    never runs is not the user's concern. Errors still show.
    """
    logger = logging.getLogger("bitsandbytes")
    level = logger.level
    logger.setLevel(max(level, logging.ERROR))
    try:
        yield
    finally:
        logger.setLevel(level)
