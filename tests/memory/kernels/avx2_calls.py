"""oneDNN's AVX2 convolution kernels against the real calls (run under AVX2 dispatch).

Not collected by default (no ``test_`` prefix): `test_isa_kinds` runs this file in a
subprocess with ``ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2``, so an AVX-512
machine checks the AVX2 rules too. Each case names the kernels ``ONEDNN_VERBOSE``
showed (torch 2.13.0+cpu, oneDNN v3.12); the rule must match the call to the byte.
"""

import pytest
import torch

from torchfit.memory.kernels.cpu import workspace_rules
from torchfit.memory.kernels.machine import CpuKind, this_cpu
from torchfit.memory.measure import measure_peak

aten = torch.ops.aten


def test_the_process_dispatches_avx2():
    assert this_cpu().kind is CpuKind.AVX2
    assert torch.backends.cpu.get_cpu_capability() == "AVX2"


@pytest.mark.parametrize(
    ("x", "w", "stride", "groups", "channels_last", "mask"),
    [
        ((8, 256, 4, 4), (256, 256, 3, 3), 1, 1, False, (True, True, False)),  # jit:avx2
        ((2, 8, 14, 14), (8, 8, 5, 5), 2, 1, False, (True, True, True)),  # brgconv_strided
        ((4, 1, 14, 14), (16, 1, 5, 5), 1, 1, False, (False, True, False)),  # ic 1, padded
        ((8, 3, 24, 24), (16, 3, 3, 3), 2, 1, False, (False, True, True)),  # flat ic 3
        ((8, 32, 8, 8), (16, 32, 1, 1), 1, 1, False, (True, True, False)),  # jit_1x1:avx2
        ((4, 96, 8, 8), (96, 1, 7, 7), 1, 96, True, (True, True, True)),  # jit_dw / jit:avx2
    ],
)
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_avx2_conv_backward_matches_the_real_call(
    x, w, stride, groups, channels_last, mask, threads
):
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        inp = torch.randn(x).contiguous(memory_format=fmt)
        weight = torch.randn(w).contiguous(memory_format=fmt)
        pad = [w[2] // 2] * 2
        out = aten.convolution(inp, weight, None, [stride] * 2, pad, [1, 1], False, [0, 0], groups)
        grad = torch.randn(out.shape).contiguous(memory_format=fmt)
        bias = [w[0]] if mask[2] else None
        args = (
            grad,
            inp,
            weight,
            bias,
            [stride] * 2,
            pad,
            [1, 1],
            False,
            [0, 0],
            groups,
            list(mask),
        )
        call = aten.convolution_backward.default
        call(*args)  # warm oneDNN's primitive cache
        real = measure_peak(call, *args, device="cpu")
        outputs = sum(t.numel() * t.element_size() for t in real.value if t is not None)
        rules = workspace_rules("cpu")
        assert rules.threads == threads
        assert rules(call, args, {}, real.value) == real.peak - outputs
    finally:
        torch.set_num_threads(saved)


def test_a_basic_block_resnet_traces_exactly():
    transformers = pytest.importorskip("transformers")
    from torchfit.memory import measure_step, trace
    from torchfit.memory.catalog import build_model

    config = transformers.ResNetConfig(
        embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic", num_labels=10
    )
    torch.manual_seed(0)
    model = build_model(config, device="cpu", dtype="fp32")
    inputs = torch.randn(4, 3, 32, 32)
    measured = measure_step(model, inputs, optimizer="sgd", device="cpu").peak
    # before the AVX2 rules: -8.1% (the reorders-only rule of a jit:avx2 backward)
    assert trace(model, inputs, optimizer="sgd").total == measured
