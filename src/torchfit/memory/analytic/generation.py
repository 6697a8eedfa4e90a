"""The memory of ``model.generate``: the prompt's forward, then one token at a time.

transformers' ``generate`` (4.45 and later) asks the prompt's forward for the logits of
the last position only (``logits_to_keep=1`` when the model's forward takes it:
``GenerationMixin._supports_logits_to_keep``), copies them to fp32 for the logits
processors, and grows a ``DynamicCache`` by one position per step: each layer's
``update`` concatenates the old keys (then values) with the new one, so for a moment a
layer's keys exist twice. Two moments can hold the most memory:

- the prefill: the prompt's forward (its largest in-block transient) and the prompt's
  cache;
- the last decoding step: the cache of prompt and new tokens, plus one layer's keys
  copied by the concatenation.

`generation_moments` picks the larger from those inputs; the closed forms and the meta
pass compute the inputs their own way.
"""

from __future__ import annotations

import dataclasses
import math

from torchfit.memory.analytic.formulas import FP32

__all__ = ["Generation", "generation_moments"]


@dataclasses.dataclass(frozen=True)
class Generation:
    """The peak moment of a ``generate`` call (beside the weights and the inputs)."""

    activations: int
    kv_cache: int
    peak_at: str
    note: str


def generation_moments(
    *,
    prefill: int,
    kv_prompt: int,
    kv_total: int,
    num_layers: int,
    rows: int,
    vocab: int,
    itemsize: float,
    new_tokens: int,
    decode_extra: int = 0,
) -> Generation:
    """The larger of the prefill and the last decoding step.

    Args:
        prefill: Largest set of tensors the prompt's forward holds at once, besides its
            cache and without the logits (only the last position's are made).
        kv_prompt: The cache after the prompt.
        kv_total: The cache after prompt and ``new_tokens`` (capped by sliding windows).
        num_layers: Layers the cache is split over (one layer's keys are copied at a time).
        rows: Sequences generated at once (the batch).
        vocab: The head's width.
        itemsize: Bytes per element of the logits.
        new_tokens: ``max_new_tokens`` (for the note).
        decode_extra: What each decoding step adds besides (bitsandbytes' dequantized
            4-bit weight when more than one row decodes).

    Example:
        >>> g = generation_moments(prefill=900, kv_prompt=400, kv_total=800, num_layers=2,
        ...                        rows=1, vocab=10, itemsize=2, new_tokens=4)
        >>> g.peak_at, g.activations + g.kv_cache
        ('prefill', 1360)
    """
    last_logits = math.ceil(rows * vocab * (itemsize + FP32))  # and their fp32 copy
    layer_keys = math.ceil(kv_total / max(num_layers, 1) / 2)
    start = Generation(
        activations=prefill + last_logits,
        kv_cache=kv_prompt,
        peak_at="prefill",
        note="generate(): the prompt's forward makes the last position's logits only",
    )
    end = Generation(
        activations=layer_keys + last_logits + decode_extra,
        kv_cache=kv_total,
        peak_at="last decoding step",
        note=(
            f"generate(): the cache grows by {new_tokens} positions; its last update "
            "copies one layer's keys"
        ),
    )
    return end if end.activations + end.kv_cache > start.activations + start.kv_cache else start
