"""The older spellings of a step (``dtype=``, ``mixed_precision=``, a ``BitsAndBytesConfig``).

`estimate` and `fits` take them as keywords; `read_spellings` turns them into `Step`'s
fields (``precision`` in Lightning's names, ``quantization``), refusing two spellings
that contradict each other.
"""

from __future__ import annotations

from typing import Any

from torchfit._core.step import Mode, parse_mode, resolve_numerics
from torchfit._core.units import DType, parse_dtype
from torchfit.memory.knobs import quantization_of, with_compute

__all__ = ["AUTO", "PREFIX", "read_spellings"]

#: ``precision="auto"``: the card's 16-bit precision, chosen where a card is known (`fits`).
AUTO = "auto"

#: Precision names by compute dtype (Lightning's): the prefix before ``-mixed``/``-true``.
PREFIX = {DType.FP32: "32", DType.FP16: "16", DType.BF16: "bf16"}


def read_spellings(keywords: dict[str, Any], names: frozenset[str]) -> dict[str, Any]:
    """`Step`'s fields (``names``) from `estimate`'s keywords, older spellings read.

    ``dtype``, ``mixed_precision`` and a ``BitsAndBytesConfig`` in ``quantization``
    become ``precision`` and ``quantization``.

    A float ``dtype`` without ``precision`` is the compute dtype: 16-bit training runs
    under autocast with fp32 master weights (``"bf16-mixed"``) unless
    ``mixed_precision=False``; inference holds the model in it (``"bf16-true"``).

    Raises:
        TypeError: an unknown keyword.
        ValueError: spellings that contradict each other (`resolve_numerics`).

    Example:
        >>> from torchfit.memory.step import FIELD_NAMES as NAMES
        >>> read_spellings({"dtype": "fp16", "batch_size": 2}, NAMES)["precision"]
        '16-mixed'
        >>> read_spellings({"dtype": "nf4", "mode": "inference"}, NAMES)["quantization"]
        'nf4'
    """
    unknown = sorted(set(keywords) - names - {"dtype", "mixed_precision"})
    if unknown:
        raise TypeError(
            f"unknown step keyword {unknown[0]!r}; expected a field of torchfit.Step "
            f"({', '.join(sorted(names))}), dtype or mixed_precision"
        )
    fields = dict(keywords)
    dtype = fields.pop("dtype", None)
    mixed = fields.pop("mixed_precision", None)
    quantization = fields.pop("quantization", None)
    precision = fields.get("precision")
    if isinstance(quantization, (str, DType)):
        if dtype is not None:
            raise ValueError(
                f"quantization={quantization!r} and dtype={dtype!r} both name the weights; "
                "pass quantization= alone (precision= names the compute)"
            )
        dtype, quantization = quantization, None
    dtype, double_quant, head, bnb_compute = quantization_of(
        quantization,
        dtype=dtype,
        double_quant=fields.get("double_quant"),
        quantize_head=fields.get("quantize_head", False),
    )
    fields["double_quant"], fields["quantize_head"] = double_quant, head
    if precision == AUTO:  # the card decides; dtype may only name a quantized base
        fmt = None if dtype is None or str(dtype) == AUTO else parse_dtype(dtype)
        if fmt is not None and not fmt.is_quantized:
            raise ValueError(
                f"precision='auto' picks the card's 16-bit precision, and dtype={fmt.value!r} "
                "would name another; pass precision= a name ('bf16-mixed') or leave dtype out"
            )
        fields["quantization"] = None if fmt is None else fmt.value
        return fields
    training = parse_mode(fields.get("mode", "train")) is Mode.TRAIN
    if bnb_compute is DType.FP32 and precision is None and not training and mixed is None:
        # inference on a config that leaves bnb_4bit_compute_dtype at fp32: transformers
        # loads the other modules in the checkpoint's dtype, and only the 4-bit layers
        # compute in fp32 (Linear4bit casts the input to it, the output back)
        fields.setdefault("bnb_compute_dtype", bnb_compute.value)
        bnb_compute = None
    numerics = resolve_numerics(precision=precision, dtype=dtype, mixed_precision=mixed)
    numerics = with_compute(numerics, bnb_compute, precision=precision)
    quantized = numerics.weights.is_quantized
    fields["quantization"] = numerics.weights.value if quantized else None
    if precision is None:
        autocast = numerics.mixed
        if autocast is None:
            autocast = training and numerics.compute.bits == 16
        if numerics.compute not in PREFIX:
            raise ValueError(
                f"dtype={numerics.compute.value!r} has no precision of its own; expected fp32, "
                "bf16 or fp16 (precision='32-true', 'bf16-mixed', 'bf16-true', ...)"
            )
        fields["precision"] = f"{PREFIX[numerics.compute]}-{'mixed' if autocast else 'true'}"
    return fields
