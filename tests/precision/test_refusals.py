"""The mixed-precision inputs that once trained silently wrong or failed from deep inside.

Each is refused with a ValueError/TypeError naming the parameter, the value and what was
expected, before any weight moves.
"""

import math

import pytest
import torch

from torchfit.precision import MixedPrecision


def after_backward(dtype="bf16"):
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 2)
    mp = MixedPrecision(dtype, device="cpu")
    with mp.autocast():
        loss = net(torch.randn(3, 4)).float().square().mean()
    mp.backward(loss)
    return mp, net, torch.optim.SGD(net.parameters(), lr=0.1)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"clip_grad_norm": math.nan}, ValueError, r"clip_grad_norm must be a finite .*; got nan"),
        ({"clip_grad_norm": -1.0}, ValueError, r"clip_grad_norm must be a finite .*> 0; got -1.0"),
        ({"optimizers": None}, ValueError, r"optimizers must be one optimizer .*; got None; pass"),
        ({"optimizers": []}, ValueError, r"optimizers must be one optimizer .*; got \[\]"),
    ],
)  # fmt: skip
def test_bad_step_arguments_move_nothing(dtype, kwargs, error, message):
    mp, net, opt = after_backward(dtype)
    before = [p.detach().clone() for p in net.parameters()]
    with pytest.raises(error, match=message):
        mp.step(**{"optimizers": opt, **kwargs})
    assert all(torch.equal(p, q) for p, q in zip(net.parameters(), before, strict=True))
    assert (mp.optimizer_steps, mp.skipped_steps) == (0, 0)


def test_step_without_optimizer_is_refused_inside_a_window_too():
    net = torch.nn.Linear(4, 2)
    mp = MixedPrecision("bf16", device="cpu", accumulate=4)
    mp.backward(net(torch.randn(3, 4)).mean())
    with pytest.raises(ValueError, match="optimizers must be"):
        mp.step(None)  # once reported ACCUMULATED: a window that could never step
    assert mp.micro_step == 0


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"init_scale": math.inf}, ValueError, r"init_scale must be a finite number > 0; got inf"),
        ({"growth_factor": math.inf}, ValueError, r"growth_factor must be a finite .*; got inf"),
        ({"growth_interval": 2.5}, TypeError, r"growth_interval must be a whole .*; got 2.5"),
        ({"growth_interval": math.nan}, TypeError, r"growth_interval must be a whole .*; got nan"),
        ({"device": "tpu"}, ValueError, r"device must be a torch.device or a string .*; got 'tpu'"),
        ({"skip_nonfinite": True}, ValueError, r"skip_nonfinite=True is not .*'loss', 'grads'"),
    ],
)  # fmt: skip
def test_bad_construction(kwargs, error, message):
    with pytest.raises(error, match=message):
        MixedPrecision("fp16", **{"device": "cpu", **kwargs})


@pytest.mark.parametrize(
    ("weight", "message"),
    [(-1.0, r"weight must be a finite number > 0; got -1.0; a micro-batch"),
     (math.nan, r"weight must be a finite number > 0; got nan")],
)  # fmt: skip
def test_bad_weight_runs_no_backward(weight, message):
    net = torch.nn.Linear(4, 2)
    mp = MixedPrecision("bf16", device="cpu")
    with pytest.raises(ValueError, match=message):
        mp.backward(net(torch.randn(3, 4)).mean(), weight=weight)
    assert all(p.grad is None for p in net.parameters())


@pytest.mark.parametrize("model", ["net", torch.nn.Linear, None])
def test_check_needs_a_module(model):
    with pytest.raises(TypeError, match=r"model must be an nn.Module; got"):
        MixedPrecision("bf16", device="cpu").check(model)
