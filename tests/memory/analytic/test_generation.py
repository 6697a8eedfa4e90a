"""``max_new_tokens``: inference as ``model.generate``, against real generate calls on CPU.

The closed form (Llama) and the meta pass (BLOOM, no closed form) both model the two
moments of ``generate``: the prompt's forward, which makes the last position's logits
only, and the last decoding step, with the cache of prompt and new tokens.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchfit.cli import main
from torchfit.memory import estimate, measure_peak
from torchfit.memory.analytic.generation import generation_moments

transformers = pytest.importorskip("transformers")
VOCAB = 32000


def _configs():
    return {
        "llama": transformers.LlamaConfig(
            hidden_size=256,
            intermediate_size=688,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=VOCAB,
            max_position_embeddings=4096,
        ),
        "bloom": transformers.BloomConfig(hidden_size=256, n_layer=4, n_head=4, vocab_size=VOCAB),
    }


@pytest.mark.parametrize("family", ["llama", "bloom"])
@pytest.mark.parametrize(("prompt", "new"), [(512, 32), (32, 160)], ids=["prefill", "decode"])
def test_the_estimate_follows_a_real_generate_call(family, prompt, new):
    config = _configs()[family]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(0, VOCAB, (2, prompt))

    def generate():
        with torch.no_grad():
            model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)

    real = measure_peak(generate, track=(model, ids), device="cpu")
    real = getattr(real, "peak", real)
    found = estimate(
        config,
        batch_size=2,
        seq_len=prompt,
        dtype="fp32",
        mode="inference",
        device="cpu",
        max_new_tokens=new,
    )
    assert -0.03 <= found.total / real - 1 <= 0.03, (found.total, real, found.peak_at)
    assert found.peak_at == ("prefill" if prompt > new else "last decoding step")
    # one forward over prompt + new tokens, every position's logits: far above generate
    whole = estimate(
        config, batch_size=2, seq_len=prompt + new, dtype="fp32", mode="inference", device="cpu"
    )
    assert whole.total > found.total


def test_generation_is_inference_with_a_cache():
    config = _configs()["llama"]
    with pytest.raises(ValueError, match=r"max_new_tokens=8 describes generation.*mode='train'"):
        estimate(config, batch_size=1, seq_len=16, max_new_tokens=8)
    with pytest.raises(ValueError, match=r"max_new_tokens=8 .*use_cache=False"):
        estimate(
            config, batch_size=1, seq_len=16, mode="inference", use_cache=False, max_new_tokens=8
        )


def test_plan_takes_new_tokens(capsys):
    argv = ["plan", "llama-3-8b", "--gpu", "RTX 4090", "--inference", "--seq", "4096"]
    assert main([*argv, "--new-tokens", "2048"]) == 0
    assert "generate()" in capsys.readouterr().out
    assert main([*argv[:-3], "--new-tokens", "2048"]) == 2  # training: refused
    assert "max_new_tokens=2048 describes generation" in capsys.readouterr().err


@settings(max_examples=80, deadline=None)
@given(
    prefill=st.integers(0, 2**36),
    kv_prompt=st.integers(0, 2**36),
    more=st.integers(0, 2**36),
    layers=st.integers(1, 128),
    rows=st.integers(1, 64),
    vocab=st.integers(1, 2**18),
    new=st.integers(1, 8192),
)
def test_the_peak_is_the_larger_moment(prefill, kv_prompt, more, layers, rows, vocab, new):
    kv_total = kv_prompt + more
    g = generation_moments(
        prefill=prefill,
        kv_prompt=kv_prompt,
        kv_total=kv_total,
        num_layers=layers,
        rows=rows,
        vocab=vocab,
        itemsize=2,
        new_tokens=new,
    )
    total = g.activations + g.kv_cache
    assert total >= prefill + kv_prompt
    assert total >= kv_total
    assert g.peak_at in {"prefill", "last decoding step"}
    assert (g.kv_cache == kv_total) == (g.peak_at == "last decoding step") or kv_total == kv_prompt
