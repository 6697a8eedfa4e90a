"""A ``transformers.BitsAndBytesConfig`` read into what the estimators need.

Read by its attributes (or the same keys of a dict, as ``config.json``'s
``quantization_config`` holds them), so neither transformers nor bitsandbytes is imported.
The fields and their defaults are transformers' (``BitsAndBytesConfig.__init__`` in
transformers/utils/quantization_config.py): ``bnb_4bit_quant_type="fp4"``,
``bnb_4bit_use_double_quant=False``, ``bnb_4bit_compute_dtype=torch.float32``,
``llm_int8_skip_modules=None``.

What each field does to memory, and what is read:

- ``load_in_4bit`` / ``load_in_8bit``: the format; ``bnb_4bit_quant_type``: NF4 or FP4
  (the same layout); ``bnb_4bit_use_double_quant``: the nested absmax statistics;
- ``bnb_4bit_compute_dtype``: ``Linear4bit.forward`` casts its input to it, and bitsandbytes
  dequantizes each weight into it for ``F.linear`` (``_dequant_linear_fallback``,
  backends/cuda/ops.py): without autocast the whole step computes in it (fp32 by default);
  under autocast ``F.linear`` inside that call runs in the autocast dtype, so activations
  follow the autocast dtype;
- ``llm_int8_skip_modules``: given, it *replaces* transformers' default skip list (the
  output head, tied weights; ``get_modules_to_not_convert`` in transformers/quantizers/
  base.py), so a list without the head quantizes the head too. Only the head may be
  named here: keeping block Linears unquantized is not modelled (trace the model);
- ``llm_int8_has_fp16_weight=True`` keeps 16-bit int8 master weights: refused;
- not read, knowingly: ``bnb_4bit_quant_storage`` (the packed bytes are the same whatever
  dtype stores them), ``llm_int8_threshold`` (LLM.int8's outlier columns are a transient of
  its matmul, which the estimates do not model), ``llm_int8_enable_fp32_cpu_offload``
  (where modules live, a device map's concern).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from torchfit._core.units import DType, parse_dtype

__all__ = ["HEAD_NAMES", "BnbQuantization", "read_bitsandbytes_config"]

#: Module names transformers' causal-LM, masked-LM and classification heads take.
HEAD_NAMES = frozenset({"lm_head", "embed_out", "output", "head", "score", "classifier"})


@dataclasses.dataclass(frozen=True)
class BnbQuantization:
    """What a ``BitsAndBytesConfig`` loads.

    Attributes:
        weights: ``DType.NF4``, ``DType.FP4`` or ``DType.INT8``.
        double_quant: 4-bit absmax statistics quantized again.
        compute: ``bnb_4bit_compute_dtype`` (4-bit); ``None`` for int8 (LLM.int8 computes
            in fp16 whatever it is given).
        quantize_head: ``llm_int8_skip_modules`` was given without the head, so the head
            is quantized too.
    """

    weights: DType
    double_quant: bool
    compute: DType | None
    quantize_head: bool


def _field(config: Any, name: str, default: Any = None) -> Any:
    if isinstance(config, Mapping):
        return config.get(name, default)
    return getattr(config, name, default)


def read_bitsandbytes_config(config: Any) -> BnbQuantization:
    """A `BnbQuantization` from a ``transformers.BitsAndBytesConfig`` (or its dict).

    Raises:
        TypeError: not a bitsandbytes quantization config.
        ValueError: it loads nothing in 4 or 8 bits, keeps fp16 int8 weights, or skips
            block modules; the message says what to do.

    Example:
        >>> found = read_bitsandbytes_config({"load_in_4bit": True})  # transformers' defaults
        >>> found.weights.value, found.double_quant, found.compute.value, found.quantize_head
        ('fp4', False, 'fp32', False)
        >>> read_bitsandbytes_config({"load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
        ...     "bnb_4bit_use_double_quant": True, "bnb_4bit_compute_dtype": "bfloat16"}).compute
        <DType.BF16: 'bf16'>
    """
    method = _field(config, "quant_method", "bitsandbytes")
    method = str(getattr(method, "value", method))  # transformers' QuantizationMethod enum
    if not isinstance(config, Mapping) and not hasattr(config, "load_in_4bit"):
        raise TypeError(
            f"quantization= takes a transformers.BitsAndBytesConfig (or its dict); got "
            f"{type(config).__name__}"
        )
    if "bitsandbytes" not in method:
        raise TypeError(
            f"quantization= models bitsandbytes' layout; a {method!r} quantization config is "
            "not modelled: pass dtype='int4' for a 4-bit estimate of its weights, or trace the "
            "loaded model"
        )
    four, eight = (
        bool(_field(config, "load_in_4bit")),
        bool(_field(config, "load_in_8bit")),
    )
    if four == eight:
        raise ValueError(
            "quantization= loads nothing in 4 or 8 bits (load_in_4bit and load_in_8bit are "
            "both unset); set one, or pass dtype='bf16' for an unquantized model"
        )
    if eight and _field(config, "llm_int8_has_fp16_weight"):
        raise ValueError(
            "quantization= has llm_int8_has_fp16_weight=True: fp16 weights beside the int8 "
            "ones, to train them, are not modelled; trace the loaded model "
            "(torchfit.memory.trace)"
        )
    quantize_head = _quantizes_head(_field(config, "llm_int8_skip_modules"))
    if eight:
        return BnbQuantization(
            DType.INT8, double_quant=False, compute=None, quantize_head=quantize_head
        )
    kind = str(_field(config, "bnb_4bit_quant_type", "fp4")).lower()
    if kind not in {"fp4", "nf4"}:
        raise ValueError(
            f"quantization= has bnb_4bit_quant_type={kind!r}; bitsandbytes takes 'nf4' or 'fp4'"
        )
    compute = _field(config, "bnb_4bit_compute_dtype")
    return BnbQuantization(
        weights=parse_dtype(kind),
        double_quant=bool(_field(config, "bnb_4bit_use_double_quant")),
        compute=DType.FP32 if compute is None else parse_dtype(str(compute).removeprefix("torch.")),
        quantize_head=quantize_head,
    )


def _quantizes_head(skip: Any) -> bool:
    """Whether ``llm_int8_skip_modules`` quantizes the head: given, and without it."""
    if skip is None:
        return False
    names = [str(name) for name in skip]
    blocks = [name for name in names if name.rpartition(".")[2] not in HEAD_NAMES]
    if blocks:
        raise ValueError(
            f"quantization= has llm_int8_skip_modules={names!r}: {blocks!r} left unquantized "
            "is not modelled by the estimate (only the head may be named); trace the loaded "
            "model with torchfit.memory.trace, or leave those modules out"
        )
    return not names
