"""Configs that are not in the catalog: a model folder or a Hugging Face Hub id.

What ``from_pretrained`` reads before the weights: the config (`load_config`, with the
options that apply to it), and the dtype it gives unquantized modules (`load_dtype`).
A Hub id needs the network or the Hugging Face cache; when it fails, `hub_error` says
to pass a local folder instead. `torchfit.memory.catalog.resolve_config` reaches here
only for a Hub id the catalog lacks, and only when asked to (``hub=True``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from torchfit.memory.catalog.build import model_dtype
from torchfit.memory.catalog.entries import _transformers

__all__ = ["HUB_KWARGS", "hub_error", "is_hub_id", "load_config", "load_dtype", "looks_like_path"]

#: from_pretrained options that also apply to reading the config.
HUB_KWARGS = (
    "cache_dir",
    "force_download",
    "local_files_only",
    "revision",
    "subfolder",
    "token",
    "trust_remote_code",
)


def looks_like_path(text: str) -> bool:
    """Whether a name can only be a file or folder (never a catalog name or Hub id).

    Example:
        >>> looks_like_path("./llama"), looks_like_path("a/b/c"), looks_like_path("org/model")
        (True, True, False)
    """
    return (
        text.startswith(("/", ".", "~"))
        or text.endswith(".json")
        or text.count("/") > 1
        or Path(text).is_absolute()
    )


def is_hub_id(text: str) -> bool:
    """Whether a name has the form of a Hub model id, ``"org/name"``.

    Example:
        >>> is_hub_id("meta-llama/Llama-3.1-8B"), is_hub_id("gpt2"), is_hub_id("./a/b")
        (True, False, False)
    """
    return text.count("/") == 1 and not looks_like_path(text)


def hub_error(name: str, error: BaseException) -> OSError:
    """The error for a model id that could not be read: the hub failed, pass a local path."""
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return OSError(
        f"loading {name!r} from the Hugging Face Hub failed ({reason}). There is no local "
        f"folder called {name!r}; pass the path of a model saved with save_pretrained() "
        "(a folder with config.json and the weights), or check the network and the model id"
    )


def load_config(name: str, kwargs: dict[str, Any]) -> Any:
    """The config of a local folder or Hub id, read with ``from_pretrained``'s options.

    ``kwargs`` are the ``from_pretrained`` keyword arguments: a ``config`` there is
    returned as is, and the `HUB_KWARGS` among them apply.

    Raises:
        FileNotFoundError: ``name`` can only be a path, and there is no folder there.
        OSError: the Hub (or the cache) could not give the config (`hub_error`).
    """
    transformers = _transformers()
    if kwargs.get("config") is not None:
        return kwargs["config"]
    if not Path(name).is_dir() and looks_like_path(name):
        raise FileNotFoundError(
            f"no model folder at {name!r}; pass the folder where save_pretrained() wrote "
            "config.json and the weights"
        )
    hub = {k: kwargs[k] for k in HUB_KWARGS if k in kwargs}
    try:
        return transformers.AutoConfig.from_pretrained(name, **hub)
    except (OSError, ValueError) as e:
        if Path(name).is_dir():
            raise
        raise hub_error(name, e) from e


def load_dtype(config: Any, kwargs: dict[str, Any]) -> torch.dtype:
    """The dtype ``from_pretrained`` gives unquantized modules.

    ``dtype=`` (or 4.x's ``torch_dtype=``) if passed and not ``"auto"``, else the
    config's (transformers 5 defaults to ``dtype="auto"``), else torch's default (fp32):
    `torchfit.memory.catalog.build.model_dtype`.
    """
    return model_dtype(config, kwargs.get("dtype", kwargs.get("torch_dtype")))
