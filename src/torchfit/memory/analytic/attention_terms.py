"""The attention's saved bytes in a block's terms, and whether its output is copied.

`core_terms` is what the attention itself keeps for backward (`attention_bytes` of one
sequence, per token), cut into the tensors a fused kernel keeps; `output_copied` says
whether the output projection keeps a copy of the attention's output or the output
itself; `window_masked` whether transformers hands SDPA a mask for a sliding window.
"""

from __future__ import annotations

import dataclasses

from torchfit.memory.analytic.arch import Family, TransformerSpec
from torchfit.memory.analytic.formulas import (
    FP32,
    AttentionImpl,
    attention_bytes,
    keeps_linear_state,
)
from torchfit.memory.analytic.lora import is_fused
from torchfit.memory.analytic.settings import BlockSettings
from torchfit.memory.analytic.term import Term, pieces

__all__ = ["attention_per_token", "core_terms", "output_copied", "window_masked"]


def window_masked(spec: TransformerSpec, seq_len: int, s: BlockSettings) -> bool:
    """Whether transformers hands SDPA a boolean mask: a sliding window the sequence reaches.

    Without one it passes ``is_causal`` alone; a window is skipped only while the keys
    are fewer than it (``_ignore_causal_mask_sdpa`` in transformers'
    ``masking_utils``: ``kv_length < local_attention_size``). With a mask, SDPA on CUDA
    runs the memory-efficient kernel (FlashAttention-2 takes none), turns the mask into a
    bias of the query's dtype that the kernel keeps for its backward, one per layer, and
    transformers repeats grouped keys and values to every query head first (``repeat_kv``;
    ``use_gqa_in_sdpa`` asks for no mask). transformers' own FlashAttention-2 path applies
    the window inside the kernel.
    """
    window = spec.sliding_window
    return s.attention is AttentionImpl.SDPA and window is not None and seq_len >= window


def _fused_tensors(spec: TransformerSpec, s: BlockSettings, per_token: float) -> tuple[float, ...]:
    """A fused attention's saved bytes per token as its tensors; () when they are not that.

    Flash and memory-efficient SDPA keep the query, key and value (GPT-2's are views of
    one ``c_attn`` output, 3h wide), the output, and one fp32 log-sum-exp per head and
    token (the memory-efficient kernel pads the sequence to 32). Eager attention's scores
    and probabilities, or a math fallback, leave more than that: one tensor.
    """
    e = s.dtype.itemsize
    h, kv = spec.hidden * e, spec.kv_dim * e
    inputs = (3 * h,) if spec.family is Family.GPT2 else (h, kv, kv)
    tensors = (*inputs, h)
    rest = per_token - sum(tensors)
    if not 0 < rest <= 2 * FP32 * spec.num_heads:
        return ()
    return (*tensors, rest)


def attention_per_token(
    spec: TransformerSpec, seq_len: int, s: BlockSettings, *, dropout: float
) -> float:
    """`attention_bytes` of one sequence of this block's attention, per token."""
    # Llama-style eager attention upcasts the scores itself (softmax(..., dtype=float32)
    # then .to(query.dtype)), and CUDA autocast runs softmax in fp32 for every family
    # (the fp32_set_opt_dtype list of aten/src/ATen/autocast_mode.h).
    fp32_softmax = (s.autocast and s.device == "cuda") or (
        spec.family is Family.LLAMA and s.dtype.itemsize < FP32
    )
    whole = attention_bytes(
        batch_size=1,
        seq_len=seq_len,
        num_heads=spec.num_heads,
        head_dim=spec.head_dim,
        dtype=s.dtype,
        implementation=s.attention,
        training=s.training,
        dropout=dropout,
        num_kv_heads=spec.num_kv_heads,
        device=s.device,
        fp32_softmax=fp32_softmax,
    )
    return whole / seq_len


def core_terms(spec: TransformerSpec, seq_len: int, s: BlockSettings) -> list[Term]:
    """What the attention keeps for backward, per token: its tensors where it is fused.

    Under a sliding window's mask (`window_masked`) the keys and values it keeps are
    repeated to every query head, and a fused kernel keeps the mask's bias (``seq_len``
    entries per token in the query's dtype).
    """
    masked = window_masked(spec, seq_len, s)
    grouped_kv = spec.num_kv_heads < spec.num_heads
    if masked:  # repeat_kv: the kernel sees (and keeps) every head's keys and values
        spec = dataclasses.replace(spec, num_kv_heads=spec.num_heads)
    p = spec.attention_dropout if s.training else 0.0
    per_token = attention_per_token(spec, seq_len, s, dropout=p)
    name = f"attention ({s.attention.value})"
    tensors = _fused_tensors(spec, s, per_token)
    terms = [pieces(name, *tensors) if tensors else Term(name, per_token)]
    flash = keeps_linear_state(s.attention, device=s.device, training=s.training, dropout=p)
    if flash and s.device == "cpu" and spec.family is Family.GPT2 and s.training:
        # GPT-2's fused c_attn output stays alive (Q/K/V are views of it) and the CPU
        # flash kernel keeps two contiguous copies: measured 6h per token, not 4h.
        terms.append(Term("fused QKV storage kept by views", 2 * spec.hidden * s.dtype.itemsize))
    grouped = s.dtype.itemsize == FP32 and spec.num_kv_heads < spec.num_heads
    fused = keeps_linear_state(
        s.attention, device=s.device, training=s.training, dropout=p, fp32_grouped=grouped
    )
    if fused and is_fused(spec) and s.training and not (masked and grouped_kv):
        # Phi-3 slices q, k and v out of one qkv_proj output: the value handed to the
        # kernel is a view of it, so the whole output stays saved, not a value-wide one
        # (the CUDA-target trace of Phi-3 against Llama of the same sizes: q + kv wider);
        # repeat_kv would hand it a copy instead
        extra = (spec.num_heads * spec.head_dim + spec.kv_dim) * s.dtype.itemsize
        terms.append(Term("qkv_proj output kept by the value's view", extra))
    if fused and masked and s.training:
        terms.append(Term("sliding-window mask as the kernel's bias", seq_len * s.dtype.itemsize))
    return terms


def output_copied(spec: TransformerSpec, s: BlockSettings, *, masked: bool = False) -> bool:
    """Whether the output projection's input is a copy of the attention's output.

    transformers hands the attention output to ``o_proj`` (GPT-2's ``c_proj``, BERT's
    output dense) as ``attn_output.transpose(1, 2).contiguous()``. CUDA's fused SDPA
    kernels (flash, memory-efficient) allocate their output as (batch, seq, heads,
    head_dim) and return it transposed (``_scaled_dot_product_flash_attention`` and its
    meta registration in torch/_meta_registrations.py), so that ``contiguous()`` is a
    view and the projection keeps the attention's own saved output: on an H200 the closed
    form counted it twice (+1.5% on a Llama-3.2-1B bf16 step, +1.8% on GPT-2 fp32,
    against -0.1% and -0.2% from the traced step). Eager attention, SDPA's math fallback
    and the CPU flash kernel (whose output is (batch, heads, seq, head_dim)) make a copy.

    The flash kernel allocates its output like its query (``empty_like`` of the query
    seen as (batch, seq, heads, head_dim): flash-attention's ``mha_fwd`` and the meta
    registration), so the layout is the query's. Llama's rotary embedding is elementwise
    and keeps the projection's (batch, seq, ...) layout; Phi-3's concatenates
    (``torch.cat`` of the rotated and passed-through halves), which leaves the query
    contiguous in (batch, heads, seq, head_dim), and ``contiguous()`` copies. The
    memory-efficient kernel (fp32, or ``masked``: `window_masked`) allocates (batch, seq,
    heads, head_dim) whatever the query's layout.
    """
    if s.attention is AttentionImpl.EAGER or s.device != "cuda":
        return True
    if is_fused(spec) and s.dtype.itemsize < FP32 and not masked:
        return True  # flash over a concatenated query
    grouped = s.dtype.itemsize == FP32 and spec.num_kv_heads < spec.num_heads and not masked
    dropout = spec.attention_dropout if s.training else 0.0
    fused = keeps_linear_state(
        s.attention, device=s.device, training=s.training, dropout=dropout, fp32_grouped=grouped
    )
    return not fused
