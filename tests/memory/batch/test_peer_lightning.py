"""Lightning's tests of ``Tuner.scale_batch_size`` and ``BatchSizeFinder``, for `find_batch_size`.

Each test restates one of Lightning's (tests/tests_pytorch/tuner/test_scale_batch_size.py,
named in a comment above it) in torchfit's terms. Lightning's ``mode="power"`` doubles
from ``init_val`` and keeps the last size that ran; ``mode="binsearch"`` then bisects.
torchfit's ``probe_upward=True`` is the search upward (doubling, then bisecting, when
nothing is measured), ``start=`` is ``init_val``, a dataset's length is
``batch_limit=``, and ``max_trials`` counts every real step (Lightning returns its last
doubled size unrun, so its ``max_trials=4`` from 2 is 32, torchfit's ``max_trials=5``).
Lightning restores the model from a temporary checkpoint file; torchfit restores the
objects in ``restore=`` from host copies and writes no file. Tests of the Trainer's own
plumbing (dataloader attributes, loggers, strategies, ``fast_dev_run``) have no
counterpart and are not restated.
"""

import copy
import random

import numpy as np
import pytest
import torch

from torchfit.memory import find_batch_size, simulate_gpu
from torchfit.memory.batch import TrialOutcome

DATASET = 64  # Lightning's RandomDataset(32, 64): the largest batch a loader can give


class Boring(torch.nn.Module):
    """Lightning's BoringModel, with the BatchNorm and Dropout a real model has."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Sequential(
            torch.nn.Linear(32, 32), torch.nn.BatchNorm1d(32), torch.nn.Dropout(0.1),
            torch.nn.Linear(32, 2),
        )  # fmt: skip

    def forward(self, x):
        return self.layer(x)


def setup():
    torch.manual_seed(0)
    model = Boring()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    # One step already taken: momentum buffers and a scheduler count to keep.
    model(torch.randn(4, 32)).sum().backward()
    opt.step()
    sched.step()
    model.eval()
    return model, opt, sched


def make_step(kind, model, opt, sched, limit=None):
    """One step of ``kind`` ("fit", "validate", "test", "predict"); OOM above ``limit``."""

    def step(batch_size):
        if limit is not None and batch_size > limit:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB.")
        x = torch.randn(batch_size, 32)
        if kind == "fit":
            model.train()
            model(x).square().mean().backward()
            opt.step()
            sched.step()
            opt.zero_grad()
            return None
        model.eval()
        context = torch.inference_mode() if kind == "predict" else torch.no_grad()
        with context:
            return model(x).mean().item()

    return step


def owned(model, opt, sched):
    return {
        "state": {k: v.clone() for k, v in model.state_dict().items()},
        "grads": [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        "training": [m.training for m in model.modules()],
        "requires_grad": [p.requires_grad for p in model.parameters()],
        "opt": copy.deepcopy(opt.state_dict()),
        "sched": sched.state_dict(),
        "rng": (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()),  # noqa: NPY002
    }


def same(a, b):
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def doubling(batch_size, ran):
    ran.append(batch_size)


# test_scale_batch_size_method_with_model_or_datamodule (binsearch, init_val=4,
# max_trials=2: Lightning's count of 2 doublings is 3 steps here); its parameters, where
# the batch size is stored, become the two ways to build the search
@pytest.mark.parametrize("form", ["decorator", "plain call"])
def test_three_steps_upward_from_4_reach_16(form):
    ran = []

    def step(batch_size):
        doubling(batch_size, ran)

    options = {"start": 4, "probe_upward": True, "max_trials": 3}
    if form == "decorator":
        search = find_batch_size(**options)(step)
    else:
        search = find_batch_size(step, **options)
    assert search().batch_size == 16
    assert ran == [4, 8, 16]


# test_trainer_reset_correctly[fit|validate|test|predict] (Lightning also checks that no
# temporary checkpoint is left behind)
@pytest.mark.parametrize("kind", ["fit", "validate", "test", "predict"])
def test_the_search_leaves_model_optimizer_and_rngs_as_they_were(kind, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model, opt, sched = setup()
    before = owned(model, opt, sched)
    step = make_step(kind, model, opt, sched, limit=40)
    result = find_batch_size(step, start=2, probe_upward=True, restore=(model, opt, sched))()
    assert 36 <= result.batch_size <= 40
    assert result.ooms >= 1
    assert same(before, owned(model, opt, sched))
    assert list(tmp_path.iterdir()) == []


# test_auto_scale_batch_size_set_model_attribute and
# test_auto_scale_batch_size_set_datamodule_attribute: the size changes from the start
# and stays within the dataset (without a card, and on a card with room to spare)
@pytest.mark.parametrize("card", [None, "64MiB"])
def test_the_size_grows_from_the_start_within_the_dataset(card):
    model, opt, sched = setup()
    step = make_step("fit", model, opt, sched)
    search = find_batch_size(
        step, start=2, probe_upward=True, max_trials=4, batch_limit=DATASET,
        restore=(model, opt, sched),
    )  # fmt: skip
    if card is None:
        result = search()
    else:
        with simulate_gpu(card, track=(model, opt)):
            result = search()
    assert 2 < result.batch_size <= DATASET


# test_call_to_trainer_method[power|binsearch]: the size found then trains
@pytest.mark.parametrize("limit", [None, 20])
def test_the_size_found_then_trains(limit):
    model, opt, sched = setup()
    step = make_step("fit", model, opt, sched, limit=limit)
    result = find_batch_size(
        step, start=2, probe_upward=True, max_trials=5, restore=(model, opt, sched)
    )()
    assert result.batch_size != 2
    assert limit is None or result.batch_size <= limit
    step(result.batch_size)  # runs


# test_scale_batch_size_no_trials (max_trials=0 returns init_val in Lightning; torchfit
# refuses a search of no steps, and max_trials=1 keeps the start when it runs)
def test_no_trials_is_refused_and_one_trial_keeps_the_start():
    with pytest.raises(ValueError, match="max_trials must be >= 1; got 0"):
        find_batch_size(lambda batch_size: None, start=2, max_trials=0)
    ran = []
    result = find_batch_size(lambda b: doubling(b, ran), start=2, probe_upward=True, max_trials=1)()
    assert (result.batch_size, ran) == (2, [2])


# test_scale_batch_size_fails_with_unavailable_mode: a bad option fails when the search
# is built, naming the option
def test_an_unknown_kind_of_option_is_refused_when_the_search_is_built():
    with pytest.raises(TypeError, match=r"start must be a whole number.*; got 'power'"):
        find_batch_size(lambda batch_size: None, start="power")


# test_dataloader_reset_with_scale_batch_size[power|binsearch x init_val 8|17|64]:
# max_trials=2 steps, none past the dataset's length
@pytest.mark.parametrize("card", [None, "64MiB"])
@pytest.mark.parametrize("start", [8, 17, 64])
def test_two_trials_stay_within_the_dataset(start, card):
    model, opt, sched = setup()
    step = make_step("fit", model, opt, sched)
    search = find_batch_size(
        step, start=start, probe_upward=True, max_trials=2, batch_limit=DATASET,
        restore=(model, opt, sched),
    )  # fmt: skip
    if card is None:
        result = search()
    else:
        with simulate_gpu(card, track=(model, opt)):
            result = search()
    assert result.real_steps == (2 if start < DATASET else 1)
    assert all(t.batch_size <= DATASET for t in result.trials)
    assert start < result.batch_size <= DATASET or start == DATASET == result.batch_size


# test_tuner_with_evaluation_methods[validate|test|predict]: doubling from 2, and the
# model's training progress (optimizer steps, scheduler epoch) untouched
@pytest.mark.parametrize("kind", ["validate", "test", "predict"])
def test_evaluation_steps_double_from_2_and_leave_training_alone(kind):
    model, opt, sched = setup()
    before = owned(model, opt, sched)
    step = make_step(kind, model, opt, sched)
    result = find_batch_size(
        step, start=2, probe_upward=True, max_trials=5, restore=(model, opt, sched)
    )()
    assert result.batch_size == 2**5
    assert [t.batch_size for t in result.trials] == [2, 4, 8, 16, 32]
    assert same(before, owned(model, opt, sched))


# test_batch_size_finder_callback[fit|validate|test|predict]: the run after the search is
# the run without it, bit for bit
@pytest.mark.parametrize("kind", ["fit", "validate", "test", "predict"])
def test_the_run_after_the_search_is_the_run_without_it(kind):
    model, opt, sched = setup()
    twin, twin_opt, twin_sched = copy.deepcopy((model, opt, sched))
    for param, copied in zip(model.parameters(), twin.parameters(), strict=True):
        copied.grad = param.grad.clone()  # a Parameter's deepcopy drops its grad
    step = make_step(kind, model, opt, sched, limit=24)
    result = find_batch_size(step, start=2, probe_upward=True, restore=(model, opt, sched))()
    state = torch.get_rng_state()
    after = [step(result.batch_size) for _ in range(2)]
    torch.set_rng_state(state)
    twin_step = make_step(kind, twin, twin_opt, twin_sched, limit=24)
    without = [twin_step(result.batch_size) for _ in range(2)]
    assert after == without
    assert same(model.state_dict(), twin.state_dict())


# test_dataloader_batch_size_updated_on_failure[power-62|binsearch-100]: init_val 500,
# out of memory above 100. Lightning's power mode stops at 62; torchfit's search down
# ends within 10% of 100, and its search upward bisects to 100 exactly (binsearch's
# answer). Lightning's max_trials=10 counts the sizes that ran (its binsearch takes 10
# steps, 5 of them runs); torchfit's counts every step, so the default is kept here.
@pytest.mark.parametrize(("probe_upward", "lowest"), [(False, 91), (True, 100)])
def test_from_500_with_memory_for_100(probe_upward, lowest):
    model, opt, sched = setup()
    step = make_step("fit", model, opt, sched, limit=100)
    result = find_batch_size(
        step, start=500, probe_upward=probe_upward, restore=(model, opt, sched)
    )()
    assert lowest <= result.batch_size <= 100
    assert result.trials[0].outcome is TrialOutcome.OOM
