"""Batch-size inputs that once answered silently wrong or failed from deep inside.

Each is refused with a ValueError/TypeError that names the parameter, the value and
what was expected, before any step runs.
"""

import math

import pytest

from torchfit.memory import MemoryEstimate, find_batch_size, max_batch_size, simulate_gpu
from torchfit.memory.result import AffineEstimate

LINE = AffineEstimate(MemoryEstimate(weights=1000), MemoryEstimate(activations=10))


def never_called(batch_size):
    raise AssertionError(f"a refused search ran a step at {batch_size}")


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"budget": 0}, ValueError, r"budget must be more than 0 bytes; got 0.*budget='8GiB'"),
        ({"budget": "0GB"}, ValueError, r"budget must be more than 0 bytes"),
        ({"max_trials": math.nan}, TypeError, r"max_trials must be a whole number; got nan"),
        ({"max_trials": "3"}, TypeError, r"max_trials must be a whole number; got '3'"),
        ({"max_trials": 0}, ValueError, r"max_trials must be >= 1; got 0"),
    ],
)
def test_find_batch_size_refuses_before_any_step(options, error, message):
    # budget=0 once reported batch 1 under a 0-byte budget; max_trials=nan an OOM
    # saying no size fits, though none was tried.
    with pytest.raises(error, match=message):
        find_batch_size(never_called, start=4, **options)()


@pytest.mark.parametrize(
    ("sizes", "error", "message"),
    [
        ([2.5], TypeError, r"batch_sizes\[0\] must be a whole number >= 1; got 2.5"),
        ([8, 0], ValueError, r"batch_sizes\[1\] must be a whole number >= 1; got 0"),
        ([], ValueError, r"batch_sizes must be a non-empty list or tuple; got \[\]"),
    ],
)
def test_max_batch_size_refuses_sizes_that_are_not_batches(sizes, error, message):
    with pytest.raises(error, match=message):  # [2.5] once answered 2.5
        max_batch_size(LINE, "1MB", batch_sizes=sizes)


def test_a_card_filled_before_any_tensor_is_a_value_error_not_an_oom():
    # Once an OOM that blamed tracked tensors which did not exist.
    with pytest.raises(ValueError, match=r"used='2GB' \(1.86 GiB\) leaves nothing of the"):
        simulate_gpu("1GB", used="2GB")
    with pytest.raises(ValueError, match=r"used=.*pass used= below the capacity"):
        simulate_gpu("1GB", used="1GB")
