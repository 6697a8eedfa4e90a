"""Saved-for-backward bytes of one transformer block, term by term.

Each term names a tensor autograd keeps (found with ``saved_tensors_hooks`` on
transformers' GPT-2, Llama and BERT blocks, torch 2.13) and its bytes per token. The
sums are checked against real allocations in ``tests/memory/test_estimator.py``.
"""

from __future__ import annotations

import dataclasses

from torchfit._core.units import DType
from torchfit.memory.analytic.arch import Family, TransformerSpec
from torchfit.memory.analytic.attention_terms import (
    attention_per_token,
    core_terms,
    output_copied,
    window_masked,
)
from torchfit.memory.analytic.formulas import FP32, INT64, AttentionImpl, dropout_mask_bytes
from torchfit.memory.analytic.lora import is_fused
from torchfit.memory.analytic.settings import BlockSettings
from torchfit.memory.analytic.term import Term, layer_norm, pieces

__all__ = [
    "SAVED_BY_ACTIVATION",
    "block_terms",
    "head_terms",
    "inference_transient",
    "mlp_backward_width",
    "upcasts_logits",
]

#: Activations whose transformers implementation is a chain of Python ops: every
#: intermediate is saved (NewGELUActivation: 0.5*x*(1+tanh(c*(x+0.044715*x^3)))).
SAVED_BY_ACTIVATION = {"gelu_new": 4, "gelu_fast": 3, "quick_gelu": 2}


def _dropout(spec_p: float, s: BlockSettings) -> float:
    return dropout_mask_bytes(s.dtype, s.device) if s.training and spec_p > 0 else 0.0


def _qk_norm(spec: TransformerSpec, s: BlockSettings) -> float:
    """What Qwen3's per-head RMSNorms of the queries and keys keep, per token (0 without).

    Each is Llama's RMSNorm over one head: the fp32 copy of its input (the projection's
    output, kept by ``pow``), one fp32 ``rsqrt`` per head, and for the weight's gradient
    the normalized input in the compute dtype. Measured with the CUDA-target trace of
    Qwen3 against Qwen2 (same sizes): 2,600 bytes per token and layer in fp32, 1,960 in
    bf16, for 8 query and 2 key heads of 32.
    """
    if not spec.qk_norm:
        return 0
    q, k = spec.num_heads * spec.head_dim, spec.kv_dim
    normalized = 0 if s.frozen_base else (q + k) * s.dtype.itemsize
    heads = spec.num_heads + spec.num_kv_heads
    return s.rms_norm(spec, q + k) + heads * FP32 + normalized


def _activation(spec: TransformerSpec, s: BlockSettings, name: str) -> Term:
    """What the MLP's activation keeps, per token: each tensor of its chain of ops.

    gelu_new is a chain of Python ops. Under CUDA autocast ``pow`` runs in fp32 (its
    list in aten/src/ATen/autocast_mode.h) and the chain promotes to fp32 from there:
    ``pow`` keeps an fp32 copy of its input, ``tanh`` its fp32 output, the last ``mul``
    the 16-bit ``0.5 * x`` and the fp32 ``1 + tanh`` (measured with a CUDA-target trace).
    """
    e, i = s.mlp_itemsize, spec.intermediate
    if spec.activation == "gelu_new" and s.autocast and s.device == "cuda" and e < FP32:
        return pieces(name, *(FP32 * i,) * 3, e * i)
    return pieces(name, *(e * i,) * SAVED_BY_ACTIVATION.get(spec.activation, 1))


def block_terms(spec: TransformerSpec, seq_len: int, s: BlockSettings) -> list[Term]:
    """Saved tensors of one block, per token, for training."""
    e, h, i = s.dtype.itemsize, spec.hidden, spec.intermediate
    drop = _dropout(spec.dropout, s)
    copied = output_copied(spec, s, masked=window_masked(spec, seq_len, s))
    if spec.family is Family.GPT2:
        return [
            layer_norm("ln_1 input + mean/rstd", h * s.residual),
            Term("c_attn input", h * e if s.keeps_input("qkv") else 0),
            *core_terms(spec, seq_len, s),
            Term("c_proj input", h * e if s.keeps_input("o") and copied else 0),
            pieces("dropout masks (attn, mlp)", h * drop, h * drop),
            layer_norm("ln_2 input + mean/rstd", h * s.residual),
            Term("c_fc input", h * e if s.keeps_input("fc") else 0),
            _activation(spec, s, f"{spec.activation} intermediates"),
            Term("mlp c_proj input", i * e if s.keeps_input("down") else 0),
            *s.adapter_terms(spec),
        ]
    if spec.family is Family.LLAMA:
        # RMSNorm: fp32 copy of the input, rsqrt, the normalized input before the weight
        # (kept for the weight's gradient only)
        normed = 0 if s.frozen_base else h * s.residual
        # Phi-3 reads the normed input once for q/k/v and once for gate/up (fused Linears)
        fused = is_fused(spec)
        qkv, gate_up = (("qkv",), ("gate_up",)) if fused else (("q", "k", "v"), ("gate", "up"))
        return [
            s.rms_term("input RMSNorm", spec, normed),
            pieces("q/k/v input", *(h * e,) * s.input_copies(*qkv)),
            Term("q/k per-head RMSNorm", _qk_norm(spec, s)),
            *core_terms(spec, seq_len, s),
            Term("o_proj input", h * e if s.keeps_input("o") and copied else 0),
            s.rms_term("post-attention RMSNorm", spec, normed),
            pieces("gate/up input", *(h * e,) * s.input_copies(*gate_up)),
            pieces("SwiGLU: gate, act(gate), up", *(i * s.mlp_itemsize,) * 3),
            Term("down_proj input (the product)", i * e if s.keeps_input("down") else 0),
            *s.adapter_terms(spec),
        ]
    act = SAVED_BY_ACTIVATION.get(spec.activation, 1)
    return [
        pieces("q/k/v input", *(h * e,) * s.input_copies("q", "k", "v")),
        *core_terms(spec, seq_len, s),
        Term("attention output input", h * e if s.keeps_input("o") and copied else 0),
        Term("dropout masks", 2 * h * drop),
        Term("LayerNorm inputs + mean/rstd", 2 * (h * s.residual + 2 * FP32)),
        Term("intermediate input", h * e if s.keeps_input("fc") else 0),
        pieces(f"{spec.activation} input", *(i * e,) * act),
        Term("output dense input", i * e if s.keeps_input("down") else 0),
        *s.adapter_terms(spec),
    ]


def upcasts_logits(spec: TransformerSpec, dtype: DType) -> bool:
    """Whether the causal-LM loss makes an fp32 copy of 16-bit logits (``logits.float()``).

    transformers' ``ForCausalLMLoss`` (GPT-2 and Llama heads) upcasts them before the
    log-softmax; fp32 logits need no copy (`loss_bytes` for what the loss keeps).
    """
    return spec.family in {Family.GPT2, Family.LLAMA} and dtype.itemsize < FP32


def loss_bytes(spec: TransformerSpec, s: BlockSettings) -> tuple[Term, float]:
    """The cross-entropy's saved tensor and its gradients at the start of backward, per token.

    GPT-2 and Llama heads in transformers upcast the logits (``logits.float()``, the
    ``ForCausalLMLoss`` path): the log-softmax is fp32, and its backward holds two fp32
    gradients (nll_loss's and log_softmax's). A masked LM hands its logits to
    ``nn.CrossEntropyLoss`` as they are: log_softmax runs in the logits' own dtype
    (aten/src/ATen/native/LossNLL.cpp, ``cross_entropy_loss``); under CUDA autocast only
    ``nll_loss`` is cast to fp32, so a 16-bit log-softmax and its fp32 copy are kept and
    the copy is freed before log_softmax's backward (measured on an H200: a BERT MLM fp16
    step held exactly those three at its peak). CPU autocast casts ``cross_entropy_loss``
    as a whole to fp32: the fp32 path, as are logits the loop cast to fp32
    (``s.fp32_logits``). Returns the saved `Term` and the gradients alive with it, per token.
    """
    v, e = spec.vocab, s.dtype.itemsize
    upcast = (s.autocast and s.device != "cuda") or s.fp32_logits
    if spec.family in {Family.GPT2, Family.LLAMA} or e == FP32 or upcast:
        return Term("log-softmax of the logits (fp32)", v * FP32), 2 * v * FP32
    if s.autocast:
        saved = Term("log-softmax of the logits, and nll_loss's fp32 copy", v * (e + FP32))
        return saved, v * FP32
    return Term("log-softmax of the logits", v * e), 2 * v * e


def head_terms(spec: TransformerSpec, s: BlockSettings) -> list[Term]:
    """Embedding and head tensors saved for training, per token (and the loss's, `loss_bytes`).

    The input ids themselves are the caller's tensor (counted once, as an input).
    """
    e, h = s.dtype.itemsize, spec.hidden
    drop = _dropout(spec.dropout, s)
    logits = loss_bytes(spec, s)[0]
    # saved for the head's weight gradient only
    head_input = 0 if s.frozen_base and not s.head_trains else h * e
    if spec.family is Family.GPT2:
        return [
            Term("embedding dropout mask", h * drop),
            layer_norm("ln_f input + mean/rstd", h * e),
            Term("lm_head input", head_input),
            logits,
            Term("labels", INT64),
        ]
    if spec.family is Family.LLAMA:
        return [
            s.rms_term("final RMSNorm", spec, head_input),
            Term("lm_head input", head_input),
            logits,
            Term("labels", INT64),
        ]
    return [
        Term("token type ids", INT64),
        Term("embedding LayerNorm + dropout", h * e + 2 * FP32 + h * drop + (h * e if drop else 0)),
        Term("MLM transform (dense, act, LayerNorm inputs)", 3 * h * e + 2 * FP32),
        Term("decoder input", head_input),
        logits,
    ]


def mlp_backward_width(spec: TransformerSpec) -> float:
    """Gradients alive at once in an MLP's backward, in units of intermediate-width elements.

    SwiGLU: the gradients of the gate, the up projection and the activation; GELU-style
    MLPs: one per saved intermediate of the activation (measured with the tracer on
    1-layer GPT-2s: gelu_new's backward holds 3.5 to 4.4 i-wide tensors at its peak).
    """
    if spec.family is Family.LLAMA:
        return 3.0 * spec.intermediate
    return float(SAVED_BY_ACTIVATION.get(spec.activation, 1) * spec.intermediate)


def inference_transient(
    spec: TransformerSpec, seq_len: int, s: BlockSettings, *, batch_size: int = 1
) -> float:
    """Largest set of tensors alive at once inside one block at inference, per token."""
    e, h, i = s.dtype.itemsize, spec.hidden, spec.intermediate
    core = attention_per_token(spec, seq_len, dataclasses.replace(s, training=False), dropout=0.0)
    # Kept by the model's forward for its whole duration (measured with the tracer,
    # transformers 5.25): GPT-2 holds its token embeddings and its position embeddings (one
    # row of positions for the batch) as locals, Llama the input embeddings; BERT's
    # embedding module returns its LayerNorm's output alone (a 1-layer BERT at 128 tokens:
    # 2 s^2 + 4.1 h per token at its attention peak).
    held = {Family.LLAMA: 1.0, Family.BERT: 0.0}.get(spec.family, 1 + 1 / batch_size)
    embeddings = held * h * e
    attention_phase = 2 * h * e + 3 * h * e + core  # residual, normed, q/k/v, core
    if spec.family is Family.LLAMA:
        mlp_width = 3 * i * e  # gate, up, act(gate) before the product
    else:  # the MLP input plus the activation's intermediates (gelu_new: a chain of four)
        mlp_width = (1 + SAVED_BY_ACTIVATION.get(spec.activation, 1)) * i * e
    # Eager attention returns its probabilities, which the block holds until it returns:
    # one b·a·s² tensor stays alive through the MLP.
    eager = s.attention is AttentionImpl.EAGER
    probabilities = spec.num_heads * seq_len * e if eager else 0
    mlp_phase = 2 * h * e + mlp_width + probabilities
    return embeddings + max(attention_phase, mlp_phase)
