"""Mixture-of-experts blocks (Mixtral, Qwen2-MoE, Qwen3-MoE): what they keep, term by term.

Every expert is resident: its weights, gradients and optimizer state count in full
(`TransformerSpec.num_params`, `torchfit.memory.analytic.arch`). Activations follow the
tokens: each token goes to ``top_k`` experts, so the experts' tensors have
``tokens x top_k`` rows, whatever the number of experts. The router adds its fp32
probabilities over all experts and the top-k indices.

The terms are those of transformers 5's experts (``grouped_mm`` and its fallback op:
the same allocations) as a meta-device pass records them (``saved_tensors_hooks``,
torch 2.13): per routed row, the gathered input, the gate/up output (both halves), the
activation and the product, the expert output, and a routing weight; three int64
permutations. The attention part of the block is Llama's (`block_terms`).
"""

from __future__ import annotations

import dataclasses
import math

from torchfit.memory.analytic.arch import MoESpec, TransformerSpec
from torchfit.memory.analytic.blocks import block_terms, inference_transient
from torchfit.memory.analytic.formulas import FP32, INT64
from torchfit.memory.analytic.settings import BlockSettings
from torchfit.memory.analytic.term import Term

__all__ = [
    "DENSE_MLP_TERMS",
    "largest_expert_tensor",
    "moe_backward_width",
    "moe_block_terms",
    "moe_inference_transient",
    "moe_linear_shapes",
    "moe_terms",
]

#: The dense MLP's terms in a Llama block, which a MoE layer replaces.
DENSE_MLP_TERMS = (
    "gate/up input",
    "SwiGLU: gate, act(gate), up",
    "down_proj input (the product)",
)


def _experts(spec: TransformerSpec) -> MoESpec:
    if spec.moe is None:
        raise ValueError(f"model_type {spec.model_type!r} has no experts (spec.moe is None)")
    return spec.moe


def moe_terms(spec: TransformerSpec, s: BlockSettings) -> list[Term]:
    """Saved tensors of one MoE layer's MLP part, per token, for training.

    Example:
        >>> from transformers import MixtralConfig
        >>> from torchfit._core.units import DType
        >>> from torchfit.memory.analytic.arch import spec_from_config
        >>> from torchfit.memory.analytic.formulas import parse_attention
        >>> spec = spec_from_config(MixtralConfig(hidden_size=64, intermediate_size=96))
        >>> settings = BlockSettings(DType.FP32, parse_attention("sdpa"), "cpu")
        >>> sum(t.per_token for t in moe_terms(spec, settings))  # measured: 316 + 1536 + 2616
        4468.0
    """
    moe = _experts(spec)
    e, h, i, k = s.dtype.itemsize, spec.hidden, moe.expert_intermediate, moe.top_k
    terms = [
        Term("router and experts input", h * e),
        Term(
            "router: fp32 probabilities, top-k indices",
            moe.num_experts * FP32 + k * INT64 + ((k + 1) * FP32 if moe.normalized else 0),
        ),
        Term("routed rows: input, gate/up, activation, product, output", k * (2 * h + 4 * i) * e),
        Term("routing weights and permutations", k * (FP32 + 3 * INT64)),
    ]
    if moe.shared_intermediate:
        shared = moe.shared_intermediate
        terms.append(
            Term("shared expert: SwiGLU, output, sigmoid gate", 4 * shared * e + h * e + e)
        )
    return terms


def moe_block_terms(spec: TransformerSpec, seq_len: int, s: BlockSettings) -> list[Term]:
    """One block of a MoE model, per token: Llama's attention, then experts.

    With dense layers among the sparse ones (Qwen's ``mlp_only_layers``), each part is
    weighted by its share of the layers, so ``num_layers`` blocks sum right.
    """
    moe = _experts(spec)
    dense_spec = dataclasses.replace(spec, intermediate=moe.dense_intermediate, moe=None)
    dense = block_terms(dense_spec, seq_len, s)
    attention = [t for t in dense if t.name not in DENSE_MLP_TERMS]
    if len(dense) - len(attention) != len(DENSE_MLP_TERMS):
        raise RuntimeError("block_terms renamed its MLP terms; update DENSE_MLP_TERMS")
    sparse = moe.sparse_layers / spec.num_layers
    mlp = [t for t in dense if t.name in DENSE_MLP_TERMS]
    return [
        *attention,
        *(Term(t.name, t.per_token * sparse) for t in moe_terms(spec, s)),
        *(Term(f"dense layers: {t.name}", t.per_token * (1 - sparse)) for t in mlp if sparse < 1),
    ]


def moe_backward_width(spec: TransformerSpec) -> float:
    """Gradients alive at once in a MoE MLP's backward, in units of elements per token.

    The routed rows' SwiGLU gradients (gate, up, activation: ``3 i`` per row, ``top_k``
    rows per token) and the shared expert's (``3 i_shared``).
    """
    moe = _experts(spec)
    return 3.0 * (moe.top_k * moe.expert_intermediate + moe.shared_intermediate)


def moe_inference_transient(spec: TransformerSpec, seq_len: int, s: BlockSettings) -> float:
    """Largest set of tensors alive at once inside one MoE block at inference, per token.

    The MLP phase holds, per routed row, the gathered input, the gate/up output and the
    activated product (``h + 3 i``), the fp32 router probabilities, and the shared
    expert's ``3 i_shared``; it is passed to `inference_transient` as an equivalent
    SwiGLU width.
    """
    moe = _experts(spec)
    e = s.dtype.itemsize
    width = moe.top_k * (spec.hidden + 3 * moe.expert_intermediate) * e
    width += moe.num_experts * FP32 + 3 * moe.shared_intermediate * e
    equivalent = dataclasses.replace(spec, intermediate=math.ceil(width / (3 * e)), moe=None)
    return inference_transient(equivalent, seq_len, s)


def largest_expert_tensor(spec: TransformerSpec) -> int:
    """Elements of one MoE layer's ``gate_up_proj`` (all experts' gate and up weights)."""
    moe = _experts(spec)
    return moe.num_experts * 2 * moe.expert_intermediate * spec.hidden


def moe_linear_shapes(spec: TransformerSpec) -> list[tuple[int, int]]:
    """``(out, in)`` of every ``nn.Linear`` in the blocks of a MoE model, all layers.

    Attention projections; per sparse layer the shared expert and its one-unit gate;
    per dense layer its MLP. The routed experts are 3D parameters and the routers plain
    parameters, not ``nn.Linear``: bitsandbytes leaves them in the compute dtype.
    """
    moe = _experts(spec)
    h, q_out = spec.hidden, spec.num_heads * spec.head_dim
    attention = [(q_out, h), (spec.kv_dim, h), (spec.kv_dim, h), (h, q_out)]
    shapes = attention * spec.num_layers
    shared, dense = moe.shared_intermediate, moe.dense_intermediate
    if shared:
        shapes += [(shared, h), (shared, h), (h, shared), (1, h)] * moe.sparse_layers
    shapes += [(dense, h), (dense, h), (h, dense)] * (spec.num_layers - moe.sparse_layers)
    return shapes
