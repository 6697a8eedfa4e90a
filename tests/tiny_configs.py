"""Tiny transformers configs the Step tests share (estimates in milliseconds)."""

import transformers


def tiny_llama(**overrides):
    """A two-layer, 128-wide Llama with grouped KV heads and a 1,000-token vocabulary."""
    shape = {
        "num_hidden_layers": 2,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
    }
    return transformers.LlamaConfig(**{**shape, **overrides})
