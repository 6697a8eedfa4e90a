"""The pieces both integrations share: options, sample batches, RNGs, the fallback."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from torchfit._core.rng import kept_rng
from torchfit.integrations.search import Samples, SearchPlan, check_search_options, run_search
from torchfit.memory import MemoryEstimate, simulate_gpu
from torchfit.memory.batch import Margin


def pad(samples):
    """A padding collator: every row padded to the longest in the batch."""
    longest = max(len(s) for s in samples)
    return torch.tensor([s + [0] * (longest - len(s)) for s in samples])


def test_a_batch_starts_with_the_largest_early_sample_so_padding_sees_it():
    lengths = [3, 5, 2, 40, 7, 1]
    data = [list(range(n)) for n in lengths]
    samples = Samples(data, pad)
    assert samples.length == 6
    assert pad([data[0], data[1]]).shape == (2, 5)  # the first two alone: short padding
    assert samples.batch(2).shape == (2, 40)  # the longest sample leads every batch
    assert samples.batch(8).shape == (8, 40)  # cycled past the end
    assert samples.batch(8)[:, 0].tolist() == [0] * 8


def test_samples_from_an_iterable_dataset_and_dict_samples():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            for n in range(1, 5):
                yield {"input_ids": torch.ones(n), "label": 1}

    samples = Samples(Stream(), lambda rows: [len(r["input_ids"]) for r in rows])
    assert samples.length is None
    assert samples.batch(5) == [4, 1, 2, 3, 4]


def test_an_empty_dataset_is_refused():
    with pytest.raises(ValueError, match="the training dataset is empty"):
        Samples([], list)


def test_rngs_are_kept():
    before = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())  # noqa: NPY002
    with kept_rng():
        torch.randn(3)
        random.random()  # noqa: S311
        np.random.rand()  # noqa: NPY002
    after = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())  # noqa: NPY002
    assert torch.equal(before[0], after[0]) and before[1] == after[1]
    assert np.array_equal(before[2], after[2])


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        (
            {"budget": "12 parsecs"},
            ValueError,
            r"^X\(budget='12 parsecs'\): cannot read '12 parsecs'",
        ),
        ({"budget": object()}, TypeError, r"^X\(budget=<object.*expected bytes"),
        ({"budget": float("nan")}, ValueError, r"^X\(budget=nan\): a budget must be more than 0"),
        ({"margin": Margin(0.1), "batch_limit": True}, TypeError, r"batch_limit=True"),
    ],
)
def test_options_are_checked_with_the_value_and_the_fix(options, error, message):
    with pytest.raises(error, match=message):
        check_search_options("X", **{"budget": None, "margin": None, **options})


def test_good_options_pass():
    check_search_options("X", budget="8GiB", margin=Margin(0.2, reserve=1), batch_limit=64)
    check_search_options("X", budget="RTX 4090", margin=0.1)
    check_search_options("X", budget=simulate_gpu("1MiB"), margin=None)


def _plan(trace, steps):
    net = torch.nn.Linear(64, 64)

    def step(batch_size, _accumulation=1):
        steps.append(batch_size)
        net(torch.randn(batch_size, 64)).sum().backward()

    return SearchPlan(
        owner="X",
        step=step,
        trace=trace,
        restore=(net,),
        device=torch.device("cpu"),
        start=4,
        cap=10_000,
    )


def test_a_prediction_is_verified_by_one_real_step():
    steps = []
    per_sample = 64 * 4 * 2  # input and output rows

    def trace(batch_size):
        return MemoryEstimate(weights=64 * 65 * 4 * 2, activations=batch_size * per_sample)

    with simulate_gpu("1MiB"):
        result = run_search(_plan(trace, steps), budget=None, margin=0.1)
    assert steps == [result.predicted]
    assert result.ooms == 0


def test_an_untraceable_step_falls_back_to_real_steps_with_a_warning():
    steps = []

    def trace(batch_size):
        raise RuntimeError("aten.nonzero has an output shape that depends on data")

    with simulate_gpu("1MiB"), pytest.warns(RuntimeWarning, match="nonzero.*from batch 4 upward"):
        result = run_search(_plan(trace, steps), budget=None, margin=None)
    assert result.predicted is None
    assert steps[0] == 4
    assert result.batch_size > 4
    with pytest.warns(RuntimeWarning, match="from batch 4 down"):  # nothing to measure
        result = run_search(_plan(trace, []), budget="1MiB", margin=None)
    assert result.batch_size == 4


def test_errors_of_the_step_itself_pass_through():
    def trace(batch_size):
        raise KeyError("input_ids")

    with simulate_gpu("1MiB"), pytest.raises(KeyError, match="input_ids"):
        run_search(_plan(trace, []), budget=None, margin=None)
