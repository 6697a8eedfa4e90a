"""`estimate` on CUDA of a model without a closed form: its step traced, events replayed."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from torchfit.memory import estimate, to_device, trace
from torchfit.memory.kernels.cuda import CUBLAS_NOTE
from torchfit.memory.outline import RecordedStep
from torchfit.memory.tracing.tracer import trace_events, with_recorded_step

GiB = 2**30


def _cnn(channels, blocks, norm):
    torch.manual_seed(0)
    layers = [nn.Conv2d(3, channels, 3, padding=1)]
    for _ in range(blocks):
        layers += [nn.BatchNorm2d(channels) if norm else nn.Identity(), nn.ReLU()]
        layers.append(nn.Conv2d(channels, channels, 3, padding=1))
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 10)]
    return nn.Sequential(*layers)


@settings(max_examples=6, deadline=None)
@given(
    channels=st.sampled_from([8, 16, 32]),
    blocks=st.integers(1, 3),
    norm=st.booleans(),
    batch=st.integers(1, 16),
    precision=st.sampled_from(["32-true", "bf16-mixed"]),
    optimizer=st.sampled_from(["sgd", "adamw"]),
)
def test_the_cuda_estimate_of_a_module_is_its_traced_step(
    channels, blocks, norm, batch, precision, optimizer
):
    model = _cnn(channels, blocks, norm)
    step = {"batch_size": batch, "precision": precision, "optimizer": optimizer}
    found = estimate(model, input_shape=(3, 32, 32), device="cuda", **step)
    images = torch.zeros(batch, 3, 32, 32, device="meta")
    run = {"precision": precision, "optimizer": optimizer, "device": "cuda"}
    traced = trace_events(model, images, **run)
    assert found.total == traced.estimate.total
    assert any("traced on fake tensors (CUDA rules)" in n for n in found.notes)
    assert isinstance(found.outline, RecordedStep)
    # on a card: the same reserved bytes as the trace's own device view, and an OOM line
    placed = to_device(found, gpu="RTX 4090")
    direct = trace(model, images, gpu="RTX 4090", **run)
    assert placed.reserved == direct.reserved
    assert placed.total <= placed.oom_line <= placed.reserved


@settings(max_examples=6, deadline=None)
@given(width=st.sampled_from([16, 64, 256]), batch=st.integers(1, 32), steps=st.integers(1, 3))
def test_a_recorded_step_replays_as_the_events_it_holds(width, batch, steps):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
    result = trace_events(
        model, torch.zeros(batch, width), device="cuda", gradient_accumulation_steps=steps
    )
    by_events = to_device(
        result.estimate, gpu="A100 80GB", events=result.allocator_events(),
        warmup=result.warmup_events,
    )  # fmt: skip
    by_outline = to_device(with_recorded_step(result), gpu="A100 80GB")
    assert by_outline.reserved == by_events.reserved
    assert by_outline.total == by_events.total
    assert by_events.oom_line is None  # events given by hand: no OOM-line search
    assert by_outline.oom_line is not None
    # the trace says cuBLAS's workspaces are left out; the recorded step's estimate, which
    # to_device gives them, drops that note and only that one
    kept = with_recorded_step(result).notes
    assert CUBLAS_NOTE in result.estimate.notes and CUBLAS_NOTE not in kept
    assert len(kept) == len(result.estimate.notes) - 1


_OUTSIDE = torch.ones(8)  # a real tensor the model reaches through a global


class _Global(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        return self.proj(x) * _OUTSIDE


def test_a_step_neither_estimator_can_run_raises_the_traces_error():
    with pytest.raises(RuntimeError, match=r"cannot trace the step: .* real tensor"):
        estimate(_Global(), batch_size=4, input_shape=(8,), device="cuda")


def test_the_cpu_estimate_of_a_module_stays_the_meta_pass():
    found = estimate(_cnn(8, 1, True), batch_size=4, input_shape=(3, 32, 32), device="cpu")
    assert "method: meta-device pass of Sequential" in found.notes


def test_a_step_a_trace_cannot_take_keeps_the_meta_pass_and_says_why():
    model = _cnn(8, 1, False)
    found = estimate(
        model, batch_size=4, input_shape=(3, 32, 32), device="cuda", trainable_params=100
    )
    method = next(n for n in found.notes if n.startswith("method:"))
    assert method.startswith("method: meta-device pass of Sequential (not traced:"), method
    assert "trainable_params" in method
    assert found.outline is None


@pytest.mark.slow
def test_a_vision_config_on_cuda_is_traced():
    transformers = pytest.importorskip("transformers")
    config = transformers.ResNetConfig(
        embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic"
    )
    found = estimate(config, batch_size=8, input_shape=(3, 64, 64), device="cuda")
    assert any("ResNetForImageClassification traced" in n for n in found.notes), found.notes
    placed = to_device(found, gpu="RTX 3060")
    assert placed.oom_line is not None
    assert placed.device_needed <= placed.device_total


@pytest.mark.parametrize(
    "step",
    [{"mode": "inference", "dtype": "bf16"}, {"precision": "bf16-true"}, {"precision": "16-true"}],
    ids=str,
)
def test_a_16_bit_step_feeds_16_bit_inputs_to_its_trace(step):
    found = estimate(_cnn(8, 1, True), batch_size=4, input_shape=(3, 32, 32), device="cuda", **step)
    method = next(n for n in found.notes if n.startswith("method:"))
    assert "traced on fake tensors" in method, method
    assert isinstance(found.outline, RecordedStep)
