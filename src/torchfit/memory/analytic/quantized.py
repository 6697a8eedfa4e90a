"""Weight bytes of a transformer whose block Linear layers are stored in 8 or 4 bits.

The per-layer layout (packed codes, absmax, nested statistics, code books) is
bitsandbytes', as `torchfit.quantize` models it; here it is applied to the Linear
shapes a `TransformerSpec` implies. Embeddings, norms, biases and the LM head stay in
the compute dtype (transformers keeps ``lm_head`` and tied embeddings unquantized).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torchfit._bnb.layout import int8_load_copies_transposed, linear4bit_bytes, linear8bit_bytes
from torchfit._bnb.matmul import dequantized_bytes_per_weight, quantized_from
from torchfit._core.units import DType
from torchfit.memory.analytic.arch import Family, TransformerSpec
from torchfit.memory.analytic.moe import moe_linear_shapes
from torchfit.memory.result import MemoryEstimate

__all__ = [
    "block_linear_shapes",
    "check_quantize_head",
    "dequantized_bytes",
    "dequantized_transient",
    "bitsandbytes_transients",
    "layer_copies",
    "linear_bytes",
    "quantize_on_load_bytes",
    "quantized_shapes",
    "quantized_weight_bytes",
    "with_loading",
]

#: A Linear's ``(out_features, in_features)``.
Shape = tuple[int, int]


def block_linear_shapes(spec: TransformerSpec) -> list[tuple[int, int]]:
    """``(out_features, in_features)`` of every quantizable Linear, all blocks included."""
    if spec.moe is not None:  # MoE hook: the experts are 3D parameters, not nn.Linear
        return moe_linear_shapes(spec)
    h, i = spec.hidden, spec.intermediate
    q_out = spec.num_heads * spec.head_dim
    if spec.family is Family.GPT2:
        block = [(3 * h, h), (h, h), (i, h), (h, i)]
    elif spec.family is Family.LLAMA:
        block = [(q_out, h), (spec.kv_dim, h), (spec.kv_dim, h), (h, q_out)]
        block += [(i, h), (i, h), (h, i)]
    else:
        block = [(h, h)] * 4 + [(i, h), (h, i)]
    shapes = block * spec.num_layers
    if spec.family is Family.BERT:
        shapes.append((h, h))  # the MLM head's transform dense
    return shapes


def quantized_shapes(spec: TransformerSpec, *, head: bool = False) -> list[Shape]:
    """The Linear shapes bitsandbytes holds: every block Linear, and the head with ``head``."""
    shapes = block_linear_shapes(spec)
    return [*shapes, (spec.vocab, spec.hidden)] if head else shapes  # a Linear4bit/8bitLt head


def quantized_weight_bytes(
    spec: TransformerSpec,
    weights: DType,
    compute: DType,
    *,
    double_quant: bool = True,
    head: bool = False,
    rest: DType | None = None,
) -> int:
    """Total weight bytes with block Linear weights in ``weights`` (int8 or a 4-bit format).

    ``head``: the output head is quantized too (it is kept in 16 bits by default:
    transformers' ``get_keys_to_not_convert`` skips it unless ``llm_int8_skip_modules``
    is set without it). ``rest``: the dtype of every other parameter (default
    ``compute``; fp32 after PEFT's ``prepare_model_for_kbit_training``).

    Example:
        >>> from transformers import LlamaConfig
        >>> from torchfit.memory.analytic.arch import spec_from_config
        >>> spec = spec_from_config(LlamaConfig())  # Llama-2-7B shapes
        >>> round(quantized_weight_bytes(spec, DType.NF4, DType.BF16) / 2**30, 2)
        3.6
    """
    check_quantize_head(weights, head=head, tied=spec.tied_embeddings)
    shapes = quantized_shapes(spec, head=head)
    others = spec.num_params - sum(o * i for o, i in shapes)
    itemsize = (compute if rest is None else rest).itemsize
    return linear_bytes(shapes, weights, double_quant=double_quant) + int(others * itemsize)


def check_quantize_head(weights: DType, *, head: bool, tied: bool) -> None:
    """Refuse ``quantize_head=True`` with unquantized weights or a tied output head.

    Example:
        >>> check_quantize_head(DType.NF4, head=True, tied=False)  # a separate head: fine
        >>> check_quantize_head(DType.BF16, head=True, tied=False)
        Traceback (most recent call last):
        ...
        ValueError: quantize_head=True needs quantized weights (dtype='nf4' or 'int8'); ...
    """
    if not head:
        return
    if not weights.is_quantized:
        raise ValueError(
            f"quantize_head=True needs quantized weights (dtype='nf4' or 'int8'); "
            f"got dtype={weights.value!r}"
        )
    if tied:
        raise ValueError(
            "quantize_head=True, but this model's output head is its input embedding "
            "(tied), which bitsandbytes does not quantize; drop quantize_head"
        )


def linear_bytes(shapes: Iterable[Shape], weights: DType, *, double_quant: bool = True) -> int:
    """Bytes of Linear weights of ``shapes`` in bitsandbytes' ``weights`` format, scales included.

    LLM.int8 (`linear8bit_bytes`) for ``int8``, else 4-bit (`linear4bit_bytes`: NF4 and
    FP4 have the same layout), with or without double quantization.

    Example:
        >>> linear_bytes([(64, 64)], DType.NF4, double_quant=False), 64 * 64 // 2 + 64 * 4 + 64
        (2368, 2368)
        >>> linear_bytes([(64, 64), (128, 64)], DType.INT8), (64 + 128) * (64 + 4)
        (13056, 13056)
    """
    total = 0
    for out_features, in_features in shapes:
        if weights is DType.INT8:
            codes, scales = linear8bit_bytes(out_features, in_features)
        else:
            codes, scales = linear4bit_bytes(out_features * in_features, double_quant=double_quant)
        total += codes + scales
    return total


def dequantized_bytes(
    shapes: Iterable[Shape],
    compute: DType,
    *,
    source: DType | None = None,
    rows: int | None = None,
    version: str | None = None,
) -> int:
    """Bytes the largest of ``shapes`` holds dequantized for one matmul.

    ``MatMul4Bit`` (bitsandbytes/autograd/_functions.py) computes ``matmul(grad_output,
    dequantize_4bit(B).to(grad_output.dtype))`` in backward (and, before 0.50, the same
    in forward): a full copy of one weight, alive during its matmul. ``source``: the dtype
    it was quantized from (default ``compute``); ``rows``: the forward's tokens, ``None``
    for backward; per weight as `dequantized_bytes_per_weight` (`torchfit._bnb.matmul`).

    Example:
        >>> dequantized_bytes([(64, 64), (256, 64)], DType.BF16)
        32768
        >>> dequantized_bytes([(256, 64)], DType.BF16, source=DType.FP16), 256 * 64 * (2 + 2)
        (65536, 65536)
    """
    per_weight = dequantized_bytes_per_weight(
        source=compute if source is None else source, compute=compute, rows=rows, version=version
    )
    largest = max((out_f * in_f for out_f, in_f in shapes), default=0)
    return largest * per_weight


def dequantized_transient(
    shapes: Iterable[Shape],
    compute: DType,
    *,
    base: DType | None,
    rows: int | None,
    version: str | None,
    notes: list[str],
) -> int:
    """`dequantized_bytes` of a 4-bit model loaded in ``base`` (default: ``compute``), noted.

    ``rows``: tokens of the forward at the peak, ``None`` for a training step.
    """
    source = quantized_from(compute if base is None else base, version)
    copy = dequantized_bytes(shapes, compute, source=source, rows=rows, version=version)
    if copy:
        per_weight = dequantized_bytes_per_weight(
            source=source, compute=compute, rows=rows, version=version
        )
        if per_weight > compute.itemsize:  # two copies alive
            via = f" (to {source.value}, then a {compute.value} copy)"
        elif source is not compute:  # straight into the compute dtype
            via = f" (into {compute.value})"
        else:
            via = ""
        notes.append(
            f"bitsandbytes dequantizes one 4-bit weight at a time for its matmul{via}: "
            f"{copy:,} bytes at most"
        )
    return copy


def quantize_on_load_bytes(
    shapes: Iterable[Shape], weights: DType, *, bitsandbytes_version: str | None = None
) -> int:
    """What quantizing the largest of ``shapes`` on the GPU holds beside the loaded weights.

    Loading quantizes each weight on the GPU as it arrives: ``Params4bit._quantize`` copies
    the 16-bit weight to the device, then ``quantize_4bit``; ``Int8Params`` makes a float16
    copy there, then ``int8_vectorwise_quant`` (bitsandbytes 0.45 and later) or, before,
    ``double_quant``, which also makes a transposed int8 copy (bitsandbytes/nn/modules.py).
    So 2 bytes per weight of the largest quantized Linear, 3 for int8 before 0.45, beside
    the weights already loaded; for a short prompt or one token this can be the run's peak.

    Example:
        >>> quantize_on_load_bytes([(64, 64), (256, 64)], DType.INT8, bitsandbytes_version="0.41.1")
        49152
    """
    largest = max((out_f * in_f for out_f, in_f in shapes), default=0)
    per_weight = 2
    if weights is DType.INT8 and int8_load_copies_transposed(bitsandbytes_version):
        per_weight += 1
    return largest * per_weight if weights.is_quantized else 0


def with_loading(found: MemoryEstimate, transient: int) -> MemoryEstimate:
    """``found``, or the loading moment (weights and `quantize_on_load_bytes`) if higher."""
    if not transient or found.weights + transient <= found.total:
        return found
    note = (
        "peak while loading: bitsandbytes quantizes each weight on the GPU, and the largest "
        f"one's copies ({transient:,} bytes) outweigh the run itself"
    )
    return found.replace(
        activations=0,
        kv_cache=0,
        gradients=0,
        optimizer=0,
        overhead=0,
        workspace=transient,
        notes=(*found.notes, note),
        peak_at="loading",
    )


def bitsandbytes_transients(
    shapes: Iterable[Shape],
    weights: DType,
    compute: DType,
    *,
    base: DType | None,
    version: str | None,
    rows: int | None,
    decode_rows: int | None,
    notes: list[str],
    matmul: DType | None = None,
) -> tuple[int, int, int]:
    """What bitsandbytes holds beside a quantized model's weights on CUDA, in bytes.

    ``shapes``: the quantized Linears (`quantized_shapes` of a spec, or the meta pass's).
    ``(loading, dequantized, decoding)``: `quantize_on_load_bytes`, then for 4 bits the
    `dequantized_transient` of a forward over ``rows`` tokens (``None``: a training step)
    and of a decoding step over ``decode_rows`` (``None``: no generation). ``matmul``: the
    4-bit layers' own compute dtype where it is not ``compute`` (`layer_copies`).
    """
    if not weights.is_quantized:
        return 0, 0, 0
    shapes = list(shapes)
    loading = quantize_on_load_bytes(shapes, weights, bitsandbytes_version=version)
    if weights.bits != 4:
        return loading, 0, 0
    own = None if matmul is compute else matmul
    if own is not None:
        # the weights were quantized from the dtype the model was loaded in (``compute``)
        base, compute = base or compute, own
    common: dict[str, Any] = {"base": base, "version": version}
    dequantized = dequantized_transient(shapes, compute, rows=rows, notes=notes, **common)
    decoding = 0
    if decode_rows is not None:
        decoding = dequantized_transient(shapes, compute, rows=decode_rows, notes=[], **common)
    if own is not None and rows is not None:
        dequantized += layer_copies(shapes, own, rows=rows, notes=notes)
        if decode_rows is not None:
            decoding += layer_copies(shapes, own, rows=decode_rows, notes=[])
    return loading, dequantized, decoding


def layer_copies(shapes: Iterable[Shape], matmul: DType, *, rows: int, notes: list[str]) -> int:
    """A 4-bit layer computing in ``matmul`` on a model held in another dtype, in bytes.

    ``Linear4bit.forward`` casts its input to ``bnb_4bit_compute_dtype`` and its output
    back (bitsandbytes/nn/modules.py): during its matmul the input's copy and the output
    in ``matmul`` are alive, ``rows`` rows of each, for the widest layer.

    Example:
        >>> layer_copies([(64, 32), (256, 64)], DType.FP32, rows=10, notes=[])
        12800
    """
    widest = max((out_f + in_f for out_f, in_f in shapes), default=0)
    copies = rows * widest * int(matmul.itemsize)
    if copies:
        notes.append(
            f"bitsandbytes' 4-bit layers compute in {matmul.value} (bnb_4bit_compute_dtype): "
            f"each casts its input to it and its output back, {copies:,} bytes at most"
        )
    return copies
