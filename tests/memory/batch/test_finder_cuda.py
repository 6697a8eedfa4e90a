"""The finder and the predictor on real CUDA: its generators kept, real OOMs backed off.

The card is capped with ``torch.cuda.set_per_process_memory_fraction`` (this process's
allocator only; the cap is lifted after each test), so CUDA's own allocator raises the
out-of-memory errors and its statistics are what the search measures.
"""

import contextlib
import random

import numpy as np
import pytest
import torch

from torchfit.memory import MemoryEstimate, find_batch_size, max_batch_size

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

MiB = 2**20


@contextlib.contextmanager
def capped(nbytes):
    """This process may allocate about ``nbytes`` on the card (the allocator's cap)."""
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(nbytes / total)
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()


def rngs():
    return (
        random.getstate(),
        np.random.get_state()[1].copy(),  # noqa: NPY002
        torch.get_rng_state(),
        torch.cuda.get_rng_state_all(),
    )


def same(a, b):
    return (
        a[0] == b[0]
        and np.array_equal(a[1], b[1])
        and torch.equal(a[2], b[2])
        and all(torch.equal(x, y) for x, y in zip(a[3], b[3], strict=True))
    )


def test_cuda_generators_are_kept_by_a_prediction_and_a_search():
    torch.rand(1, device="cuda")  # CUDA initialized: its generators are the caller's

    def predict(batch_size):
        torch.rand(8, device="cuda")
        return MemoryEstimate(weights=MiB, activations=batch_size * MiB)

    def step(batch_size):
        torch.randn(batch_size, 16, device="cuda")
        if batch_size > 40:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB.")

    before = rngs()
    assert max_batch_size(predict, "1GiB") > 0
    assert same(before, rngs())
    assert 36 <= find_batch_size(step, predict=predict, budget="1GiB")().batch_size <= 40
    assert same(before, rngs())

    def broken(batch_size):
        torch.randn(batch_size, device="cuda")
        raise ValueError("a bug in the step")

    with pytest.raises(ValueError, match="a bug"):
        find_batch_size(broken, start=8)()
    assert same(before, rngs())


def test_real_out_of_memory_errors_end_within_10_percent():
    per_sample = 8 * MiB
    cap = 1024 * MiB

    def step(batch_size):
        held = torch.empty(batch_size * per_sample, dtype=torch.uint8, device="cuda")
        del held

    with capped(cap):
        result = find_batch_size(step, start=1000, budget=cap, margin=0.0)()
    best = cap // per_sample
    assert 0.9 * best <= result.batch_size <= best, result
    assert result.real_steps <= 16


def test_a_model_the_capped_card_cannot_hold_is_not_walked_back():
    cap = 512 * MiB
    tried = []

    def step(batch_size):
        tried.append(batch_size)
        held = torch.empty((batch_size + 1) * cap, dtype=torch.uint8, device="cuda")
        del held

    with capped(cap), pytest.raises(torch.OutOfMemoryError, match="found no batch size"):
        find_batch_size(step, start=128, budget=cap)()
    assert len(tried) <= 3, tried  # measured: no skipped size is tried
