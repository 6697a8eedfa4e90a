"""The optimizer step fused into backward: the same update as torchtune's loop, bit for bit."""

import copy

import pytest
import torch

from torchfit._core.in_backward import InBackward, fused_if_asked
from torchfit._core.step import Loop, Mode, run_step


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


def _by_hand(net, x, steps):
    """The per-parameter loop written out: one AdamW per parameter, stepped from its hook."""
    opts = {p: torch.optim.AdamW([p], lr=0.01, weight_decay=0.1) for p in net.parameters()}

    def hook(p):
        opts[p].step()
        opts[p].zero_grad()

    handles = [p.register_post_accumulate_grad_hook(hook) for p in net.parameters()]
    for _ in range(steps):
        net(x).pow(2).sum().backward()
    for handle in handles:
        handle.remove()


@pytest.mark.parametrize("steps", [1, 3])
def test_the_update_is_bitwise_the_per_parameter_loop(steps):
    x = torch.randn(4, 8)
    expected, got = _net(), _net()
    _by_hand(expected, x, steps)
    fused = InBackward(torch.optim.AdamW(got.parameters(), lr=0.01, weight_decay=0.1))
    loop = Loop(keep_output=False, optimizer_in_backward=True)
    for _ in range(steps):
        run_step(
            got, x, mode=Mode.TRAIN, optimizer=fused, loss_fn=lambda y: y.pow(2).sum(), loop=loop
        )
    for a, b in zip(expected.parameters(), got.parameters(), strict=True):
        assert torch.equal(a, b)
        assert b.grad is None


def test_each_group_keeps_its_settings_and_existing_state_moves():
    net = _net()
    first, last = net[0], net[2]
    opt = torch.optim.SGD(
        [{"params": first.parameters(), "lr": 0.5}, {"params": last.parameters()}],
        lr=0.01,
        momentum=0.9,
    )
    net(torch.randn(2, 8)).sum().backward()
    opt.step()  # momentum buffers exist now
    fused = InBackward(opt)
    assert fused.per_parameter[first.weight].param_groups[0]["lr"] == 0.5
    assert fused.per_parameter[last.weight].param_groups[0]["lr"] == 0.01
    moved = fused.per_parameter[first.weight].state[first.weight]["momentum_buffer"]
    assert moved is opt.state[first.weight]["momentum_buffer"]


def test_frozen_parameters_get_no_optimizer_and_hooks_leave_with_the_block():
    net = _net()
    net[0].weight.requires_grad_(False)
    fused = InBackward(torch.optim.SGD(net.parameters(), lr=0.1))
    assert net[0].weight not in fused.per_parameter
    with fused.attached():
        net(torch.randn(2, 8)).sum().backward()
    assert net[2].weight.grad is None  # stepped and freed
    net(torch.randn(2, 8)).sum().backward()  # outside the block: plain backward
    assert net[2].weight.grad is not None


def test_the_model_is_stepped_exactly_once_per_backward():
    net, x = _net(), torch.randn(3, 8)
    reference = copy.deepcopy(net)
    fused = InBackward(torch.optim.SGD(net.parameters(), lr=0.1))
    with fused.attached():
        net(x).sum().backward()
    plain = torch.optim.SGD(reference.parameters(), lr=0.1)
    reference(x).sum().backward()
    plain.step()
    for a, b in zip(reference.parameters(), net.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    ("optimizer", "training", "message"),
    [
        (None, True, "needs an optimizer"),
        ("sgd", False, "inference has no backward"),
    ],
)
def test_what_cannot_step_in_backward_is_refused(optimizer, training, message):
    opt = torch.optim.SGD(_net().parameters(), lr=0.1) if optimizer else None
    with pytest.raises(ValueError, match=message):
        fused_if_asked(opt, in_backward=True, training=training)


def test_accumulation_and_a_plain_optimizer_are_contradictions():
    with pytest.raises(ValueError, match="cannot accumulate"):
        Loop(accumulation_steps=2, optimizer_in_backward=True)
    with pytest.raises(TypeError, match=r"torch\.optim\.Optimizer"):
        InBackward("adamw")
    net = _net()
    plain = torch.optim.SGD(net.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="needs an InBackward optimizer"):
        run_step(
            net,
            torch.randn(2, 8),
            mode=Mode.TRAIN,
            optimizer=plain,
            loop=Loop(optimizer_in_backward=True),
        )
