"""Vision models by the names their libraries give them: ``torchvision/...``, ``timm/...``.

``"torchvision/resnet50"`` is ``torchvision.models.get_model("resnet50")`` and
``"timm/convnext_tiny"`` is ``timm.create_model("convnext_tiny")``, both built on the
meta device without weights (no download, no memory). The image each model expects
comes from the library: timm's ``pretrained_cfg["input_size"]``, torchvision's default
weights' crop size (224 when it records none). The libraries are optional extras:
``pip install 'torchfit[vision]'`` (torchvision) and ``pip install 'torchfit[timm]'``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from torchfit._core.imports import require

__all__ = ["ZOOS", "is_zoo_name", "zoo_model"]

#: The name prefixes this module answers, and the package each needs.
ZOOS = {"torchvision": "torchvision", "timm": "timm"}
_DEFAULT_IMAGE = (3, 224, 224)


def is_zoo_name(name: str) -> bool:
    """Whether ``name`` is ``"torchvision/<model>"`` or ``"timm/<model>"``.

    Example:
        >>> is_zoo_name("timm/convnext_tiny"), is_zoo_name("Torchvision/resnet50")
        (True, True)
        >>> is_zoo_name("facebook/convnext-tiny-224")
        False
    """
    library, _, model = name.strip().partition("/")
    return library.lower() in ZOOS and bool(model) and "/" not in model


def zoo_model(name: str) -> tuple[nn.Module, tuple[int, ...]]:
    """The model ``"library/name"`` on the meta device, and the image it expects.

    Raises:
        ImportError: the library is not installed (the message names the extra).
        ValueError: the library has no model of that name (close names are listed).

    Example:
        >>> zoo_model("timm/resnet50")  # doctest: +SKIP
        (ResNet(...), (3, 224, 224))
    """
    library, _, model = name.strip().partition("/")
    return _build(library.lower(), model)


@functools.lru_cache(maxsize=8)
def _build(library: str, model: str) -> tuple[nn.Module, tuple[int, ...]]:
    """Built once per name: `fits` estimates the same model many times."""
    package = require(ZOOS[library], feature=f"the model name '{library}/{model}'")
    names = _names(package, library)
    if model not in names:
        import difflib  # noqa: PLC0415 - only for the error

        close = difflib.get_close_matches(model, names, n=5, cutoff=0.6)
        hint = f"; close names: {', '.join(close)}" if close else ""
        raise ValueError(
            f"{library} has no model {model!r}{hint}. Pass one of the {len(names)} names of "
            f"{library}'s model list, e.g. '{library}/{names[0]}'"
        )
    with torch.device("meta"):
        if library == "timm":
            built = package.create_model(model, pretrained=False)
        else:
            built = package.models.get_model(model, weights=None)
    return built, _image(package, library, model, built)


def _names(package: Any, library: str) -> list[str]:
    if library == "timm":
        return sorted(package.list_models())
    return sorted(package.models.list_models())


def _image(package: Any, library: str, model: str, built: nn.Module) -> tuple[int, ...]:
    """The input the library records for the model, else a 224x224 RGB image."""
    if library == "timm":
        size = getattr(built, "pretrained_cfg", {}).get("input_size")
        return tuple(int(s) for s in size) if size else _DEFAULT_IMAGE
    try:
        weights = package.models.get_model_weights(model).DEFAULT
        crop = weights.transforms.keywords.get("crop_size")
    except (ValueError, AttributeError, KeyError):
        return _DEFAULT_IMAGE
    if crop is None:
        return _DEFAULT_IMAGE
    side = int(crop[0] if isinstance(crop, list | tuple) else crop)
    return (3, side, side)
