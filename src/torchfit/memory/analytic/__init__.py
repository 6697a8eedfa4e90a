"""Closed forms from a few numbers: model states, attention, KV cache, transformer blocks."""

from torchfit.memory.analytic.arch import Family, TransformerSpec, spec_from_config
from torchfit.memory.analytic.formulas import (
    AttentionImpl,
    attention_bytes,
    dropout_mask_bytes,
    kv_cache_bytes,
    kv_cache_bytes_for,
)
from torchfit.memory.analytic.model_states import (
    ModelStates,
    model_state_bytes,
    optimizer_state_bytes,
)

__all__ = [
    "AttentionImpl",
    "ModelStates",
    "attention_bytes",
    "dropout_mask_bytes",
    "kv_cache_bytes",
    "kv_cache_bytes_for",
    "model_state_bytes",
    "optimizer_state_bytes",
    "Family",
    "TransformerSpec",
    "spec_from_config",
]
