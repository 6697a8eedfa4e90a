"""oneDNN's bf16 convolution backward-weights on AMX against the real calls."""

import pytest
import torch

from torchfit.memory.kernels.cpu import workspace_rules
from torchfit.memory.kernels.machine import this_cpu
from torchfit.memory.kernels.onednn_amx_conv import Conv2d, weights_scratchpad
from torchfit.memory.measure import measure_peak

aten = torch.ops.aten

# (input, weight, stride, padding): ViT's patch embedding (tests/memory/tracing/test_trace.py),
# a ResNet stem, a ConvNeXt stem, small first layers, a 1x1 run as a 1-d convolution,
# 17/33 channels (padded blocks), a 16x16 patch with a 1x1 output.
CASES = [
    ((2, 3, 16, 16), (64, 3, 4, 4), 4, 0),
    ((4, 3, 32, 32), (64, 3, 7, 7), 2, 3),
    ((8, 3, 24, 24), (96, 3, 4, 4), 4, 0),
    ((4, 1, 32, 32), (16, 1, 3, 3), 1, 1),
    ((3, 8, 28, 28), (48, 8, 5, 5), 1, 2),
    ((2, 16, 14, 14), (24, 16, 1, 1), 1, 0),
    ((2, 17, 20, 20), (33, 17, 3, 3), 2, 1),
    ((2, 3, 16, 16), (32, 3, 16, 16), 16, 0),
]


@pytest.mark.parametrize(("x", "w", "stride", "padding"), CASES)
@pytest.mark.parametrize("strided_grad", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
def test_bf16_weight_gradient_matches_the_real_call(x, w, stride, padding, strided_grad, threads):
    if not this_cpu().amx:
        pytest.skip("oneDNN's AMX convolution: this CPU has no AMX tiles")
    torch.manual_seed(0)
    inp, weight = torch.randn(x).bfloat16(), torch.randn(w).bfloat16()
    conv = (inp, weight, None, [stride] * 2, [padding] * 2, [1, 1], False, [0, 0], 1)
    grad = torch.randn(aten.convolution.default(*conv).shape).bfloat16()
    if strided_grad:  # as a flatten(2).transpose(1, 2) downstream hands it back
        grad = grad.contiguous(memory_format=torch.channels_last)
    args = (grad, inp, weight, [w[0]], *conv[3:9], [False, True, True])
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        call = aten.convolution_backward.default
        call(*args)  # warm oneDNN's primitive cache
        real = measure_peak(call, *args, device="cpu")
        outputs = sum(t.numel() * t.element_size() for t in real.value if t is not None)
        assert workspace_rules("cpu")(call, args, {}, real.value) == real.peak - outputs
    finally:
        torch.set_num_threads(saved)


def test_the_scratchpad_grows_with_threads_and_leaves_special_splits_out():
    vit = Conv2d(mb=2, ic=3, oc=64, ih=16, iw=16, kh=4, kw=4, sh=4, sw=4, ph=0, pw=0)
    one = weights_scratchpad(vit, bias=True, threads=1, l2=2 * 1024**2)
    two = weights_scratchpad(vit, bias=True, threads=2, l2=2 * 1024**2)
    assert one is not None and two is not None and one < two
    assert weights_scratchpad(vit, bias=False, threads=2, l2=2 * 1024**2) < two
    cubic = Conv2d(mb=1, ic=64, oc=64, ih=8, iw=8, kh=3, kw=3, sh=1, sw=1, ph=1, pw=1)
    assert weights_scratchpad(cubic, bias=True, threads=2, l2=2 * 1024**2) is None
