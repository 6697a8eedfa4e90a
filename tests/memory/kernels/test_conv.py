"""oneDNN convolution rules against the real calls they describe (CPU, float32).

Each case runs one ``aten.convolution`` / ``aten.convolution_backward`` for real under
`measure_peak` and compares the rule's bytes with the call's peak above its outputs.
"""

import pytest
import torch

from torchfit.memory.kernels.cpu import CpuRules, cpu_block
from torchfit.memory.kernels.onednn import backward_scratch
from torchfit.memory.kernels.onednn_scratchpad import reducer_bytes
from torchfit.memory.measure import measure_peak


@pytest.mark.parametrize(
    ("x", "w", "out", "stride", "padding", "mask", "measured"),
    [
        # measured peak above the outputs (torch 2.13, AVX-512, 2 threads)
        ((4, 1, 16, 16), (16, 1, 3, 3), (4, 16, 8, 8), (2, 2), (1, 1), (False, True, True), 37_696),
        ((2, 8, 14, 14), (8, 8, 5, 5), (2, 8, 7, 7), (2, 2), (2, 2), (True, True, True), 70_992),
        (
            (2, 16, 21, 21),
            (8, 16, 5, 5),
            (2, 8, 21, 21),
            (1, 1),
            (2, 2),
            (True, True, False),
            159_680,
        ),
        ((5, 8, 12, 12), (8, 8, 5, 5), (5, 8, 12, 12), (1, 1), (2, 2), (True, True, True), 88_288),
        # brgconv_strided on a wide input: grad_output buffers past 4096 elements a thread
        (
            (5, 8, 25, 25),
            (32, 8, 3, 3),
            (5, 32, 13, 13),
            (2, 2),
            (1, 1),
            (True, True, True),
            248_368,
        ),
        # gemm:jit backward-weights (kernel taller than the input)
        ((4, 8, 4, 4), (32, 8, 5, 5), (4, 32, 4, 4), (1, 1), (2, 2), (True, True, True), 230_656),
    ],
)
def test_onednn_backward_scratch_matches_measured_calls(x, w, out, stride, padding, mask, measured):
    # a pure function of the shapes: AVX-512's 16-channel blocks hold on any machine
    assert backward_scratch(x, w, out, stride, mask, padding=padding, threads=2) == measured


# Channels-last convolution backward (oneDNN's nxc kernels), measured live against the
# rule: depthwise 7x7 (jit:avx512_core weights, 16x16-blocked per group), depthwise 3x3
# (jit_dw weights), dense strided (brgconv_strided), with and without the copies ATen
# makes of an NCHW grad_output or weight.
@pytest.mark.parametrize(
    ("x", "w", "stride", "padding", "groups", "nchw_grad", "nchw_weight"),
    [
        ((8, 64, 8, 8), (64, 1, 7, 7), (1, 1), (3, 3), 64, False, False),
        ((4, 16, 9, 9), (16, 1, 5, 5), (1, 1), (2, 2), 16, True, False),
        ((8, 64, 8, 8), (64, 1, 3, 3), (2, 2), (1, 1), 64, False, False),
        ((8, 32, 16, 16), (32, 1, 3, 3), (1, 1), (1, 1), 32, False, False),
        ((8, 32, 16, 16), (64, 32, 2, 2), (2, 2), (0, 0), 1, True, True),
        ((3, 16, 13, 13), (32, 16, 3, 3), (2, 2), (1, 1), 1, False, False),
    ],
)
def test_channels_last_conv_backward_matches_the_real_call(
    x, w, stride, padding, groups, nchw_grad, nchw_weight
):
    if cpu_block() != 16:
        pytest.skip("AVX-512 kernels; on AVX2 see avx2_calls.py (run by test_isa_kinds)")
    aten = torch.ops.aten
    torch.manual_seed(0)
    inp = torch.randn(x).contiguous(memory_format=torch.channels_last)
    weight = torch.randn(w)
    if not nchw_weight:
        weight = weight.contiguous(memory_format=torch.channels_last)
    out = aten.convolution(inp, weight, None, stride, padding, [1, 1], False, [0, 0], groups)
    grad = torch.randn(out.shape)
    if not nchw_grad:
        grad = grad.contiguous(memory_format=torch.channels_last)
    args = (grad, inp, weight, [w[0]], stride, padding, [1, 1], False, [0, 0], groups, [True] * 3)
    call = aten.convolution_backward.default
    call(*args)  # warm oneDNN's primitive cache
    real = measure_peak(call, *args, device="cpu")
    outputs = sum(t.numel() * t.element_size() for t in real.value)
    rules = CpuRules(threads=torch.get_num_threads(), block=cpu_block())
    assert rules(call, args, {}, real.value) == real.peak - outputs


# Grouped and depthwise convolutions, forward and backward, against the real calls:
# each case names the kernels ONEDNN_VERBOSE showed (backward-data / backward-weights).
@pytest.mark.parametrize(
    ("x", "w", "stride", "groups", "channels_last", "grad_input"),
    [
        ((3, 8, 16, 16), (8, 1, 3, 3), 1, 8, False, True),  # jit_dw / jit_dw
        ((3, 16, 11, 11), (16, 1, 7, 7), 1, 16, False, True),  # jit_dw / gemm:jit
        ((5, 24, 13, 13), (24, 1, 5, 5), 2, 24, False, True),  # jit_dw / gemm:jit
        ((4, 8, 6, 6), (32, 4, 5, 5), 1, 2, False, True),  # jit:avx512_core 4b / gemm:jit
        ((4, 24, 10, 10), (8, 6, 3, 3), 1, 4, False, True),  # gemm:jit / gemm:jit
        ((6, 16, 11, 11), (32, 8, 3, 3), 1, 2, False, True),  # jit:avx512_core 8b / jit:avx2
        ((4, 32, 10, 10), (32, 16, 3, 3), 2, 2, False, True),  # jit:avx512_core 16b
        ((5, 8, 24, 24), (48, 4, 1, 1), 2, 2, False, True),  # brgconv_strided:avx512_core
        ((2, 8, 13, 13), (48, 2, 3, 3), 2, 4, False, True),  # brgconv_strided:avx2
        ((5, 8, 19, 19), (32, 4, 3, 3), 1, 2, True, True),  # channels-last jit:avx512_core
        ((4, 16, 13, 13), (48, 8, 3, 3), 2, 2, True, True),  # channels-last brgconv_strided
        ((4, 3, 20, 20), (8, 3, 3, 3), 1, 1, True, False),  # channels-last first conv
    ],
)
def test_grouped_conv_calls_match_the_real_calls(x, w, stride, groups, channels_last, grad_input):
    if cpu_block() != 16:
        pytest.skip("AVX-512 kernels; on AVX2 see avx2_calls.py (run by test_isa_kinds)")
    aten = torch.ops.aten
    torch.manual_seed(0)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    inp, weight = torch.randn(x).contiguous(memory_format=fmt), torch.randn(w)
    weight = weight.contiguous(memory_format=fmt)
    pad, rules = [w[2] // 2] * 2, CpuRules(threads=torch.get_num_threads(), block=cpu_block())
    forward = (inp, weight, torch.randn(w[0]), [stride] * 2, pad, [1, 1], False, [0, 0], groups)
    call = aten.convolution.default
    call(*forward)
    real = measure_peak(call, *forward, device="cpu")
    if groups > 1:  # a dense channels-last forward (brg_conv_fwd) is not modelled yet
        assert rules(call, forward, {}, real.value) == real.peak - _nbytes_of(real.value)
    grad = torch.randn(real.value.shape).contiguous(memory_format=fmt)
    mask = [grad_input, True, True]
    args = (grad, inp, weight, [w[0]], [stride] * 2, pad, [1, 1], False, [0, 0], groups, mask)
    call = aten.convolution_backward.default
    call(*args)
    real = measure_peak(call, *args, device="cpu")
    assert rules(call, args, {}, real.value) == real.peak - _nbytes_of(real.value)


def _nbytes_of(value):
    tensors = value if isinstance(value, tuple) else (value,)
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def test_onednn_reducer_splits_over_the_minibatch_only_when_it_pays():
    # one job, a minibatch of 5: two threads each reduce part, one private buffer
    # (6,400 B of partial sums + a page of alignment) + one barrier (8 KiB)
    assert reducer_bytes(2, 1600, 1, 5, 1 << 21) == (6400 + 4096) + 8192
    # two jobs for two threads: no shared reduction, no scratchpad
    assert reducer_bytes(2, 576, 2, 6, 1 << 21) == 0
