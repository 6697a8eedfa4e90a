"""Output layouts of fake and meta kernels corrected to the CPU kernel's."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from torchfit.memory.kernels.layout import cpu_layout, cpu_twin
from torchfit.memory.tracing.ops import match_cpu_layout

aten = torch.ops.aten


def test_batch_norm_backward_gets_the_cpu_kernels_layout():
    bn_backward = aten.native_batch_norm_backward.default

    def grad_input(make):
        x = make(torch.randn(2, 8, 5, 5)).contiguous(memory_format=torch.channels_last)
        g = make(torch.randn(2, 8, 5, 5))  # a plain-layout gradient coming in
        stats = [make(torch.ones(8)) for _ in range(5)]
        args = (g, x, *stats, True, 1e-5, [True, True, True])
        return match_cpu_layout(bn_backward, args, bn_backward(*args))[0].stride()

    real = grad_input(lambda t: t)
    fake_mode = FakeTensorMode()
    with fake_mode:
        fake = grad_input(fake_mode.from_tensor)
    meta = grad_input(lambda t: t.to("meta"))
    assert fake == real == meta == (200, 1, 40, 8)


@pytest.mark.parametrize(
    ("x", "w", "groups", "input_layout", "weight_layout"),
    [
        ((2, 8, 6, 6), (16, 8, 3, 3), 1, torch.channels_last, torch.contiguous_format),
        ((2, 8, 6, 6), (16, 8, 3, 3), 1, torch.contiguous_format, torch.channels_last),
        ((2, 16, 6, 6), (16, 1, 7, 7), 16, torch.channels_last, torch.contiguous_format),
        ((2, 8, 6, 6), (16, 8, 3, 3), 1, torch.contiguous_format, torch.contiguous_format),
        ((1, 4, 5, 5), (8, 4, 3, 3), 1, torch.channels_last, torch.contiguous_format),
    ],
)
def test_meta_convolutions_get_the_cpu_kernels_layout(x, w, groups, input_layout, weight_layout):
    torch.manual_seed(0)
    inp = torch.randn(x).contiguous(memory_format=input_layout)
    weight = torch.randn(w).contiguous(memory_format=weight_layout)
    pad = [w[2] // 2] * 2
    forward = (inp, weight, None, [1, 1], pad, [1, 1], False, [0, 0], groups)
    real = aten.convolution.default(*forward)
    grad = torch.randn(real.shape).contiguous(memory_format=input_layout)
    backward = (grad, inp, weight, [w[0]], [1, 1], pad, [1, 1], False, [0, 0], groups, [True] * 3)
    real_grads = aten.convolution_backward.default(*backward)

    def meta(args):
        return tuple(a.to("meta") if isinstance(a, torch.Tensor) else a for a in args)

    out = cpu_layout(aten.convolution.default, meta(forward), aten.convolution(*meta(forward)))
    assert out.stride() == real.stride()
    grads = aten.convolution_backward.default(*meta(backward))
    grads = cpu_layout(aten.convolution_backward.default, meta(backward), grads)
    assert [g.stride() for g in grads[:2]] == [g.stride() for g in real_grads[:2]]


def test_cpu_twins_are_fake_and_keep_strides():
    meta = torch.empty(3, 4, 5, 6, device="meta").contiguous(memory_format=torch.channels_last)
    twin = cpu_twin(meta)
    assert twin.device.type == "cpu"
    assert twin.stride() == meta.stride()
    assert type(twin).__name__ == "FakeTensor"  # nothing allocated
    real = torch.ones(2)
    assert cpu_twin(real) is real
