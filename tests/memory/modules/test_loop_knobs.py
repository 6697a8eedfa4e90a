"""The loop knobs on models without a closed form: the meta-pass estimate and the trace.

Accumulation, ``zero_grad(set_to_none=False)``, a kept output and the optimizer step in
backward, each against the real CPU step run with the same loop (`measure_step`).
"""

import pytest
import torch

from torchfit import Step
from torchfit.memory import estimate, measure_step, trace

KNOBS = [
    {},
    {"gradient_accumulation_steps": 3},
    {"set_to_none": False},
    {"keep_output": True},
    {"optimizer_in_backward": True},
    {"optimizer_in_backward": True, "keep_output": True},
]


def _mlp(width, depth):
    torch.manual_seed(0)
    layers = [
        torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU()) for _ in range(depth)
    ]
    return torch.nn.Sequential(*layers)


@pytest.mark.parametrize("knobs", KNOBS, ids=str)
@pytest.mark.parametrize(("width", "depth", "batch"), [(512, 4, 256), (1024, 2, 8)])
@pytest.mark.parametrize("optimizer", ["adamw", "sgd-momentum"])
def test_module_estimate_and_trace_follow_the_real_step(knobs, width, depth, batch, optimizer):
    net, x = _mlp(width, depth), torch.randn(batch, width)
    real = measure_step(net, x, optimizer=optimizer, device="cpu", **knobs).peak
    est = estimate(
        net, batch_size=batch, input_shape=(width,), optimizer=optimizer, device="cpu", **knobs
    )
    traced = trace(net, x, optimizer=optimizer, **knobs)
    assert -0.01 <= est.total / real - 1 <= 0.03, (est.total, real)
    assert abs(traced.total / real - 1) <= 0.001, (traced.total, real)


def test_the_knobs_move_the_estimate_where_activations_dominate():
    net = _mlp(512, 4)
    common = dict(batch_size=2048, input_shape=(512,), optimizer="adamw", device="cpu")
    plain = estimate(net, **common)
    assert estimate(net, gradient_accumulation_steps=2, **common).total > plain.total
    assert estimate(net, keep_output=True, **common).total > plain.total
    fused = estimate(net, optimizer_in_backward=True, **common)
    assert fused.gradients == 0 and fused.peak_at != "optimizer step"
    assert any("optimizer step in backward" in note for note in fused.notes)


def test_a_transformers_model_without_closed_form_takes_the_knobs():
    transformers = pytest.importorskip("transformers")
    config = transformers.BloomConfig(hidden_size=64, n_layer=2, n_head=4, vocab_size=500)
    torch.manual_seed(0)
    model = transformers.BloomForCausalLM(config)
    ids = torch.randint(0, 500, (2, 32))
    for knobs in KNOBS[1:4]:
        real = measure_step(model, {"input_ids": ids, "labels": ids}, device="cpu", **knobs).peak
        est = estimate(config, batch_size=2, seq_len=32, dtype="fp32", device="cpu", **knobs)
        assert -0.02 <= est.total / real - 1 <= 0.03, (knobs, est.total, real)


def test_a_chunked_loss_is_refused_where_the_loss_is_the_models_own():
    with pytest.raises(
        ValueError, match="loss_chunk_size is modelled for transformers language models"
    ):
        estimate(_mlp(64, 1), batch_size=2, input_shape=(64,), loss_chunk_size=8)


def test_fp32_logits_are_refused_where_the_loss_is_the_models_own_or_there_is_none():
    with pytest.raises(ValueError, match="fp32_output is modelled for transformers language"):
        estimate(_mlp(64, 1), batch_size=2, input_shape=(64,), fp32_output=True)
    with pytest.raises(ValueError, match="fp32_output=True describes a training loop"):
        estimate("gpt2", seq_len=64, mode="inference", fp32_output=True)
    with pytest.raises(TypeError, match="fp32_output must be True or False; got 'yes'"):
        Step(fp32_output="yes")


def test_the_trace_says_the_step_ran_per_parameter():
    net = _mlp(64, 2)
    traced = trace(net, torch.randn(4, 64), optimizer="adamw", optimizer_in_backward=True)
    assert "stepped per parameter in backward" in traced.notes[0]
    with pytest.raises(ValueError, match="inference has no backward"):
        trace(net, torch.randn(4, 64), mode="inference", optimizer_in_backward=True)
