"""A probe leaves what the user owns as it found it: RNGs, weights, optimizer state,
grads, training modes, ``requires_grad``, files.

`max_batch_size` and `find_batch_size` run user code (a predictor, a step) that may
draw random numbers or change the model; after them, Python's ``random``, NumPy's
global generator and torch's CPU generator are where they were (CUDA's in the CUDA
tests), whether the probe returned or raised.
"""

import copy
import random

import numpy as np
import pytest
import torch

from torchfit import memory
from torchfit.memory import MemoryEstimate, find_batch_size, max_batch_size, simulate_gpu

PER_SAMPLE = 4096


def rngs():
    return random.getstate(), np.random.get_state(), torch.get_rng_state()  # noqa: NPY002


def same_rngs(before, after):
    (python, numpy, cpu), (python2, numpy2, cpu2) = before, after
    numpy_same = numpy[0] == numpy2[0] and all(
        np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
        for a, b in zip(numpy[1:], numpy2[1:], strict=True)
    )
    return python == python2 and numpy_same and torch.equal(cpu, cpu2)


def draw():
    """One draw from each global generator, as a data pipeline or model init would."""
    random.random()  # noqa: S311
    np.random.rand()  # noqa: NPY002
    torch.rand(1)


def drawing_predictor(batch_size):
    draw()
    return MemoryEstimate(weights=10**6, activations=batch_size * PER_SAMPLE)


def refusing_predictor(batch_size):
    draw()
    raise ValueError("Expected more than 1 value per channel when training")


def untyped_predictor(batch_size):
    draw()
    return batch_size * PER_SAMPLE


# ---------------------------------------------------------------------------------- RNGs


@pytest.mark.parametrize("budget", ["64MiB", "T4"])  # a card's budget also asks predict(1)
def test_max_batch_size_leaves_every_rng_as_it_was(budget):
    before = rngs()
    assert max_batch_size(drawing_predictor, budget) > 0
    assert same_rngs(before, rngs())


@pytest.mark.parametrize(
    ("predictor", "error", "message"),
    [(refusing_predictor, ValueError, "predict was refused at batch size 1"),
     (untyped_predictor, TypeError, "a predictor must return a torchfit MemoryEstimate")],
)  # fmt: skip
def test_max_batch_size_leaves_every_rng_as_it_was_when_it_raises(predictor, error, message):
    before = rngs()
    with pytest.raises(error, match=message):
        max_batch_size(predictor, "64MiB")
    assert same_rngs(before, rngs())


def _step_that(outcome):
    def step(batch_size):
        draw()
        if outcome == "bug":
            raise ValueError("a bug in the step")
        if outcome == "never fits" or batch_size > 40:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB.")
        return batch_size

    return step


@pytest.mark.parametrize("outcome", ["fits below 40", "bug", "never fits"])
@pytest.mark.parametrize("predicted", [False, True])
def test_find_batch_size_leaves_every_rng_as_it_was(outcome, predicted):
    options = {"predict": drawing_predictor, "budget": "1GiB"} if predicted else {"start": 100}
    search = find_batch_size(_step_that(outcome), **options)
    before = rngs()
    if outcome == "fits below 40":
        assert 36 <= search().batch_size <= 40
    else:
        with pytest.raises((ValueError, torch.OutOfMemoryError)):
            search()
    assert same_rngs(before, rngs())


def test_find_batch_size_leaves_every_rng_as_it_was_when_the_predictor_raises():
    search = find_batch_size(_step_that("fits below 40"), predict=refusing_predictor, budget="1GiB")
    before = rngs()
    with pytest.raises(ValueError, match="predict was refused"):
        search()
    assert same_rngs(before, rngs())


def test_each_prediction_starts_from_the_callers_rng():
    # A predictor that sizes by a random draw gives the same answer on every call.
    def noisy(batch_size):
        return MemoryEstimate(activations=batch_size * int(PER_SAMPLE * (1 + torch.rand(1))))

    assert len({max_batch_size(noisy, "64MiB") for _ in range(3)}) == 1


# ------------------------------------------------------------ the model and its optimizer


def _model():
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.BatchNorm1d(64), torch.nn.Dropout(0.2),
        torch.nn.Linear(64, 4),
    )  # fmt: skip
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    net(torch.randn(8, 32)).sum().backward()
    opt.step()  # AdamW state to keep, and grads left in place
    net.eval()
    net[3].weight.requires_grad_(False)  # a frozen layer
    return net, opt


def owned(net, opt):
    return {
        "state": {k: v.clone() for k, v in net.state_dict().items()},
        "grads": [None if p.grad is None else p.grad.clone() for p in net.parameters()],
        "training": [m.training for m in net.modules()],
        "requires_grad": [p.requires_grad for p in net.parameters()],
        "params": [id(p) for p in net.parameters()],
        "optimized": [id(p) for group in opt.param_groups for p in group["params"]],
        "opt": copy.deepcopy(opt.state_dict()),
    }


def same(a, b):
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.device == b.device and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _training_step(net, opt, *, fail_with=None):
    def step(batch_size):
        net.train()
        for param in net.parameters():
            param.requires_grad_(True)  # unfreezes what the user froze
        net(torch.randn(batch_size, 32)).square().mean().backward()
        opt.step()
        if fail_with is not None:
            raise fail_with
        if batch_size > 24:
            torch.empty(batch_size * 10**4)  # out of memory on the card below

    return step


@pytest.mark.parametrize("fail_with", [None, ValueError("a bug after the optimizer step")])
def test_find_batch_size_restores_the_model_and_optimizer_it_is_given(
    fail_with, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    net, opt = _model()
    before, rng = owned(net, opt), rngs()
    search = find_batch_size(
        _training_step(net, opt, fail_with=fail_with), start=64, restore=(net, opt)
    )
    with simulate_gpu("1MiB", track=(net, opt)):
        if fail_with is None:
            assert search().ooms >= 1
        else:
            with pytest.raises(ValueError, match="a bug"):
                search()
    assert same(before, owned(net, opt))
    assert same_rngs(rng, rngs())
    assert list(tmp_path.iterdir()) == []  # no checkpoint file, unlike Lightning's


def test_a_restored_tensor_keeps_its_requires_grad():
    weight = torch.zeros(4, requires_grad=False)

    def step(batch_size):
        weight.requires_grad_(True)
        (weight * batch_size).sum().backward()

    find_batch_size(step, start=2, restore=weight)()
    assert not weight.requires_grad
    assert weight.grad is None


@pytest.mark.parametrize("predictor", ["estimate", "trace of random inputs"])
def test_max_batch_size_leaves_the_model_it_predicts_for_as_it_was(
    predictor, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    net, opt = _model()
    before, rng = owned(net, opt), rngs()

    def predict(batch_size):
        if predictor == "estimate":
            return memory.estimate(
                net, batch_size=batch_size, input_shape=(32,), optimizer="adamw", device="cpu"
            )
        inputs = torch.randn(batch_size, 32)  # the caller's RNG, drawn by a prediction
        return memory.trace(net, inputs, optimizer="adamw", device="cpu")

    assert max_batch_size(predict, "64MiB") > 0
    assert same(before, owned(net, opt))
    assert same_rngs(rng, rngs())
    assert list(tmp_path.iterdir()) == []
