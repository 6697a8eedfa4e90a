"""oneDNN's AVX2 kernels: 1x1 convolutions (strided source copy, weight reducer), NCHW depthwise.

The pure rules are checked here on any machine against figures measured under AVX2
dispatch (torch 2.13.0+cpu, oneDNN v3.12, an AMD EPYC capped with
``ONEDNN_MAX_CPU_ISA=AVX2``); `avx2_kernel_calls.py` checks them live against the real
calls in a subprocess wherever the CPU has AVX2.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tests.memory.kernels.test_isa_kinds import _AVX2_ENV, _needs_avx2

from torchfit.memory.kernels.cpu import CpuRules
from torchfit.memory.kernels.onednn import ConvBackward, backward_scratch
from torchfit.memory.kernels.onednn_1x1 import rtus_applies, rtus_scratch, weights_reducer
from torchfit.memory.kernels.onednn_groups import depthwise_scratch

aten = torch.ops.aten


@pytest.mark.parametrize(
    ("x", "out", "stride", "padding", "applies"),
    [
        ((8, 32, 8, 8), (8, 64, 4, 4), (2, 2), (0, 0), True),
        ((2, 64, 12, 8), (2, 24, 6, 8), (2, 1), (0, 0), True),
        ((8, 32, 7, 7), (8, 64, 4, 4), (2, 2), (0, 0), False),  # 4 * 2 != 7
        ((8, 32, 8, 8), (8, 64, 5, 5), (2, 2), (1, 1), False),  # padded
        ((8, 32, 8, 8), (8, 64, 8, 8), (1, 1), (0, 0), False),  # unit stride: no copy
    ],
)
def test_the_copy_applies_only_where_onednn_makes_it(x, out, stride, padding, applies):
    assert rtus_applies(x, out, (1, 1), stride, padding) is applies
    assert rtus_applies(x, out, (3, 3), stride, padding) is False


def test_the_copy_holds_fewer_blocks_for_backward_weights():
    # 256 channels = 32 blocks: forward copies all 32, backward-weights 32 -> 16 -> 8
    assert rtus_scratch(256, 16, threads=2, weights=False) == 2 * 32 * 16 * 8 * 4 + 128
    assert rtus_scratch(256, 16, threads=2, weights=True) == 2 * 8 * 16 * 8 * 4 + 128
    # 88 channels = 11 blocks: neither halved nor divided by 3
    assert rtus_scratch(88, 16, threads=1, weights=True) == 11 * 16 * 8 * 4 + 128


@pytest.mark.parametrize(
    ("x", "w", "out", "stride", "mask", "threads", "measured"),
    [
        # measured under AVX2 dispatch, peak above the outputs
        ((8, 32, 8, 8), (64, 32, 1, 1), (8, 64, 4, 4), (2, 2), (True, True, False), 1, 122_880),
        ((8, 32, 8, 8), (64, 32, 1, 1), (8, 64, 4, 4), (2, 2), (False, True, False), 1, 100_480),
        ((8, 32, 8, 8), (64, 32, 1, 1), (8, 64, 4, 4), (2, 2), (True, True, False), 2, 127_232),
        ((8, 32, 8, 8), (64, 32, 1, 1), (8, 64, 4, 4), (2, 2), (False, True, False), 3, 137_472),
        ((4, 3, 8, 8), (16, 3, 1, 1), (4, 16, 4, 4), (2, 2), (False, True, False), 2, 23_104),
        ((2, 88, 8, 8), (16, 88, 1, 1), (2, 16, 4, 4), (2, 2), (False, True, False), 2, 78_080),
        ((2, 256, 8, 8), (512, 256, 1, 1), (2, 512, 4, 4), (2, 2), (True, True, False), 3, 524_288),
        ((4, 32, 7, 7), (64, 32, 1, 1), (4, 64, 4, 4), (2, 2), (True, True, False), 2, 114_736),
        (
            (8, 512, 4, 4),
            (128, 512, 1, 1),
            (8, 128, 4, 4),
            (1, 1),
            (True, True, False),
            3,
            1_122_432,
        ),
        ((4, 64, 16, 16), (32, 64, 1, 1), (4, 32, 16, 16), (1, 1), (True, True, False), 2, 417_920),
    ],
)
def test_avx2_1x1_backward_matches_measured_calls(x, w, out, stride, mask, threads, measured):
    scratch = backward_scratch(x, w, out, stride, mask, padding=(0, 0), threads=threads, block=8)
    assert scratch == measured


def test_a_strided_1x1_the_stride_does_not_divide_runs_jit_avx2():
    conv = ConvBackward(
        (4, 32, 7, 7), (64, 32, 1, 1), (4, 64, 4, 4), (2, 2), padding=(0, 0), threads=2, block=8
    )
    assert conv.weights_kernel() == "avx2"
    copying = ConvBackward(
        (4, 32, 8, 8), (64, 32, 1, 1), (4, 64, 4, 4), (2, 2), padding=(0, 0), threads=2, block=8
    )
    assert copying.weights_kernel() == "1x1"


def test_the_weight_reducer_gives_each_job_a_thread_when_it_can():
    # 16 input blocks -> 8, 32 output blocks: 2 jobs over 2 threads, no copies
    assert weights_reducer(128, 256, 2 * 16, threads=2) == 0
    # one job (8 x 4 blocks): both threads reduce it, a copy each and a barrier
    assert weights_reducer(64, 32, 4 * 256, threads=2) == 2 * 64 * 32 * 4 + 128 + 8192


@pytest.mark.parametrize(
    ("x", "w", "stride", "threads", "measured"),
    [
        ((8, 32, 8, 8), (64, 32, 1, 1), (2, 2), 1, 75_904),
        ((8, 32, 8, 8), (64, 32, 1, 1), (2, 2), 3, 80_000),
        ((4, 3, 8, 8), (16, 3, 1, 1), (2, 2), 2, 9_856),  # the 3-channel source blocked
        ((2, 64, 12, 8), (24, 64, 1, 1), (2, 1), 2, 80_000),
        ((4, 32, 7, 7), (64, 32, 1, 1), (2, 2), 2, 33_280),  # jit:avx2, no copy
    ],
)
def test_avx2_1x1_forward_matches_measured_calls(x, w, stride, threads, measured):
    inp, weight = torch.empty(x, device="meta"), torch.empty(w, device="meta")
    args = (inp, weight, None, list(stride), [0, 0], [1, 1], False, [0, 0], 1)
    out = aten.convolution.default(*args)
    assert CpuRules(threads=threads, block=8)(aten.convolution.default, args, {}, out) == measured


def test_the_copy_is_an_avx2_rule_only():
    inp, weight = torch.empty(8, 32, 8, 8, device="meta"), torch.empty(64, 32, 1, 1, device="meta")
    args = (inp, weight, None, [2, 2], [0, 0], [1, 1], False, [0, 0], 1)
    out = aten.convolution.default(*args)
    avx2 = CpuRules(threads=2, block=8)(aten.convolution.default, args, {}, out)
    avx512 = CpuRules(threads=2, block=16)(aten.convolution.default, args, {}, out)
    blocked = 8 * 32 * 64 * 4 + 64 * 32 * 4 + 8 * 64 * 16 * 4 - 8 * 64 * 16 * 4
    assert avx2 == blocked + 2 * 4 * 16 * 8 * 4 + 128
    assert avx512 == blocked


@pytest.mark.parametrize(
    ("x", "w", "pad", "threads", "measured"),
    [
        # measured under AVX2 dispatch with a bias: jit_dw:avx2 data, gemm:jit weights
        ((4, 64, 2, 2), (64, 1, 7, 7), 3, 2, 102_176),
        ((4, 32, 4, 4), (32, 1, 7, 7), 3, 3, 84_928),
        # jit_dw:avx2 weights, a reduction over the minibatch
        ((3, 8, 16, 16), (8, 1, 3, 3), 1, 2, 49_728),
        ((4, 20, 9, 9), (20, 1, 5, 5), 2, 3, 48_556),
    ],
)
def test_avx2_nchw_depthwise_backward_matches_measured_calls(x, w, pad, threads, measured):
    out = (x[0], x[1], x[2], x[3])
    rule = depthwise_scratch(
        x, w, out, (1, 1), (True, True, True), padding=(pad, pad), threads=threads, block=8
    )
    assert rule == measured


def test_the_avx2_rules_hold_against_the_real_calls():
    """`avx2_kernel_calls.py` in a subprocess under AVX2 dispatch: under a minute."""
    _needs_avx2()
    here = Path(__file__).with_name("avx2_kernel_calls.py")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n0", "-p", "no:cacheprovider", str(here)],
        env={**os.environ, **_AVX2_ENV},
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout
