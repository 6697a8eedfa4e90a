"""oneDNN's AVX2 1x1, NCHW depthwise and biased convolutions against the real calls.

Not collected by default (no ``test_`` prefix): `test_avx2_kernels` runs this file in a
subprocess with ``ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2``. Each case names the
kernels ``ONEDNN_VERBOSE`` showed (torch 2.13.0+cpu, oneDNN v3.12): forward /
backward-data / backward-weights; the rule must match each call to the byte.
"""

import pytest
import torch

from torchfit.memory.kernels.cpu import workspace_rules
from torchfit.memory.kernels.machine import CpuKind, this_cpu
from torchfit.memory.measure import measure_peak

aten = torch.ops.aten

_ALL = (True, True, False)
_WEIGHTS = (False, True, False)
CASES = [
    # jit_1x1 (rtus) / brgconv_strided / jit_1x1 (rtus): 4 channel blocks per copy
    ((8, 32, 8, 8), (64, 32, 1, 1), (2, 2), _ALL),
    ((8, 32, 8, 8), (64, 32, 1, 1), (2, 2), _WEIGHTS),
    # a 3-channel source, padded to 8 and blocked for the copy
    ((4, 3, 8, 8), (16, 3, 1, 1), (2, 2), _ALL),
    ((4, 12, 8, 8), (16, 12, 1, 1), (2, 2), _WEIGHTS),
    ((2, 64, 12, 8), (24, 64, 1, 1), (2, 1), _ALL),
    # 32 input blocks cut to 8 per copy; one reducer thread per job: no weight copies
    ((2, 256, 8, 8), (512, 256, 1, 1), (2, 2), _ALL),
    ((2, 128, 8, 8), (256, 128, 1, 1), (2, 2), _WEIGHTS),
    # the stride does not divide the input: no copy, jit:avx2 everywhere
    ((4, 32, 7, 7), (64, 32, 1, 1), (2, 2), _ALL),
    # unit stride, jit_1x1: the reducer alone
    ((8, 512, 4, 4), (128, 512, 1, 1), (1, 1), _ALL),
]


def test_the_process_dispatches_avx2():
    assert this_cpu().kind is CpuKind.AVX2


@pytest.mark.parametrize(("x", "w", "stride", "mask"), CASES)
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_avx2_1x1_conv_matches_the_real_calls(x, w, stride, mask, threads):
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        inp, weight = torch.randn(x), torch.randn(w)
        forward = (inp, weight, None, list(stride), [0, 0], [1, 1], False, [0, 0], 1)
        conv = aten.convolution.default
        conv(*forward)  # warm oneDNN's primitive cache
        real = measure_peak(conv, *forward, device="cpu")
        rules = workspace_rules("cpu")
        assert rules.threads == threads
        out_bytes = real.value.numel() * real.value.element_size()
        assert rules(conv, forward, {}, real.value) == real.peak - out_bytes
        grad = torch.randn(real.value.shape)
        args = (grad, inp, weight, None, *forward[3:8], 1, list(mask))
        call = aten.convolution_backward.default
        call(*args)
        real = measure_peak(call, *args, device="cpu")
        outputs = sum(t.numel() * t.element_size() for t in real.value if t is not None)
        assert rules(call, args, {}, real.value) == real.peak - outputs
    finally:
        torch.set_num_threads(saved)


# NCHW depthwise, forward with a bias: jit_dw:avx2 / jit_dw:avx2 / jit_dw:avx2 (kw <= 3)
# or gemm:jit (kw > 3); a bias of 20 channels is padded to 24 in the forward scratchpad.
DEPTHWISE = [
    ((4, 32, 4, 4), (32, 1, 7, 7), 3),  # ConvNeXt's 7x7 over a 4x4 image
    ((4, 16, 8, 8), (16, 1, 7, 7), 3),
    ((3, 8, 16, 16), (8, 1, 3, 3), 1),
    ((4, 20, 9, 9), (20, 1, 5, 5), 2),
]


@pytest.mark.parametrize(("x", "w", "pad"), DEPTHWISE)
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_avx2_nchw_depthwise_matches_the_real_calls(x, w, pad, threads):
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        inp, weight, bias = torch.randn(x), torch.randn(w), torch.randn(w[0])
        groups = x[1]
        forward = (inp, weight, bias, [1, 1], [pad, pad], [1, 1], False, [0, 0], groups)
        conv = aten.convolution.default
        conv(*forward)
        real = measure_peak(conv, *forward, device="cpu")
        rules = workspace_rules("cpu")
        out_bytes = real.value.numel() * real.value.element_size()
        assert rules(conv, forward, {}, real.value) == real.peak - out_bytes
        grad = torch.randn(real.value.shape)
        args = (grad, inp, weight, [w[0]], *forward[3:8], groups, [True, True, True])
        call = aten.convolution_backward.default
        call(*args)
        real = measure_peak(call, *args, device="cpu")
        outputs = sum(t.numel() * t.element_size() for t in real.value if t is not None)
        assert rules(call, args, {}, real.value) == real.peak - outputs
    finally:
        torch.set_num_threads(saved)
