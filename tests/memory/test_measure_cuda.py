"""measure_peak on real CUDA: the allocator's statistics, checked against known programs."""

import pytest
import torch

from torchfit.memory import measure_peak, measure_step
from torchfit.memory.measure import live_bytes

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _rounded(nbytes: int) -> int:
    return -(-nbytes // 512) * 512  # the caching allocator's 512-byte blocks


@pytest.mark.parametrize("sizes", [[1000, 500], [4096, 1, 3 * 2**20], [10, 20, 30]])
def test_peak_of_sequential_allocations_is_their_rounded_sum(sizes):
    def program():
        held = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in sizes]
        del held

    m = measure_peak(program, device="cuda")
    assert m.peak == sum(_rounded(n) for n in sizes)
    assert m.end == 0
    assert m.reserved is not None
    assert m.reserved >= m.peak


def test_tracked_cuda_tensors_are_counted_in_blocks():
    w = torch.zeros(1000, device="cuda")  # 4000 bytes -> one 4096-byte block
    m = measure_peak(lambda: torch.ones(10, device="cuda"), track=w)
    assert m.tracked == _rounded(4000)
    assert m.peak == m.tracked + 512


def test_measure_step_on_cuda_leaves_the_model_untouched():
    model = torch.nn.Linear(256, 256).cuda()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(32, 256, device="cuda")
    m = measure_step(model, x, optimizer="adamw")
    assert m.device == "cuda"
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert m.peak > live_bytes(model)
