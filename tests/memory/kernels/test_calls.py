"""One set of rules: the analytic pass asks them what the tracer asks, per layer."""

import pytest
import torch
from torch import nn

from torchfit.memory.kernels.calls import CallRecorder, KernelCall, scratch_of
from torchfit.memory.modules.saved import activation_bytes
from torchfit.memory.tracing.tracer import trace_events

transformers = pytest.importorskip("transformers")


def _convnext():
    config = transformers.ConvNextConfig(
        hidden_sizes=[16, 32], depths=[1, 1], num_stages=2, num_labels=3
    )
    torch.manual_seed(0)
    return transformers.ConvNextForImageClassification(config), torch.randn(2, 3, 32, 32)


def _grouped():
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 24, 3, padding=1),
        nn.BatchNorm2d(24),
        nn.ReLU(),
        nn.Conv2d(24, 24, 5, padding=2, groups=24),
        nn.GroupNorm(4, 24),
        nn.GELU(),
        nn.Conv2d(24, 48, 3, stride=2, padding=1, groups=4),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(48, 10),
    ).to(memory_format=torch.channels_last)
    return net, torch.randn(3, 3, 14, 14)


def _traced_scratch(result, phase):
    """The largest scratch the tracer charged, per module, in one phase."""
    found: dict[str, int] = {}
    for storage in result.storages:
        if storage.phase == phase and storage.op.endswith(" scratch"):
            name = storage.module.split(" (")[0]
            found[name] = max(found.get(name, 0), storage.raw)
    return found


@pytest.mark.parametrize("build", [_convnext, _grouped], ids=["convnext", "grouped"])
def test_each_layer_gets_the_scratch_the_tracer_charges_it(build):
    model, inputs = build()
    traced = trace_events(model, inputs, optimizer="sgd")
    report = activation_bytes(model, inputs, device="cpu", kernel_calls=True)
    for phase, calls_of in (
        ("forward", lambda record: record.forward_calls),
        ("backward", lambda record: record.backward_calls),
    ):
        expected = _traced_scratch(traced, phase)
        analytic = {r.name: scratch_of(calls_of(r), "cpu") for r in report.records}
        analytic = {name: value for name, value in analytic.items() if value}
        assert analytic == expected, phase
    assert any(r.backward_calls for r in report.records)


def test_calls_are_recorded_only_when_asked_and_backward_only_in_training():
    model, inputs = _grouped()
    plain = activation_bytes(model, inputs, device="cpu")
    assert not any(r.forward_calls or r.backward_calls for r in plain.records)
    inference = activation_bytes(model, inputs, device="cpu", training=False, kernel_calls=True)
    assert any(r.forward_calls for r in inference.records)
    assert not any(r.backward_calls for r in inference.records)


def test_the_first_convolution_computes_no_input_gradient():
    model, inputs = _grouped()
    report = activation_bytes(model, inputs, device="cpu", kernel_calls=True)
    masks = [
        list(call.args[10])
        for record in report.records
        for call in record.backward_calls
        if call.func is torch.ops.aten.convolution_backward.default
    ]
    assert masks[0] == [False, True, True]  # the stem (records in forward order)
    assert len(masks) == 3
    assert all(mask[0] for mask in masks[1:])


def test_scratch_of_takes_the_largest_call_and_nothing_without_rules():
    x = torch.empty(8, 24, 5, 5, device="meta")
    small = KernelCall(torch.ops.aten.native_batch_norm.default, (x,), {}, None)
    grad = KernelCall(torch.ops.aten.native_batch_norm_backward.default, (x, x), {}, None)
    assert scratch_of([small], "cpu") == 2 * 24 * 4
    assert scratch_of([small, grad], "cpu") == 8 * 24 * 5 * 5 * 4
    assert scratch_of([small, grad], "cuda") == 0
    assert scratch_of([], "cpu") == 0


def test_the_recorder_keeps_ruled_calls_under_their_label():
    labels = iter(["first", "second"])
    recorder = CallRecorder(lambda: next(labels))
    x = torch.empty(2, 4, device="meta")
    with recorder:
        y = torch.relu(x)  # no rule: not recorded, no label asked
        torch.mm(y, x.t())
        torch.mm(x, y.t())
    assert sorted(recorder.calls) == ["first", "second"]
    assert all(c.func is torch.ops.aten.mm.default for c in recorder.calls["first"])
