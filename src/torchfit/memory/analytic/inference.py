"""The closed-form inference estimate: a forward over the prompt, or ``generate``.

Split from `torchfit.memory.analytic.transformer` (which calls `inference_estimate`):
the forward's transient per block comes from `blocks.inference_transient` (or the MoE
hook's), the cache from `formulas.kv_cache_bytes`, and generation's two moments from
`generation.generation_moments`.
"""

from __future__ import annotations

import dataclasses
import math

from torchfit.memory.analytic.arch import TransformerSpec
from torchfit.memory.analytic.attention_terms import window_masked
from torchfit.memory.analytic.blocks import inference_transient
from torchfit.memory.analytic.formulas import INT64, spec_kv_bytes
from torchfit.memory.analytic.generation import generation_moments
from torchfit.memory.analytic.moe import moe_inference_transient
from torchfit.memory.analytic.outline import forward_outline
from torchfit.memory.analytic.settings import BlockSettings
from torchfit.memory.result import MemoryEstimate

__all__ = ["inference_estimate"]


def _inference_transient(
    spec: TransformerSpec, seq_len: int, settings: BlockSettings, batch_size: int
) -> float:
    if spec.moe is not None:
        return moe_inference_transient(spec, seq_len, settings)
    return inference_transient(spec, seq_len, settings, batch_size=batch_size)


def inference_estimate(
    spec: TransformerSpec,
    settings: BlockSettings,
    *,
    batch_size: int,
    seq_len: int,
    weights: int,
    use_cache: bool | None,
    notes: list[str],
    dequantized: int = 0,
    decode_dequantized: int = 0,
    new_tokens: int | None = None,
) -> MemoryEstimate:
    """The inference peak: one forward over ``seq_len`` tokens, or ``generate`` after it.

    Without ``new_tokens``: the forward's largest in-block transient, or its logits for
    every position beside the last hidden states; the cache it returns apart. With
    ``new_tokens``: `generation_moments` of that prompt. ``dequantized``: bitsandbytes'
    copy of a 4-bit weight for the prompt's matmuls, ``decode_dequantized`` for a step's.
    """
    tokens = batch_size * seq_len
    e = settings.dtype.itemsize
    cache = spec.family.value != "bert" if use_cache is None else use_cache
    # a sliding window's cache layer keeps a view of the prompt's whole keys and values
    # (transformers' DynamicSlidingWindowLayer.update slices the concatenated states):
    # the window frees the rest at the first decoding step, not at the prompt
    whole = dataclasses.replace(spec, sliding_window=None)
    kv = spec_kv_bytes(whole, batch_size=batch_size, seq_len=seq_len, dtype=settings.dtype)
    kv = kv if cache else 0
    if cache:
        notes.append("inference returns the KV cache of every layer")
    transient = math.ceil(tokens * _inference_transient(spec, seq_len, settings, batch_size))
    logits = math.ceil(tokens * spec.vocab * e)
    # Alive through the decoder's blocks: the additive 4D mask eager attention builds
    # (batch x 1 x s x s in the compute dtype; BERT builds it when the attention_mask pads
    # a position, as in a batch of unequal lengths, and none otherwise) and RoPE's tables.
    # SDPA under a sliding window (`window_masked`) gets a boolean one (1 byte an entry).
    mask = batch_size * seq_len * seq_len * e if settings.attention.value == "eager" else 0
    if window_masked(spec, seq_len, settings):
        mask = batch_size * seq_len * seq_len
    rope = 2 * seq_len * spec.head_dim * e if spec.family.value == "llama" else 0
    hidden = math.ceil(tokens * spec.hidden * e)
    # The mask and the tables are the decoder's locals: gone when the head makes the logits.
    in_blocks = mask + rope
    at_head = logits + hidden > transient + in_blocks
    found = MemoryEstimate(
        weights=weights,
        activations=(logits + hidden if at_head else transient) + dequantized,
        kv_cache=kv,
        overhead=math.ceil(tokens * INT64 + (0 if at_head else in_blocks)),
        device=settings.device,
        notes=tuple(notes),
        peak_at="forward",
    )
    if new_tokens is None:
        if spec.moe is not None or dequantized:
            return found
        core = hidden if settings.attention.value != "eager" else math.ceil(mask)
        outline = forward_outline(
            spec, settings, tokens=tokens, weights=weights, kv_cache=kv, core=core
        )
        return found.replace(outline=outline)
    moments = generation_moments(
        prefill=max(transient, hidden) + dequantized,
        kv_prompt=kv,
        kv_total=spec_kv_bytes(
            spec, batch_size=batch_size, seq_len=seq_len + new_tokens, dtype=settings.dtype
        ),
        num_layers=spec.num_layers,
        rows=batch_size,
        vocab=spec.vocab,
        itemsize=e,
        new_tokens=new_tokens,
        decode_extra=decode_dequantized,
    )
    return found.replace(
        activations=moments.activations,
        kv_cache=moments.kv_cache,
        notes=(*notes, moments.note),
        peak_at=moments.peak_at,
    )
