"""The back-off after out-of-memory errors: fast while memory grows with the batch, and
no size given up on while one may still run.

Steps here raise CUDA's out-of-memory error by rule, with no card to measure them (what
the search sees of a cuDNN refusal or an error from another process), except where a
`simulate_gpu` card measures a model that cannot fit at all.
"""

from unittest import mock

import pytest
import torch

from torchfit.memory import find_batch_size, simulate_gpu


def rule(runs, tried):
    def step(batch_size):
        tried.append(batch_size)
        if not runs(batch_size):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB.")
        return batch_size

    return step


@pytest.fixture(autouse=True)
def _no_gc():
    # Each OOM collects garbage (0.1-0.3 s here); these steps leave nothing to collect.
    with mock.patch("gc.collect"):
        yield


@pytest.mark.parametrize("start", [128, 1000, 4096])
def test_when_memory_grows_with_the_batch_any_limit_is_found_within_10_percent(start):
    # Every limit up to 40, then every 40th size: the default max_trials (25) suffices
    # from a start 4096 times the limit (12 gave up on 1 and missed 23 of these).
    limits = [*range(1, 41), *range(41, start + 1, 40)]
    steps = {}
    for limit in limits:
        tried = []
        result = find_batch_size(rule(lambda b, limit=limit: b <= limit, tried), start=start)()
        assert limit / 1.1 <= result.batch_size <= limit, (limit, tried)
        steps[limit] = len(tried)
    # The walk back costs nothing here: the sizes shrinking skipped are never tried.
    assert max(steps.values()) <= {128: 11, 1000: 14, 4096: 16}[start], steps


def test_a_size_the_halving_skipped_is_walked_back_to():
    # Only 8 runs (accelerate's test): the halving went 11, 5, 2, 1; the walk back
    # tries what it skipped, smallest first, then what lies between 8 and 11.
    tried = []
    result = find_batch_size(rule(lambda b: b == 8, tried), start=128)()
    assert tried == [128, 89, 44, 22, 11, 5, 2, 1, 3, 4, 6, 7, 8, 9]
    assert result.batch_size == 8
    assert [t.reason for t in result.trials][8:] == ["back-off"] * 5 + ["bisect"]


def test_the_walk_back_closes_the_gap_above_the_size_it_finds():
    # 13 to 16 run, all else fails: after 13 the bracket is 13 to 22 (the next failure
    # above it, not the failure at 1 below), and closing it finds 16.
    tried = []
    result = find_batch_size(rule(lambda b: 13 <= b <= 16, tried), start=128)()
    assert result.batch_size == 16
    assert all(b > 13 for b in tried[tried.index(13) + 1 :])


def test_when_nothing_runs_max_trials_bounds_the_walk_back():
    tried = []
    with pytest.raises(torch.OutOfMemoryError, match="found no batch size that fits"):
        find_batch_size(rule(lambda b: False, tried), start=128, max_trials=15)()
    assert len(tried) == 15
    assert len(set(tried)) == 15
    assert tried[8:] == [3, 4, 6, 7, 8, 9, 10]


def test_a_model_the_card_cannot_hold_is_not_walked_back():
    # Measured: the OOM at 128 shows what a sample costs, 1 fails past the card too, so
    # the line explains both and no skipped size is tried.
    resident = torch.empty(900 * 1024 // 4)
    tried = []

    def step(batch_size):
        tried.append(batch_size)
        torch.empty(batch_size * 64 * 1024)  # 256 KiB a sample

    refused = pytest.raises(torch.OutOfMemoryError, match=r"tried 128 \(oom\), 1 \(oom\)\)")
    with simulate_gpu("1MiB", track=resident), refused:
        find_batch_size(step, start=128)()
    assert tried == [128, 1]


def test_only_sizes_below_the_start_are_walked_back_to():
    tried = []
    with pytest.raises(torch.OutOfMemoryError):
        find_batch_size(rule(lambda b: False, tried), start=6)()
    assert sorted(tried) == [1, 2, 3, 4, 5, 6]  # each once, then it gives up
