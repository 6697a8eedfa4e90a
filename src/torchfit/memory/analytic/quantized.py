"""Weight bytes of a transformer whose block Linear layers are stored in 8 or 4 bits.

The per-layer layout (packed codes, absmax, nested statistics, code books) is
bitsandbytes', as `torchfit.quantize` models it; here it is applied to the Linear
shapes a `TransformerSpec` implies. Embeddings, norms, biases and the LM head stay in
the compute dtype (transformers keeps ``lm_head`` and tied embeddings unquantized).
"""

from __future__ import annotations

from torchfit._bnb.layout import linear4bit_bytes, linear8bit_bytes
from torchfit._core.units import DType
from torchfit.memory.analytic.arch import Family, TransformerSpec
from torchfit.memory.analytic.moe import moe_linear_shapes

__all__ = ["block_linear_shapes", "quantized_weight_bytes"]


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


def quantized_weight_bytes(
    spec: TransformerSpec,
    weights: DType,
    compute: DType,
    *,
    double_quant: bool = True,
    head: bool = False,
) -> int:
    """Total weight bytes with block Linear weights in ``weights`` (int8 or a 4-bit format).

    ``head``: the output head is quantized too (it is kept in 16 bits by default:
    transformers' ``get_keys_to_not_convert`` skips it unless ``llm_int8_skip_modules``
    is set without it).

    Example:
        >>> from transformers import LlamaConfig
        >>> from torchfit.memory.analytic.arch import describe
        >>> spec = describe(LlamaConfig())  # Llama-2-7B shapes
        >>> round(quantized_weight_bytes(spec, DType.NF4, DType.BF16) / 2**30, 2)
        3.6
    """
    shapes = block_linear_shapes(spec)
    if head:
        if spec.tied_embeddings:
            raise ValueError(
                "quantize_head=True, but this model's output head is its input embedding "
                "(tied), which bitsandbytes does not quantize; drop quantize_head"
            )
        shapes = [*shapes, (spec.vocab, spec.hidden)]  # a Linear4bit/8bitLt head
    quantized = 0
    for out_features, in_features in shapes:
        if weights is DType.INT8:
            codes, scales = linear8bit_bytes(out_features, in_features)
        else:
            codes, scales = linear4bit_bytes(out_features * in_features, double_quant=double_quant)
        quantized += codes + scales
    rest = spec.num_params - sum(o * i for o, i in shapes)
    return quantized + int(rest * compute.itemsize)
