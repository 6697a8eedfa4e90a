"""A sliding window the sequence reaches: transformers hands SDPA a mask, and that costs.

SDPA on CUDA then runs the memory-efficient kernel, which keeps the mask turned into a
bias of the query's dtype, one per layer, and transformers repeats grouped keys and
values to every query head (``repeat_kv``). The closed form must change by what the
CUDA-target trace changes by, between the same model with and without a window.
"""

import pytest
import torch

from torchfit.memory import estimate, measure_step, trace

transformers = pytest.importorskip("transformers")

BATCH, SEQ, WINDOW, LAYERS = 2, 256, 64, 2


def _config(family, *, window, kv_heads):
    return getattr(transformers, f"{family}Config")(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        vocab_size=100,
        use_cache=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=1,
        sliding_window=window,
    )


def _traced_and_closed(family, *, window, kv_heads, precision):
    config = _config(family, window=window, kv_heads=kv_heads)
    torch.manual_seed(0)
    model = getattr(transformers, f"{family}ForCausalLM")(config)
    ids = torch.randint(1, 100, (BATCH, SEQ))
    step = dict(precision=precision, device="cuda", optimizer="sgd")
    traced = trace(model, {"input_ids": ids, "labels": ids}, **step).total
    return traced, estimate(config, batch_size=BATCH, seq_len=SEQ, **step).total


@pytest.mark.parametrize(
    ("family", "kv_heads", "precision"),
    [
        ("Mistral", 2, "bf16-true"),
        ("Mistral", 4, "bf16-mixed"),
        ("Phi3", 4, "bf16-true"),  # its fused qkv: the value stays a view without repeat_kv
        ("Phi3", 4, "32-true"),  # fp32: the memory-efficient kernel either way
    ],
)
def test_the_window_costs_what_the_trace_sees(family, kv_heads, precision):
    common = dict(kv_heads=kv_heads, precision=precision)
    windowed = _traced_and_closed(family, window=WINDOW, **common)
    plain = _traced_and_closed(family, window=None, **common)
    traced, closed = windowed[0] - plain[0], windowed[1] - plain[1]
    assert abs(traced - closed) <= 4 * BATCH * SEQ * LAYERS, (traced, closed)
    # at least one layer's bias (a query-by-key matrix per sequence) is alive at the peak
    assert closed >= BATCH * SEQ * SEQ * (4 if precision == "32-true" else 2)


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_the_window_costs_on_the_cpu_what_a_real_step_allocates(kv_heads):
    # the CPU's flash kernel takes the mask as well: the same bias, kept per layer
    measured, closed = {}, {}
    for window in (WINDOW, None):
        config = _config("Mistral", window=window, kv_heads=kv_heads)
        torch.manual_seed(0)
        model = transformers.MistralForCausalLM(config)
        ids = torch.randint(1, 100, (BATCH, SEQ))
        batch = {"input_ids": ids, "labels": ids}
        measured[window] = measure_step(model, batch, optimizer="sgd", device="cpu").peak
        step = dict(batch_size=BATCH, seq_len=SEQ, optimizer="sgd", device="cpu", dtype="fp32")
        closed[window] = estimate(config, **step).total
    assert closed[WINDOW] - closed[None] == measured[WINDOW] - measured[None]
    assert measured[WINDOW] - measured[None] >= BATCH * SEQ * SEQ * 4  # one fp32 bias at least


def test_a_window_the_sequence_does_not_reach_changes_nothing():
    config = _config("Mistral", window=SEQ + 1, kv_heads=2)
    plain = _config("Mistral", window=None, kv_heads=2)
    step = dict(batch_size=BATCH, seq_len=SEQ, precision="bf16-true", device="cuda")
    assert estimate(config, **step).total == estimate(plain, **step).total


def test_a_prompt_keeps_its_whole_cache_under_a_window():
    # transformers' sliding-window cache layer keeps a view of the prompt's concatenated
    # keys and values: their whole storage, until the first decoding step replaces it
    step = dict(batch_size=BATCH, seq_len=SEQ, mode="inference", use_cache=True)
    step.update(precision="bf16-true", device="cuda")
    windowed = estimate(_config("Mistral", window=WINDOW, kv_heads=2), **step)
    plain = estimate(_config("Mistral", window=None, kv_heads=2), **step)
    assert windowed.kv_cache == plain.kv_cache > 0
    # and SDPA gets the window's boolean mask, one byte per query and key, held by the model
    assert windowed.total - plain.total == BATCH * SEQ * SEQ
