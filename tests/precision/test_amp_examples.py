"""PyTorch's "Automatic Mixed Precision examples" recipes, run with `MixedPrecision`.

Each recipe is written twice on the CPU: as the plain ``torch.amp.GradScaler`` loop
(autocast fp16 on the CPU, ``GradScaler("cpu")``), and with `MixedPrecision`; the
weights after a few steps must be bitwise equal. Recipes: several models, losses and
optimizers sharing one scaler (``retain_graph=True`` on the first backward); a gradient
penalty; code that needs the unscaled gradients before the step (``clip_grad_value_``).
"""

import math

import pytest
import torch
from torch import nn
from torch.nn import functional

from torchfit.precision import MixedPrecision, StepOutcome

STEPS = 4
# A small first scale keeps fp16 gradients finite, so every step really moves the weights;
# the 4th update doubles it (growth_interval=3), so scale growth is compared too.
SCALER = {"init_scale": 2.0**8, "growth_interval": 3}


def model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def data(step):
    gen = torch.Generator().manual_seed(step)
    return torch.randn(6, 8, generator=gen), torch.randn(6, 4, generator=gen)


def autocast():
    return torch.autocast("cpu", dtype=torch.float16)


def assert_bitwise(a, b):
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q), name


def moved(net, seed):
    return not torch.equal(net[0].weight, model(seed)[0].weight)


# -- several models, losses and optimizers --------------------------------------------------


def several(*, wrapped):
    net0, net1 = model(0), model(1)
    opt0 = torch.optim.SGD(net0.parameters(), lr=0.1, momentum=0.9)
    opt1 = torch.optim.AdamW(net1.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", **SCALER)
    mp = MixedPrecision("fp16", device="cpu", **SCALER)
    for step in range(STEPS):
        x, y = data(step)
        with mp.autocast() if wrapped else autocast():
            out0, out1 = net0(x), net1(x)
            loss0 = functional.mse_loss(2 * out0 + 3 * out1, y)
            loss1 = functional.mse_loss(3 * out0 - 5 * out1, y)
        if wrapped:
            mp.backward(loss0, retain_graph=True)
            mp.backward(loss1)
            assert mp.step([opt0, opt1]) is StepOutcome.STEPPED
            continue
        opt0.zero_grad()
        opt1.zero_grad()
        scaler.scale(loss0).backward(retain_graph=True)
        scaler.scale(loss1).backward()
        scaler.unscale_(opt0)  # the recipe's optional inspection point
        scaler.step(opt0)
        scaler.step(opt1)
        scaler.update()
    return net0, net1, (mp.loss_scale if wrapped else scaler.get_scale())


def test_several_models_losses_and_optimizers_bitwise():
    ref0, ref1, ref_scale = several(wrapped=False)
    got0, got1, scale = several(wrapped=True)
    assert_bitwise(ref0, got0)
    assert_bitwise(ref1, got1)
    assert scale == ref_scale == SCALER["init_scale"] * 2  # one growth, no skip
    assert moved(got0, 0)
    assert moved(got1, 1)


def test_a_second_backward_without_retain_graph_fails_as_in_torch():
    net = model(0)
    mp = MixedPrecision("fp16", device="cpu")
    with mp.autocast():
        out = net(data(0)[0])
        loss0, loss1 = out.float().square().mean(), out.float().abs().mean()
    mp.backward(loss0)  # the graph is freed: loss1 shares it
    with pytest.raises(RuntimeError, match="second time"):
        mp.backward(loss1)


# -- gradient penalty ------------------------------------------------------------------------


def penalty(*, wrapped):
    net = model(2)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", **SCALER)
    mp = MixedPrecision("fp16", device="cpu", **SCALER)
    for step in range(STEPS):
        x, y = data(step)
        with mp.autocast() if wrapped else autocast():
            loss = functional.mse_loss(net(x).float(), y)
        if wrapped:
            grads = mp.grad(loss, list(net.parameters()))
        else:
            scaled = torch.autograd.grad(
                scaler.scale(loss), list(net.parameters()), create_graph=True
            )
            inverse = 1.0 / scaler.get_scale()
            grads = tuple(g * inverse for g in scaled)
        with mp.autocast() if wrapped else autocast():
            norm = sum(g.pow(2).sum() for g in grads).sqrt()
            loss = loss + norm
        if wrapped:
            mp.backward(loss)
            assert mp.step(opt) is StepOutcome.STEPPED
            continue
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    return net, (mp.loss_scale if wrapped else scaler.get_scale())


def test_gradient_penalty_bitwise():
    ref, ref_scale = penalty(wrapped=False)
    got, scale = penalty(wrapped=True)
    assert_bitwise(ref, got)
    assert scale == ref_scale
    assert moved(got, 2)


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_grad_without_a_scaler_is_autograd_grad(precision):
    net = model(3)
    mp = MixedPrecision(precision, device="cpu")
    x, y = data(0)
    with mp.autocast():
        loss = functional.mse_loss(net(x).float(), y)
    got = mp.grad(loss, list(net.parameters()))
    expected = torch.autograd.grad(loss, list(net.parameters()), retain_graph=True)
    assert all(torch.equal(g, e) for g, e in zip(got, expected, strict=True))
    assert all(g.requires_grad for g in got)  # create_graph: the penalty is differentiable
    assert all(p.grad is None for p in net.parameters())


# -- the unscaled gradients before the step ---------------------------------------------------


def clip_by_value(*, wrapped, accumulate=1, flush_at=None):
    net = model(4)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", **SCALER)
    mp = MixedPrecision("fp16", device="cpu", accumulate=accumulate, **SCALER)
    seen = []

    def hook():
        seen.append(max(p.grad.abs().max().item() for p in net.parameters()))
        nn.utils.clip_grad_value_(net.parameters(), 0.05)

    micro_batches = STEPS * accumulate if flush_at is None else flush_at
    for micro in range(micro_batches):
        x, y = data(micro)
        with mp.autocast() if wrapped else autocast():
            loss = functional.mse_loss(net(x).float(), y)
        if wrapped:
            mp.backward(loss)
            mp.step(opt, before_step=hook, flush=micro == micro_batches - 1)
            continue
        scaler.scale(loss / accumulate).backward()
        if (micro + 1) % accumulate and micro != micro_batches - 1:
            continue
        scaler.unscale_(opt)
        short = micro_batches % accumulate if micro == micro_batches - 1 else 0
        if short:  # a flushed short window: the mean of the micro-batches it holds
            torch._foreach_mul_([p.grad for p in net.parameters()], accumulate / short)
        hook()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    return net, seen


@pytest.mark.parametrize(("accumulate", "flush_at"), [(1, None), (3, None), (3, 5)])
def test_before_step_sees_unscaled_gradients_bitwise(accumulate, flush_at):
    ref, ref_seen = clip_by_value(wrapped=False, accumulate=accumulate, flush_at=flush_at)
    got, seen = clip_by_value(wrapped=True, accumulate=accumulate, flush_at=flush_at)
    assert_bitwise(ref, got)
    assert seen == ref_seen  # called once per real step, on the same gradients
    assert len(seen) == (STEPS if flush_at is None else math.ceil(flush_at / accumulate))
    assert max(seen) > 0.05  # the clipping really acted
    assert max(seen) < 1e3  # unscaled: the scale (256) is not in them
    assert moved(got, 4)


def test_before_step_is_not_called_on_a_skipped_step():
    net = model(5)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    mp = MixedPrecision("fp16", device="cpu")
    calls = []
    with mp.autocast():
        loss = functional.mse_loss(net(data(0)[0]).float(), data(0)[1])
    mp.backward(loss * math.inf)
    assert mp.step(opt, before_step=lambda: calls.append(1)) is StepOutcome.SKIPPED
    assert calls == []


@pytest.mark.parametrize("hook", [3, "clip", [print]])
def test_before_step_must_be_callable(hook):
    net = model(6)
    mp = MixedPrecision("bf16", device="cpu")
    with mp.autocast():
        loss = net(data(0)[0]).float().mean()
    mp.backward(loss)
    with pytest.raises(TypeError, match=r"before_step must be a function called with no"):
        mp.step(torch.optim.SGD(net.parameters(), lr=0.1), before_step=hook)


@pytest.mark.parametrize("inputs", [3, [], ["w"], None])
def test_grad_needs_tensors(inputs):
    net = model(7)
    mp = MixedPrecision("fp16", device="cpu")
    with mp.autocast():
        loss = net(data(0)[0]).float().mean()
    with pytest.raises(TypeError, match=r"inputs must be tensors to differentiate by"):
        mp.grad(loss, inputs)


def test_grad_takes_an_iterator_of_parameters():
    net = model(8)
    mp = MixedPrecision("fp16", device="cpu")
    with mp.autocast():
        loss = net(data(0)[0]).float().mean()
    grads = mp.grad(loss, net.parameters(), create_graph=False)
    assert len(grads) == len(list(net.parameters()))
    assert not any(g.requires_grad for g in grads)
