"""accelerate's tests of ``find_executable_batch_size``, asked of `find_batch_size`.

Each test restates one of accelerate's (tests/test_memory_utils.py, class MemoryTest,
named in a comment above it) in torchfit's terms: the step takes the batch size first,
the search returns a `BatchSizeResult`, and options are checked when the search is
built. accelerate multiplies the size by 0.9 after each out-of-memory error and asserts
that exact sequence; torchfit backs off by its own rule, so these tests assert what a
user relies on instead: the size that runs is found, no size is tried twice, and the
search takes no more steps than accelerate's. Its tests of a custom
``reduce_batch_size_fn`` become tests of the two decorator forms (torchfit has no such
callable), and ``test_release_memory`` needs an accelerator (not restated).
"""

import pytest
import torch

from torchfit.memory import find_batch_size
from torchfit.memory.batch import DEFAULT_START, TrialOutcome

# accelerate's sizes from 128 to 8 at x0.9 a step: the steps it takes to find 8.
ACCELERATE_STEPS_TO_8 = 23


def fake_oom(device="cuda"):
    """An out-of-memory error as accelerate's tests fake it: a RuntimeError in the words
    of the device ("CUDA out of memory.", "XPU out of memory.", ...)."""
    raise RuntimeError(f"{device.upper()} out of memory.")


def only(size, tried, device="cuda"):
    """A step that runs at ``size`` alone, recording every size it is called with."""

    def step(batch_size, *args):
        tried.append(batch_size)
        if batch_size != size:
            fake_oom(device)
        return (batch_size, *args)

    return step


def assert_found_alone(result, tried, size, start=128):
    assert result.batch_size == size
    assert tried[0] == start
    assert len(tried) == len(set(tried)), tried  # no size tried twice
    assert len(tried) <= ACCELERATE_STEPS_TO_8, tried
    assert [t.batch_size for t in result.trials] == tried
    oks = [t.batch_size for t in result.trials if t.outcome is TrialOutcome.OK]
    assert oks == [size]


# MemoryTest.test_memory_implicit (the fake error named after each device accelerate runs on)
@pytest.mark.parametrize("device", ["cuda", "xpu", "npu", "mps", "hpu", "cpu"])
def test_a_size_that_runs_below_sizes_that_do_not_is_found(device):
    tried = []
    result = find_batch_size(only(8, tried, device), start=128)()
    assert_found_alone(result, tried, 8)


# MemoryTest.test_memory_explicit
def test_the_step_gets_its_own_arguments_and_its_value_comes_back():
    tried = []
    search = find_batch_size(only(8, tried), start=128)
    result = search("hello")
    assert_found_alone(result, tried, 8)
    assert result.returned == (8, "hello")


# MemoryTest.test_default_back_off_is_unchanged (no options: accelerate's start, 128)
def test_the_default_search_finds_the_size_that_runs():
    tried = []

    @find_batch_size
    def step(batch_size):
        return only(8, tried)(batch_size)

    result = step()
    assert DEFAULT_START == 128
    assert_found_alone(result, tried, 8)


# MemoryTest.test_memory_implicit, with the one size that runs elsewhere on
# accelerate's path down from 128 (sizes its x0.9 steps reach)
@pytest.mark.parametrize("size", [13, 9, 5, 3, 1])
def test_any_size_accelerate_reaches_below_16_is_found(size):
    tried = []
    result = find_batch_size(only(size, tried), start=128)()
    assert_found_alone(result, tried, size)


# MemoryTest.test_start_zero
def test_a_start_of_zero_is_refused_when_the_search_is_built():
    with pytest.raises(ValueError, match="start must be >= 1; got 0"):
        find_batch_size(lambda batch_size: None, start=0)


# MemoryTest.test_approach_zero
def test_when_no_size_runs_the_error_says_so():
    tried = []

    def step(batch_size):
        tried.append(batch_size)
        fake_oom()

    with pytest.raises(RuntimeError, match="found no batch size that fits") as caught:
        find_batch_size(step, start=16)()
    assert isinstance(caught.value, torch.OutOfMemoryError)
    assert 1 in tried
    assert len(tried) == len(set(tried))
    assert all(f"{size} (oom)" in str(caught.value) for size in tried)


# MemoryTest.test_verbose_guard
def test_passing_the_batch_size_yourself_is_refused_with_the_fix():
    def step(batch_size, arg1, arg2):
        fake_oom()

    search = find_batch_size(step, start=128)
    with pytest.raises(TypeError, match="passes the first 1 itself; call it without them"):
        search(128, "hello", "world")


# MemoryTest.test_any_other_error
def test_an_error_that_is_not_out_of_memory_passes_through():
    error = ValueError("Oops, we had an error!")
    calls = []

    def step(batch_size):
        calls.append(batch_size)
        raise error

    with pytest.raises(ValueError, match="Oops") as caught:
        find_batch_size(step, start=16)()
    assert caught.value is error
    assert calls == [16]


def _over_16(tried):
    def step(batch_size):
        tried.append(batch_size)
        if batch_size > 16:
            fake_oom()
        return batch_size

    return step


# MemoryTest.test_reduce_batch_size_fn_is_used_by_the_decorator
def test_the_decorator_with_arguments_keeps_them():
    tried = []

    @find_batch_size(start=256, batch_limit=200)
    def step(batch_size):
        return _over_16(tried)(batch_size)

    result = step()
    assert tried[0] == 200  # start=256 capped: neither option was dropped
    assert result.batch_size == 16


# MemoryTest.test_reduce_batch_size_fn_matches_the_direct_call
def test_the_decorator_and_the_direct_call_agree():
    by_decorator, direct = [], []
    first = find_batch_size(start=256)(_over_16(by_decorator))()
    second = find_batch_size(_over_16(direct), start=256)()
    assert by_decorator == direct
    assert first.batch_size == second.batch_size == 16
