"""oneDNN's bf16 weight-gradient GEMM on AMX against the real calls."""

import pytest
import torch

from torchfit.memory.kernels.cpu import workspace_rules
from torchfit.memory.kernels.machine import CpuMachine, this_cpu
from torchfit.memory.kernels.onednn_matmul import transposed_a_scratch
from torchfit.memory.measure import measure_peak

aten = torch.ops.aten

# (M, K, N) of mm(A.t(), B): a Linear's weight gradient grad.t() @ x, the first the
# Linear(256, 8) of tests/memory/test_measure.py's autocast step; the others cover the
# blocking heuristic's branches (K blocks and tails, M and N tails, chunking, small N).
SHAPES = [
    (8, 1024, 256),
    (256, 1024, 64),
    (64, 34, 128),
    (24, 2000, 48),
    (100, 513, 200),
    (300, 3, 1000),
    (1024, 256, 256),
    (5, 100, 8),
]


@pytest.mark.parametrize(("m", "k", "n"), SHAPES)
@pytest.mark.parametrize("threads", [1, 2])
def test_weight_gradient_gemm_scratch_matches_the_real_call(m, k, n, threads):
    machine = this_cpu()
    if not machine.amx:
        pytest.skip("oneDNN's AMX matmul: this CPU has no AMX tiles")
    torch.manual_seed(0)
    a = torch.randn(k, m).bfloat16().t()  # column-major, as mm_mat2_backward passes it
    b = torch.randn(k, n).bfloat16()
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        aten.mm.default(a, b)  # warm oneDNN's primitive cache
        real = measure_peak(aten.mm.default, a, b, device="cpu")
        rules = workspace_rules("cpu")
        assert rules(aten.mm.default, (a, b), {}, real.value) == real.increment - real.end
    finally:
        torch.set_num_threads(saved)


def test_the_model_follows_threads_and_caches():
    base = transposed_a_scratch(256, 1024, 64, threads=2, l1=48 * 1024, l2=2 * 1024**2)
    assert transposed_a_scratch(256, 1024, 64, threads=1, l1=48 * 1024, l2=2 * 1024**2) < base
    assert transposed_a_scratch(4, 8, 16, threads=2, l1=48 * 1024, l2=2 * 1024**2) == 0
    # a smaller L2 gives smaller K chunks: the copies of A and B shrink
    small = transposed_a_scratch(1024, 4096, 1024, threads=2, l1=48 * 1024, l2=1024**2)
    large = transposed_a_scratch(1024, 4096, 1024, threads=2, l1=48 * 1024, l2=2 * 1024**2)
    assert small < large


def test_only_amx_bf16_transposed_a_gets_the_gemm_rule():
    a = torch.empty(1024, 256, dtype=torch.bfloat16, device="meta").t()
    b = torch.empty(1024, 64, dtype=torch.bfloat16, device="meta")
    amx = CpuMachine(threads=2, block=16, amx=True, avx512_bf16=True, l1=48 * 1024, l2=2**21)
    plain = CpuMachine(threads=2, block=16, avx512_bf16=True, l1=48 * 1024, l2=2**21)
    from torchfit.memory.kernels.matmul import mm

    assert mm(amx, (a, b), {}, None) == 1083136
    assert mm(plain, (a, b), {}, None) == 0  # no AMX: oneDNN's other kernels, not modelled
    assert mm(amx, (a.float(), b.float()), {}, None) == 0  # float32: MKL, reads in place
    assert mm(amx, (a.t().contiguous(), b), {}, None) == 0  # a plain A: not modelled
