"""The transformers side of `torchfit.quantize`: device maps, compute dtypes, saved settings.

Configs, model classes and the meta-device build come from `torchfit.memory.catalog`
(`resolve_config`, `torchfit.memory.catalog.hub`, `torchfit.memory.catalog.build`),
which `torchfit.memory` shares. Nothing here imports transformers.
"""

from __future__ import annotations

from typing import Any

import torch

from torchfit._core import hardware
from torchfit._core.units import DType, parse_dtype

__all__ = ["parse_compute_dtype", "resolve_compute_dtype", "saved_quantization", "target_device"]


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


def parse_compute_dtype(value: Any) -> torch.dtype | None:
    """``"auto"`` (None: decided later) or a float compute dtype (fp32, fp16, bf16).

    Example:
        >>> parse_compute_dtype("bf16"), parse_compute_dtype("auto")
        (torch.bfloat16, None)
    """
    if isinstance(value, str) and value == "auto":
        return None
    dtype = value if isinstance(value, DType) else parse_dtype(value)
    if dtype not in (DType.FP32, DType.FP16, DType.BF16):
        raise ValueError(
            f"compute_dtype={value!r} is not a compute type; use 'bf16', 'fp16', 'fp32' or 'auto'"
        )
    return dtype.torch_dtype


def resolve_compute_dtype(
    value: Any, *, bits: int, model_dtype: torch.dtype, device: str
) -> torch.dtype | None:
    """The 4-bit compute dtype for ``compute_dtype="auto"`` or a given one (None for 8-bit).

    "auto": the model's own dtype when it is fp16/bf16; for an fp32 model, bf16 on a GPU
    with native bf16 (`torchfit._core.hardware.cuda_native_bf16`: compute capability
    >= 8.0, not emulated), else fp16 on CUDA, and fp32 on CPU (exact, and bf16 matmuls
    are emulated on CPUs without AVX512-BF16).
    """
    if bits == 8:
        if value != "auto":
            raise ValueError(
                f"compute_dtype={value!r} applies to 4-bit layers only; LLM.int8 (bits=8) "
                "computes in fp16 by design. Leave compute_dtype='auto' or use bits=4"
            )
        return None
    if value != "auto":
        return parse_compute_dtype(value)
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
