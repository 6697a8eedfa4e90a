"""torchfit.precision on a real GPU: the "auto" choice, bitwise reference runs, skips, resume."""

import io
import math

import pytest
import torch
from torch import nn
from torch.nn import functional

from torchfit.precision import MixedPrecision, Precision, StepOutcome

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def capability():
    return torch.cuda.get_device_capability()


def precisions():
    """fp16 everywhere; bf16 only where it is native (sm_80+)."""
    if not torch.cuda.is_available():
        return ["fp16", "fp32"]
    return ["bf16", "fp16", "fp32"] if capability() >= (8, 0) else ["fp16", "fp32"]


def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 8 * 8, 4)
    ).cuda()


def batch(step, micro):
    gen = torch.Generator(device="cuda").manual_seed(1000 * step + micro)
    x = torch.randn(4, 3, 8, 8, device="cuda", generator=gen)
    return x, torch.randn(4, 4, device="cuda", generator=gen)


def forward_loss(model, x, y):
    return functional.mse_loss(model(x).float(), y)


def test_auto_follows_the_compute_capability():
    mp = MixedPrecision("auto")
    assert mp.device.type == "cuda"
    expected = Precision.BF16 if capability() >= (8, 0) else Precision.FP16
    if capability() < (7, 0) and capability() not in {(5, 3), (6, 0), (6, 2)}:
        expected = Precision.FP32
    assert mp.dtype is expected
    assert (mp.scaler is not None) is (expected is Precision.FP16)
    assert f"{capability()[0]}.{capability()[1]}" in mp.reason


@pytest.mark.parametrize("precision", precisions())
@pytest.mark.parametrize(("k", "clip"), [(1, None), (3, 0.01)])
def test_bitwise_equal_to_hand_written_loop(monkeypatch, precision, k, clip):
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)

    ref = make_model()
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, fused=True)
    scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None
    for step in range(4):
        for micro in range(k):
            with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
                loss = forward_loss(ref, *batch(step, micro))
            loss = loss / k if k > 1 else loss
            (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.unscale_(opt)
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(ref.parameters(), clip)
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)

    got = make_model()
    opt = torch.optim.AdamW(got.parameters(), lr=1e-2, fused=True)
    mp = MixedPrecision(precision, device="cuda", accumulate=k)
    for step in range(4):
        for micro in range(k):
            with mp.autocast():
                loss = forward_loss(got, *batch(step, micro))
            mp.backward(loss)
            mp.step(opt, clip_grad_norm=clip)
    for p, q in zip(ref.parameters(), got.parameters(), strict=True):
        assert torch.equal(p, q)
    if scaler is not None:
        assert mp.loss_scale == scaler.get_scale()


@pytest.mark.parametrize("precision", precisions())
@pytest.mark.parametrize("fused", [False, True])
def test_nonfinite_step_is_skipped(precision, fused):
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=fused)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    # A NaN gradient under a finite loss: fp16's scaler finds it; bf16/fp32 find it when
    # asked to read the gradients (the default reads only the loss).
    mp = MixedPrecision(precision, device="cuda", init_scale=1024.0, skip_nonfinite="grads")
    before = [p.detach().clone() for p in model.parameters()]
    with mp.autocast():
        loss = forward_loss(model, *batch(0, 0))
    mp.backward(loss)
    model[0].weight.grad[0, 0, 0, 0] = math.nan
    assert mp.step(opt, scheduler=sched) is StepOutcome.SKIPPED
    for b, p in zip(before, model.parameters(), strict=True):
        assert torch.equal(b, p)
    assert sched.last_epoch == 0
    if precision == "fp16":
        assert mp.loss_scale == 512.0 == mp.scaler.get_scale()


@pytest.mark.parametrize("precision", precisions())
def test_resume_continues_exactly(monkeypatch, precision):
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)

    def fresh(seed=0):
        model = make_model(seed)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        return model, opt, MixedPrecision(precision, device="cuda", growth_interval=2)

    def train(state, steps):
        model, opt, mp = state
        for step in steps:
            with mp.autocast():
                loss = forward_loss(model, *batch(step, 0))
            mp.backward(loss * math.inf if step == 2 else loss)
            mp.step(opt, clip_grad_norm=1.0)

    straight = fresh()
    train(straight, range(6))
    first = fresh()
    train(first, range(3))
    buffer = io.BytesIO()
    torch.save([first[0].state_dict(), first[1].state_dict(), first[2].state_dict()], buffer)
    buffer.seek(0)
    model_state, opt_state, mp_state = torch.load(buffer, weights_only=True)
    resumed = fresh(seed=1)
    resumed[0].load_state_dict(model_state)
    resumed[1].load_state_dict(opt_state)
    resumed[2].load_state_dict(mp_state)
    train(resumed, range(3, 6))
    for p, q in zip(straight[0].parameters(), resumed[0].parameters(), strict=True):
        assert torch.equal(p, q)
    assert resumed[2].state_dict() == straight[2].state_dict()
