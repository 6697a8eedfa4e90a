"""The transformers side of `torchfit.quantize`: configs, model classes, dtypes, hub errors.

Everything that imports transformers does it inside a function, so that ``import
torchfit.quantize`` stays light.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import os
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from torchfit._core import hardware
from torchfit._core.imports import require
from torchfit._core.units import DType, parse_dtype

__all__ = [
    "build_meta",
    "hub_error",
    "load_config",
    "load_dtype",
    "model_class_for",
    "resolve_compute_dtype",
    "resolve_config",
    "target_device",
]

#: from_pretrained options that also apply to reading the config.
_HUB_KWARGS = (
    "cache_dir",
    "force_download",
    "local_files_only",
    "revision",
    "subfolder",
    "token",
    "trust_remote_code",
)


def _looks_like_path(name: str) -> bool:
    return Path(name).is_absolute() or name.startswith((".", "~")) or name.count("/") > 1


def hub_error(name: str, error: BaseException) -> OSError:
    """The error for a model id that could not be read: the hub failed, pass a local path."""
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return OSError(
        f"loading {name!r} from the Hugging Face Hub failed ({reason}). There is no local "
        f"folder called {name!r}; pass the path of a model saved with save_pretrained() "
        "(a folder with config.json and the weights), or check the network and the model id"
    )


def load_config(name: str, kwargs: dict[str, Any]) -> Any:
    """Read the config of a local folder or hub id, with the hub error `hub_error` gives."""
    transformers = require("transformers", feature="torchfit.quantize")
    if kwargs.get("config") is not None:
        return kwargs["config"]
    if not Path(name).is_dir() and _looks_like_path(name):
        raise FileNotFoundError(
            f"no model folder at {name!r}; pass the folder where save_pretrained() wrote "
            "config.json and the weights"
        )
    hub = {k: kwargs[k] for k in _HUB_KWARGS if k in kwargs}
    try:
        return transformers.AutoConfig.from_pretrained(name, **hub)
    except (OSError, ValueError) as e:
        if Path(name).is_dir():
            raise
        raise hub_error(name, e) from e


def resolve_config(source: Any) -> Any:
    """A transformers config from a config, a local folder, a catalog name or a hub id."""
    transformers = require("transformers", feature="torchfit.quantize")
    if isinstance(source, transformers.PretrainedConfig):
        return copy.deepcopy(source)  # building a model may write to its config
    if not isinstance(source, str | os.PathLike):
        raise TypeError(
            "expected a transformers config, a model name or a local folder; got "
            f"{type(source).__name__}"
        )
    name = os.fspath(source)
    if not Path(name).is_dir() and not _looks_like_path(name):
        try:
            from torchfit.memory.catalog import model_config  # noqa: PLC0415 - loads transformers
        except ImportError:  # pragma: no cover - the catalog ships with torchfit
            pass
        else:
            try:
                return model_config(name)  # offline: catalog names and their hub ids
            except ValueError:
                if name.count("/") != 1:  # not a hub id either: the catalog's error says why
                    raise
    return load_config(name, {})


def model_class_for(config: Any, model_class: Any = None) -> Any:
    """The class to load: ``model_class``, the config's architecture, or a causal LM."""
    if model_class is not None:
        return model_class
    transformers = require("transformers", feature="torchfit.quantize")
    for name in getattr(config, "architectures", None) or ():
        cls = getattr(transformers, name, None)
        if cls is not None:
            return cls
    return transformers.AutoModelForCausalLM


def _as_torch_dtype(value: Any) -> torch.dtype | None:
    if value is None or value == "auto":
        return None
    if isinstance(value, torch.dtype):
        return value
    return parse_dtype(str(value)).torch_dtype


def load_dtype(config: Any, kwargs: dict[str, Any]) -> torch.dtype:
    """The dtype from_pretrained gives unquantized modules.

    ``dtype=`` if passed, else the config's (transformers 5 defaults to ``dtype="auto"``),
    else torch's default (fp32).
    """
    given = kwargs.get("dtype", kwargs.get("torch_dtype"))
    return (
        _as_torch_dtype(given)
        or _as_torch_dtype(getattr(config, "dtype", None))
        or torch.get_default_dtype()
    )


def build_meta(config: Any, model_class: Any, dtype: torch.dtype) -> nn.Module:
    """The model on the meta device: real module names and shapes, no memory, instant.

    Weight initialisation is switched off (transformers' own ``no_init_weights``, as
    ``from_pretrained`` does): on meta tensors it computes nothing, yet the init calls
    were 60% of the build (87M-parameter Llama: 5.6 ms with them, 2.2 ms without). The
    skipped ``init_weights`` also ties the embeddings, so that is done here.
    """
    config = copy.deepcopy(config)
    with _no_init_weights(), torch.device("meta"):
        if hasattr(model_class, "_from_config"):
            model: nn.Module = model_class._from_config(config, dtype=dtype)  # noqa: SLF001 - transformers' own path from a config
        else:
            model = model_class.from_config(config, dtype=dtype)
    tie = getattr(model, "tie_weights", None)
    if callable(tie):  # init_weights ties them, and it was skipped
        tie()
    return model


def _no_init_weights() -> contextlib.AbstractContextManager[object]:
    """Transformers' weight-init switch-off (5.x: ``initialization``, 4.x: ``modeling_utils``)."""
    for module in ("transformers.initialization", "transformers.modeling_utils"):
        try:
            context = getattr(importlib.import_module(module), "no_init_weights", None)
        except ImportError:
            continue
        if context is not None:
            return cast("contextlib.AbstractContextManager[object]", context())
    return contextlib.nullcontext()


def target_device(device_map: Any) -> str:
    """``"cuda"`` or ``"cpu"``: where a from_pretrained ``device_map`` puts the weights.

    Not `torchfit._core.hardware.parse_device`: a device map is a placement (a dict of
    module names, an index, or a strategy such as ``"auto"``), not one device. ``None``
    and the strategies mean the default device, as transformers' bitsandbytes
    quantizers pick it.
    """
    if device_map is None:
        return hardware.default_device().type
    values = device_map.values() if isinstance(device_map, dict) else [device_map]
    for value in values:
        text = str(value)
        if isinstance(value, int) or text.startswith("cuda"):
            return "cuda"
        if text in {"auto", "balanced", "balanced_low_0", "sequential"}:
            return hardware.default_device().type
    return "cpu"


def resolve_compute_dtype(
    value: Any, *, bits: int, model_dtype: torch.dtype, device: str
) -> torch.dtype | None:
    """The 4-bit compute dtype for ``compute_dtype="auto"`` or a given one (None for 8-bit).

    "auto": the model's own dtype when it is fp16/bf16; for an fp32 model, bf16 on a GPU
    with native bf16 (compute capability >= 8.0), else fp16 on CUDA, and fp32 on CPU
    (exact, and bf16 matmuls are emulated on CPUs without AVX512-BF16).
    """
    if bits == 8:
        if value != "auto":
            raise ValueError(
                f"compute_dtype={value!r} applies to 4-bit layers only; LLM.int8 (bits=8) "
                "computes in fp16 by design. Leave compute_dtype='auto' or use bits=4"
            )
        return None
    if value != "auto":
        dtype = value if isinstance(value, DType) else parse_dtype(value)
        if dtype not in (DType.FP32, DType.FP16, DType.BF16):
            raise ValueError(
                f"compute_dtype={value!r} is not a compute type; use 'bf16', 'fp16', 'fp32' "
                "or 'auto'"
            )
        return dtype.torch_dtype
    if model_dtype in (torch.float16, torch.bfloat16):
        return model_dtype
    if device == "cuda":
        return torch.bfloat16 if hardware.cuda_native_bf16() else torch.float16
    return torch.float32


def saved_quantization(config: Any) -> tuple[int, str, bool, list[str]] | None:
    """``(bits, quant_type, double_quant, skip list)`` of a checkpoint saved quantized.

    ``None`` when the config carries no bitsandbytes ``quantization_config``.
    """
    saved = getattr(config, "quantization_config", None)
    if saved is None:
        return None
    data = saved if isinstance(saved, dict) else saved.to_dict()
    if str(data.get("quant_method", "")) != "bitsandbytes":
        raise ValueError(
            f"this checkpoint is quantized with {data.get('quant_method')!r}, not bitsandbytes; "
            "load it with transformers directly"
        )
    bits = 8 if data.get("load_in_8bit") else 4
    return (
        bits,
        str(data.get("bnb_4bit_quant_type", "fp4")),
        bool(data.get("bnb_4bit_use_double_quant", False)),
        list(data.get("llm_int8_skip_modules") or []),
    )
