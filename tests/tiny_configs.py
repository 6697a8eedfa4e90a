"""Tiny transformers configs and models the tests share (estimates in milliseconds)."""

import contextlib

import torch
import transformers

from torchfit.memory import estimate, trace

#: The vocabulary of `tiny_family`'s models.
VOCAB = 4000


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


def tiny_family(family, *, layers=3):
    """``(config, model)``: a 128-wide Llama, GPT-2 (no dropout) or BERT masked LM, seeded."""
    if family == "llama":
        config = transformers.LlamaConfig(
            hidden_size=128,
            intermediate_size=384,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=VOCAB,
            max_position_embeddings=256,
        )
        cls = transformers.LlamaForCausalLM
    elif family == "gpt2":
        config = transformers.GPT2Config(
            n_layer=layers,
            n_embd=128,
            n_head=4,
            n_positions=256,
            vocab_size=VOCAB,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
        cls = transformers.GPT2LMHeadModel
    else:
        config = transformers.BertConfig(
            hidden_size=128,
            intermediate_size=384,
            num_hidden_layers=layers,
            num_attention_heads=4,
            vocab_size=VOCAB,
            max_position_embeddings=256,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
        cls = transformers.BertForMaskedLM
    torch.manual_seed(0)
    return config, cls(config)


#: Sizes a Llama-family config takes (Llama, Qwen2, Qwen3): grouped KV heads, head_dim 32.
LLAMA_LIKE = dict(
    vocab_size=512,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=1024,
    bos_token_id=0,
    eos_token_id=0,
    pad_token_id=0,
)


def traced_and_closed(family, batch, seq, *, around=contextlib.nullcontext, **step):
    """``(traced, closed form)`` totals of a seeded ``{family}ForCausalLM`` of `LLAMA_LIKE`.

    The trace runs inside ``around()``; ``step`` holds both's settings (`Step` fields).
    """
    config = getattr(transformers, f"{family}Config")(**LLAMA_LIKE)
    torch.manual_seed(0)
    model = getattr(transformers, f"{family}ForCausalLM")(config)
    ids = torch.randint(1, LLAMA_LIKE["vocab_size"], (batch, seq))
    run = {k: step[k] for k in ("precision", "device", "optimizer") if k in step}
    with around():
        traced = trace(model, {"input_ids": ids, "labels": ids}, **run).total
    return traced, estimate(config, batch_size=batch, seq_len=seq, **step).total
