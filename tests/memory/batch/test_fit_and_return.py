"""A predictor fitted from the sizes the model accepts, and the step's own return value."""

import pytest
import torch
from accelerate.utils import find_executable_batch_size
from hypothesis import given
from hypothesis import strategies as st

from torchfit import memory
from torchfit.memory import MemoryEstimate, find_batch_size, max_batch_size, simulate_gpu
from torchfit.memory.batch.fit import fit_sizes, solve_callable
from torchfit.memory.batch.predict import Margin


def batchnorm_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.BatchNorm1d(256), torch.nn.ReLU(),
        torch.nn.Linear(256, 8),
    )  # fmt: skip


def test_batchnorm_refuses_batch_1_in_training():
    # The control: what the predictor once was fitted from.
    net = batchnorm_net()
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        memory.trace(net, torch.randn(1, 64))


def test_max_batch_size_fits_a_batchnorm_model_from_sizes_it_accepts():
    net = batchnorm_net()
    calls = []

    def predict(batch_size):
        calls.append(batch_size)
        return memory.trace(net, torch.randn(batch_size, 64))

    best = max_batch_size(predict, "64MiB")
    assert calls[:3] == [1, 2, 3]  # 1 refused, then the line through 2 and 3
    assert predict(best).total <= (1 - Margin().fraction) * 64 * 2**20 < predict(best + 1).total
    assert net.training  # the probe left the model as it was


def test_find_batch_size_says_which_sizes_the_line_came_from():
    net = batchnorm_net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)

    def step(batch_size):
        net(torch.randn(batch_size, 64)).square().mean().backward()
        opt.step()
        opt.zero_grad()

    def predict(batch_size):
        return memory.trace(net, torch.randn(batch_size, 64), optimizer="sgd")

    with simulate_gpu("16MiB", track=(net, opt)):
        result = find_batch_size(step, predict=predict, restore=(net, opt))()
    assert result.fitted_from == (2, 3)
    assert "predictor fitted at batch sizes 2 and 3" in str(result)
    assert result.to_dict()["fitted_from"] == [2, 3]
    assert result.batch_size >= 2


def test_a_predictor_refused_everywhere_is_explained():
    def predict(batch_size):
        raise RuntimeError(f"shape '[-1, 7]' is invalid for input of size {batch_size}")

    with pytest.raises(ValueError, match=r"refused at batch size 1 \(RuntimeError: shape") as info:
        max_batch_size(predict, "1GiB")
    assert isinstance(info.value.__cause__, RuntimeError)


def test_a_wrong_result_is_not_skipped_as_a_refusal():
    with pytest.raises(TypeError, match=r"predict\(1\) returned int"):
        max_batch_size(lambda b: 3, "1GiB")


def test_sizes_below_the_first_accepted_are_never_the_answer():
    def predict(batch_size):
        if batch_size % 4:
            raise RuntimeError("the reshape needs a multiple of 4")
        return MemoryEstimate(weights=1000, activations=100 * batch_size)

    (totals, line) = fit_sizes(predict)
    assert line.fitted_from == (4, 8)
    assert totals == (1400, 1800)
    assert max_batch_size(predict, 2000, margin=0.0, batch_sizes=[1, 2, 4, 8]) == 8
    assert max_batch_size(predict, 1200, margin=0.0, batch_sizes=[1, 2, 4]) == 0


@given(
    fixed=st.integers(0, 10**6),
    linear=st.integers(1, 10**4),
    square=st.integers(0, 300),
    step=st.integers(0, 5 * 10**5),
    at=st.integers(2, 400),
    usable=st.integers(10**4, 10**8),
)
def test_the_callable_answer_is_the_largest_size_within_the_budget(
    fixed, linear, square, step, at, usable
):
    # monotone and not affine (a quadratic part, a jump at a drawn size): the refitted line
    # and the search around it find what a scan finds, and ask no size twice
    def bytes_at(b):
        return fixed + linear * b + square * b * b + (step if b >= at else 0)

    asked = []

    def predict(b):
        asked.append(b)
        return MemoryEstimate(weights=fixed, activations=bytes_at(b) - fixed)

    if bytes_at(1) > usable:
        assert solve_callable(predict, usable, None)[0] == 0
        return
    expected = 1
    while bytes_at(expected + 1) <= usable:
        expected += 1
    assert solve_callable(predict, usable, None)[0] == expected
    assert len(asked) == len(set(asked))


# -- the step's own return value (porting from accelerate) ----------------------------------


def test_the_step_return_value_is_kept_like_accelerate_s():
    limit = 40

    def train(batch_size, epochs):
        if batch_size > limit:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB.")
        return {"batch_size": batch_size, "epochs": epochs, "loss": 0.5}

    theirs = find_executable_batch_size(train, starting_batch_size=64)(3)
    ours = find_batch_size(train, start=64)(3)
    assert theirs == {"batch_size": 40, "epochs": 3, "loss": 0.5}  # 64, 57, 51, 45, 40
    assert ours.returned == {"batch_size": ours.batch_size, "epochs": 3, "loss": 0.5}
    assert 0.9 * limit <= ours.batch_size <= limit
    assert "the step returned {'batch_size'" in str(ours)
    assert "returned" not in ours.to_dict()


def test_the_returned_value_is_from_the_largest_size_that_ran():
    def step(batch_size):
        with torch.no_grad():
            return torch.empty(batch_size * 1024).numel()

    with simulate_gpu("1MiB"):
        result = find_batch_size(step, start=1000)()
    sizes = [t.batch_size for t in result.trials if str(t.outcome) == "ok"]
    assert result.returned == max(sizes) * 1024
    assert result.batch_size <= max(sizes)


def test_nothing_returned_is_none():
    result = find_batch_size(lambda b: None, start=4)()
    assert result.returned is None
    assert "the step returned" not in str(result)
