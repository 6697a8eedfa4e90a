"""torchfit.precision on CPU: bitwise against hand-written torch.amp loops, plus properties."""

import io
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn import functional

from torchfit.precision import (
    MixedPrecision,
    NonFiniteCause,
    Precision,
    StepOutcome,
    choose_precision,
    find_nonfinite,
)

AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


# -- a tiny run, written twice: by hand with torch.amp, and with MixedPrecision ------------


def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def make_optimizer(model, *, fused=False, lr=1e-2):
    return torch.optim.AdamW(model.parameters(), lr=lr, fused=True if fused else None)


def make_scheduler(optimizer):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))


def batch(step, micro, size=6):
    gen = torch.Generator().manual_seed(1000 * step + micro)
    return torch.randn(size, 8, generator=gen), torch.randn(size, 4, generator=gen)


def forward_loss(model, x, y):
    return functional.mse_loss(model(x).float(), y)


def autocast_ref(precision):
    if precision == "fp32":
        return torch.autocast("cpu", enabled=False)
    return torch.autocast("cpu", dtype=AUTOCAST[precision])


def reference_run(precision, *, steps, k, clip, fused=False):
    """The torch.amp recipe by hand: scale, backward, unscale_, clip, step, update."""
    model = make_model()
    opt = make_optimizer(model, fused=fused)
    sched = make_scheduler(opt)
    scaler = torch.amp.GradScaler("cpu") if precision == "fp16" else None
    for step in range(steps):
        for micro in range(k):
            x, y = batch(step, micro)
            with autocast_ref(precision):
                loss = forward_loss(model, x, y)
            loss = loss / k if k > 1 else loss
            (scaler.scale(loss) if scaler else loss).backward()
        stepped = True
        if scaler:
            scaler.unscale_(opt)
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        if scaler:
            before = scaler.get_scale()
            scaler.step(opt)
            scaler.update()
            stepped = scaler.get_scale() >= before
        else:
            opt.step()
        if stepped:
            sched.step()
        opt.zero_grad(set_to_none=True)
    return model, sched, scaler


def wrapped_run(precision, *, steps, k, clip, fused=False):
    model = make_model()
    opt = make_optimizer(model, fused=fused)
    sched = make_scheduler(opt)
    mp = MixedPrecision(precision, device="cpu", accumulate=k)
    outcomes = []
    for step in range(steps):
        for micro in range(k):
            x, y = batch(step, micro)
            with mp.autocast():
                loss = forward_loss(model, x, y)
            mp.backward(loss)
            outcomes.append(mp.step(opt, scheduler=sched, clip_grad_norm=clip))
    return model, sched, mp, outcomes


def assert_same_params(a, b):
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q), name


@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("clip", [None, 0.01])
def test_bitwise_equal_to_hand_written_torch_amp_loop(precision, k, clip):
    steps = 4
    ref, ref_sched, ref_scaler = reference_run(precision, steps=steps, k=k, clip=clip)
    got, sched, mp, outcomes = wrapped_run(precision, steps=steps, k=k, clip=clip)
    assert_same_params(ref, got)
    assert sched.get_last_lr() == ref_sched.get_last_lr()
    boundaries = [o for o in outcomes if o is not StepOutcome.ACCUMULATED]
    assert len(boundaries) == steps
    assert outcomes.count(StepOutcome.ACCUMULATED) == steps * (k - 1)
    assert mp.optimizer_steps + mp.skipped_steps == steps
    if ref_scaler is not None:
        assert mp.loss_scale == ref_scaler.get_scale() == mp.scaler.get_scale()
    if clip is not None:
        assert mp.last_grad_norm > clip  # clipping really acted
    untrained = make_model()
    assert not torch.equal(untrained[0].weight, got[0].weight)


def test_fused_optimizer_with_clipping_matches_reference():
    # Lightning refuses to clip with a fused optimizer; explicit unscale_ makes it correct.
    ref, _, ref_scaler = reference_run("fp16", steps=3, k=2, clip=0.01, fused=True)
    got, _, mp, _ = wrapped_run("fp16", steps=3, k=2, clip=0.01, fused=True)
    assert_same_params(ref, got)
    assert mp.loss_scale == ref_scaler.get_scale()


def test_several_optimizers_share_one_scaler_bitwise():
    def run(use_wrapper):
        model = make_model()
        first = torch.optim.AdamW(model[0].parameters(), lr=1e-2)
        second = torch.optim.SGD(model[2].parameters(), lr=0.1, momentum=0.9)
        scaler = torch.amp.GradScaler("cpu")
        mp = MixedPrecision("fp16", device="cpu")
        for step in range(3):
            x, y = batch(step, 0)
            with mp.autocast():
                loss = forward_loss(model, x, y)
            if use_wrapper:
                mp.backward(loss)
                assert mp.step([first, second], clip_grad_norm=0.05) is StepOutcome.STEPPED
                continue
            scaler.scale(loss).backward()
            scaler.unscale_(first)
            scaler.unscale_(second)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
            scaler.step(first)
            scaler.step(second)
            scaler.update()
            first.zero_grad()
            second.zero_grad()
        return model

    assert_same_params(run(use_wrapper=False), run(use_wrapper=True))


# -- inf/nan: the step is skipped, consistently -------------------------------------------


@settings(max_examples=30, deadline=None)
@given(
    precision=st.sampled_from(["bf16", "fp16", "fp32"]),
    k=st.integers(1, 3),
    inject_step=st.integers(0, 2),
    inject_micro=st.integers(0, 2),
    value=st.sampled_from([math.inf, -math.inf, math.nan]),
    param_index=st.integers(0, 3),
    clip=st.sampled_from([None, 1.0]),
    fused=st.booleans(),
    into=st.sampled_from(["gradient", "loss"]),
    check=st.sampled_from(["loss", "grads"]),
)
def test_nonfinite_gradient_or_loss_skips_the_step(
    precision, k, inject_step, inject_micro, value, param_index, clip, fused, into, check
):
    inject_micro %= k
    if into == "gradient" and clip is None:
        check = "grads"  # a poisoned gradient under a finite loss: only "grads" reads it
    model = make_model()
    opt = make_optimizer(model, fused=fused)
    sched = make_scheduler(opt)
    mp = MixedPrecision(
        precision, device="cpu", accumulate=k, init_scale=2.0**10, skip_nonfinite=check
    )
    for step in range(3):
        for micro in range(k):
            if step == inject_step and micro == k - 1:
                params_before = [p.detach().clone() for p in model.parameters()]
                opt_steps_before = [s["step"].clone() for s in opt.state.values()]
                lr_before, epoch_before = sched.get_last_lr(), sched.last_epoch
                scale_before = mp.loss_scale
            x, y = batch(step, micro)
            with mp.autocast():
                loss = forward_loss(model, x, y)
            poison = step == inject_step and micro == inject_micro
            mp.backward(loss * value if poison and into == "loss" else loss)
            if poison and into == "gradient":
                grad = list(model.parameters())[param_index].grad
                grad.view(-1)[0] = value
            outcome = mp.step(opt, scheduler=sched, clip_grad_norm=clip)
        if step != inject_step:
            assert outcome is StepOutcome.STEPPED
            continue
        assert outcome is StepOutcome.SKIPPED
        for before, p in zip(params_before, model.parameters(), strict=True):
            assert torch.equal(before, p)
        assert [s["step"] for s in opt.state.values()] == opt_steps_before
        assert (sched.get_last_lr(), sched.last_epoch) == (lr_before, epoch_before)
        assert all(p.grad is None for p in model.parameters())
        if precision == "fp16":
            assert mp.loss_scale == scale_before * 0.5 == mp.scaler.get_scale()
            assert mp.scale_history[-1] == (step + 1, scale_before * 0.5)
    assert (mp.optimizer_steps, mp.skipped_steps) == (2, 1)


def test_skip_nonfinite_never_steps_like_plain_autocast():
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mp = MixedPrecision("bf16", device="cpu", skip_nonfinite="never")
    with mp.autocast():
        loss = forward_loss(model, *batch(0, 0))
    mp.backward(loss * math.nan)
    assert mp.step(opt) is StepOutcome.STEPPED
    assert torch.isnan(model[2].weight).all()


@pytest.mark.parametrize(
    ("check", "clip", "expected"),
    [
        ("loss", None, StepOutcome.STEPPED),  # the documented limit of the default
        ("loss", 1.0, StepOutcome.SKIPPED),  # the clipping norm sees it for free
        ("grads", None, StepOutcome.SKIPPED),
    ],
)
def test_default_loss_check_and_a_poisoned_gradient_under_a_finite_loss(check, clip, expected):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mp = MixedPrecision("bf16", device="cpu", skip_nonfinite=check)
    with mp.autocast():
        loss = forward_loss(model, *batch(0, 0))
    mp.backward(loss)
    assert math.isfinite(loss.item())
    model[0].weight.grad[0, 0] = math.nan
    assert mp.step(opt, clip_grad_norm=clip) is expected


def test_loss_check_remembers_a_bad_micro_batch_until_the_window_ends():
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mp = MixedPrecision("fp32", device="cpu", accumulate=3)
    before = [p.detach().clone() for p in model.parameters()]
    outcomes = []
    for micro in range(6):
        loss = forward_loss(model, *batch(0, micro))
        mp.backward(loss * math.inf if micro == 0 else loss)
        outcomes.append(mp.step(opt))
    assert outcomes[2] is StepOutcome.SKIPPED
    assert outcomes[5] is StepOutcome.STEPPED  # the next window starts clean
    assert not torch.equal(before[0], model[0].weight)
    assert (mp.optimizer_steps, mp.skipped_steps) == (1, 1)


def test_unknown_nonfinite_check_is_an_error_listing_the_choices():
    with pytest.raises(ValueError, match="skip_nonfinite=True is not") as info:
        MixedPrecision("bf16", device="cpu", skip_nonfinite=True)
    assert "'loss', 'grads', 'never'" in str(info.value)


def test_skip_detection_without_the_private_scaler_accessor(monkeypatch):
    monkeypatch.delattr(torch.amp.GradScaler, "_found_inf_per_device")
    model = make_model()
    opt = make_optimizer(model)
    mp = MixedPrecision("fp16", device="cpu")
    for poison in (False, True):
        with mp.autocast():
            loss = forward_loss(model, *batch(0, 0))
        mp.backward(loss * math.nan if poison else loss)
        expected = StepOutcome.SKIPPED if poison else StepOutcome.STEPPED
        assert mp.step(opt) is expected


def test_one_optimizer_with_inf_skips_all_and_backs_off_once():
    model = make_model()
    first = torch.optim.SGD(model[0].parameters(), lr=0.1)
    second = torch.optim.SGD(model[2].parameters(), lr=0.1)
    mp = MixedPrecision("fp16", device="cpu", init_scale=256.0)
    before = [p.detach().clone() for p in model.parameters()]
    with mp.autocast():
        loss = forward_loss(model, *batch(0, 0))
    mp.backward(loss)
    model[0].weight.grad[0, 0] = math.inf  # only the first optimizer sees it
    assert mp.step([first, second]) is StepOutcome.SKIPPED
    for b, p in zip(before, model.parameters(), strict=True):
        assert torch.equal(b, p)
    assert mp.loss_scale == 128.0 == mp.scaler.get_scale()


def test_scale_history_records_backoff_and_growth():
    model = make_model()
    opt = make_optimizer(model)
    mp = MixedPrecision("fp16", device="cpu", init_scale=64.0, growth_interval=2)
    outcomes = []
    for step in range(5):
        with mp.autocast():
            loss = forward_loss(model, *batch(step, 0))
        mp.backward(loss * math.inf if step == 1 else loss)
        outcomes.append(mp.step(opt))
    assert outcomes[1] is StepOutcome.SKIPPED
    # skip at update 2 halves; two clean updates (3, 4) double; then one more clean one
    assert mp.scale_history == ((0, 64.0), (2, 32.0), (4, 64.0))
    assert mp.loss_scale == mp.scaler.get_scale() == 64.0
    assert "scale=64" in repr(mp)


# -- checkpoint and resume ------------------------------------------------------------------


def _train(state, steps, poison, *, precision):
    model, opt, sched, mp = state
    for step in steps:
        with mp.autocast():
            loss = forward_loss(model, *batch(step, 0))
        loss = loss * math.inf if step in poison else loss
        mp.backward(loss)
        mp.step(opt, scheduler=sched, clip_grad_norm=0.5)


def _fresh(precision, growth_interval, seed=0):
    model = make_model(seed)
    opt = make_optimizer(model)
    sched = make_scheduler(opt)
    mp = MixedPrecision(precision, device="cpu", init_scale=2.0**8, growth_interval=growth_interval)
    return model, opt, sched, mp


@settings(max_examples=15, deadline=None)
@given(
    precision=st.sampled_from(["bf16", "fp16", "fp32"]),
    stop=st.integers(1, 5),
    poison=st.sets(st.integers(0, 5), max_size=2),
    growth_interval=st.integers(1, 3),
)
def test_resume_continues_exactly(precision, stop, poison, growth_interval):
    total = 6
    straight = _fresh(precision, growth_interval)
    _train(straight, range(total), poison, precision=precision)

    first = _fresh(precision, growth_interval)
    _train(first, range(stop), poison, precision=precision)
    buffer = io.BytesIO()
    model, opt, sched, mp = first
    torch.save(
        {
            "model": model.state_dict(),
            "opt": opt.state_dict(),
            "sched": sched.state_dict(),
            "mp": mp.state_dict(),
        },
        buffer,
    )
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    resumed = _fresh(precision, growth_interval=2000, seed=1)  # loading must fix everything
    model, opt, sched, mp = resumed
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    sched.load_state_dict(saved["sched"])
    mp.load_state_dict(saved["mp"])
    _train(resumed, range(stop, total), poison, precision=precision)

    assert_same_params(straight[0], resumed[0])
    assert resumed[3].state_dict() == straight[3].state_dict()
    assert resumed[2].get_last_lr() == straight[2].get_last_lr()
    assert resumed[3].skipped_steps == len(poison)


def test_state_dict_inside_a_window_is_refused():
    model = make_model()
    opt = make_optimizer(model)
    mp = MixedPrecision("bf16", device="cpu", accumulate=2)
    mp.backward(forward_loss(model, *batch(0, 0)))
    with pytest.raises(RuntimeError, match="accumulated gradients"):
        mp.state_dict()
    assert mp.step(opt) is StepOutcome.ACCUMULATED
    with pytest.raises(RuntimeError, match="1 of 2 micro-batches"):
        mp.state_dict()


@pytest.mark.parametrize(
    ("saved", "message"),
    [
        ({"precision": "fp16"}, r"build it with MixedPrecision\(dtype='fp16'"),
        ({"accumulate": 4}, "accumulate=4"),
        ({"format": 99}, "not a MixedPrecision state dict"),
    ],
)
def test_load_state_dict_refuses_a_mismatch(saved, message):
    state = MixedPrecision("bf16", device="cpu").state_dict() | saved
    with pytest.raises(ValueError, match=message):
        MixedPrecision("bf16", device="cpu").load_state_dict(state)


# -- accumulation == one big batch ----------------------------------------------------------


def _sgd_run(batches, *, precision, k, flush=False, weights=None):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mp = MixedPrecision(precision, device="cpu", accumulate=k)
    for index, (x, y) in enumerate(batches):
        with mp.autocast():
            loss = forward_loss(model, x, y)
        mp.backward(loss, weight=None if weights is None else weights[index])
        last = index == len(batches) - 1
        outcome = mp.step(opt, flush=flush and last)
    assert outcome is StepOutcome.STEPPED
    return model


@settings(max_examples=25, deadline=None)
@given(
    k=st.integers(1, 4),
    size=st.integers(1, 4),
    seen=st.integers(1, 4),
    precision=st.sampled_from(["fp32", "bf16", "fp16"]),
)
def test_accumulation_matches_one_big_batch(k, size, seen, precision):
    seen = min(seen, k)  # seen < k: a short window ended with flush=True
    x, y = batch(0, 0, size=size * seen)
    micro = list(zip(x.split(size), y.split(size), strict=True))
    accumulated = _sgd_run(micro, precision=precision, k=k, flush=seen < k)
    one = _sgd_run([(x, y)], precision=precision, k=1)
    tol = {"fp32": 1e-6, "bf16": 2e-2, "fp16": 2e-3}[precision]
    for p, q in zip(accumulated.parameters(), one.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=tol, atol=tol)


def test_weights_handle_unequal_micro_batches():
    x, y = batch(0, 0, size=6)
    sizes = [1, 3, 2]
    micro = list(zip(x.split(sizes), y.split(sizes), strict=True))
    weighted = _sgd_run(micro, precision="fp32", k=3, weights=[n / 6 for n in sizes])
    one = _sgd_run([(x, y)], precision="fp32", k=1)
    for p, q in zip(weighted.parameters(), one.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)
    plain = _sgd_run(micro, precision="fp32", k=3)  # 1/k per micro-batch: wrong here
    assert not torch.allclose(plain[0].weight, one[0].weight, rtol=1e-6, atol=1e-6)


def test_weight_for_part_of_a_window_is_refused():
    model = make_model()
    mp = MixedPrecision("fp32", device="cpu", accumulate=2)
    mp.backward(forward_loss(model, *batch(0, 0)), weight=0.5)
    with pytest.raises(ValueError, match="weight= for only some"):
        mp.backward(forward_loss(model, *batch(0, 1)))


# -- "auto": what the hardware really does ------------------------------------------------


def fake_gpu(monkeypatch, capability, *, native_bf16=None):
    native = capability >= (8, 0) if native_bf16 is None else native_bf16
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.version, "hip", None)

    def is_bf16_supported(including_emulation=True):
        return native or including_emulation  # emulation: True everywhere, as torch >= 2.4

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)


@pytest.mark.parametrize(
    ("capability", "native", "expected", "words"),
    [
        ((9, 0), None, Precision.BF16, "9.0"),
        ((8, 0), None, Precision.BF16, "native bf16"),
        ((8, 6), False, Precision.FP16, "emulated"),  # torch says no native bf16: trust it
        ((7, 5), None, Precision.FP16, "emulated"),  # T4: bf16 only by emulation
        ((7, 0), None, Precision.FP16, "tensor cores"),
        ((6, 0), None, Precision.FP16, "fast fp16"),
        ((6, 1), None, Precision.FP32, "far slower"),  # GTX 10xx: fp16 at 1/64 rate
        ((5, 0), None, Precision.FP32, "far slower"),
    ],
)
def test_auto_on_gpus(monkeypatch, capability, native, expected, words):
    fake_gpu(monkeypatch, capability, native_bf16=native)
    choice = choose_precision("auto")
    assert choice.device == "cuda"
    assert choice.precision is expected
    assert choice.scaler is (expected is Precision.FP16)
    assert words in choice.reason
    assert f"{capability[0]}.{capability[1]}" in choice.reason


def fake_cpu(monkeypatch, *, avx512_bf16, amx, mkldnn=True):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: mkldnn)


@pytest.mark.parametrize(
    ("avx512_bf16", "amx", "mkldnn", "expected", "words"),
    [
        (True, False, True, Precision.BF16, "AVX512-BF16"),
        (True, True, True, Precision.BF16, "AMX"),
        (False, False, True, Precision.FP32, "emulated"),
        (True, False, False, Precision.FP32, "oneDNN"),
    ],
)
def test_auto_on_cpus(monkeypatch, avx512_bf16, amx, mkldnn, expected, words):
    fake_cpu(monkeypatch, avx512_bf16=avx512_bf16, amx=amx, mkldnn=mkldnn)
    mp = MixedPrecision()
    assert mp.device == torch.device("cpu")
    assert mp.dtype is expected
    assert mp.scaler is None
    assert words in mp.reason
    assert f"dtype='{expected}'" in repr(mp)
    assert mp.reason in repr(mp)
    assert words in str(mp.choice)
    assert mp.choice.to_dict()["precision"] == str(expected)


@pytest.mark.parametrize(
    ("value", "message"),
    [("fp8", "cannot drive"), ("banana", "unknown precision"), (torch.int8, "cannot drive")],
)
def test_bad_precision_names_the_choices(value, message):
    with pytest.raises(ValueError, match=message) as info:
        MixedPrecision(value, device="cpu")
    assert "'bf16', 'fp16' or 'fp32'" in str(info.value)


@pytest.mark.parametrize(
    "kwargs",
    [{"accumulate": 0}, {"accumulate": 1.5}, {"backoff_factor": 1.0}, {"growth_interval": 0}],
)
def test_bad_numbers_are_refused(kwargs):
    with pytest.raises((ValueError, TypeError), match=r"accumulate|backoff|growth_interval"):
        MixedPrecision("fp16", device="cpu", **kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests the error without a GPU")
def test_cuda_without_a_gpu_is_refused():
    with pytest.raises(ValueError, match="device='cpu'"):
        MixedPrecision("bf16", device="cuda")


# -- checks before the first backward -----------------------------------------------------


@pytest.mark.parametrize(
    ("precision", "message"), [("fp16", "Attempting to unscale FP16"), ("bf16", "underflow")]
)
def test_halved_model_fails_before_the_backward(precision, message):
    model = make_model().half()
    mp = MixedPrecision(precision, device="cpu")
    with mp.autocast():
        loss = forward_loss(model, *batch(0, 0))
    with pytest.raises(ValueError, match=message) as info:
        mp.backward(loss)
    assert "model.float()" in str(info.value)
    assert all(p.grad is None for p in model.parameters())  # it never ran
    with pytest.raises(ValueError, match=r"0\.weight"):  # check() names the parameters
        mp.check(model)


def test_loss_without_gradient_path_is_explained():
    model = make_model()
    mp = MixedPrecision("bf16", device="cpu")
    with torch.no_grad():
        loss = forward_loss(model, *batch(0, 0))
    with pytest.raises(ValueError, match="no gradient path"):
        mp.backward(loss)


def test_loss_on_another_device_is_refused():
    weight = torch.ones(3, device="meta", requires_grad=True)
    with pytest.raises(ValueError, match="device='meta'"):
        MixedPrecision("fp32", device="cpu").backward((weight * 2).sum())


class FakeLinear4bit(nn.Module):
    """Stands in for bitsandbytes' Linear4bit: its class lives in bitsandbytes."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(8, 4, dtype=torch.uint8), requires_grad=False)


FakeLinear4bit.__module__ = "bitsandbytes.nn.modules"


def test_quantized_model_without_adapters_is_refused():
    model = nn.Sequential(FakeLinear4bit(), nn.LayerNorm(4))
    model[1].requires_grad_(False)
    mp = MixedPrecision("bf16", device="cpu")
    with pytest.raises(ValueError, match=r"quantized .*FakeLinear4bit.*adapters"):
        mp.check(model)
    model.add_module("adapter", nn.Linear(4, 4))  # a trainable fp32 adapter: fine
    mp.check(model)
    model.adapter.half()
    with pytest.raises(ValueError, match=r"adapter\.weight"):
        MixedPrecision("fp16", device="cpu").check(model)


def test_frozen_model_is_refused():
    with pytest.raises(ValueError, match="no trainable parameter"):
        MixedPrecision("bf16", device="cpu").check(make_model().requires_grad_(False))


class SelfUnscalingSGD(torch.optim.SGD):
    """The deprecated contract: step(grad_scaler=) unscales inside the optimizer."""

    _step_supports_amp_scaling = True

    def step(self, closure=None, grad_scaler=None):
        return super().step(closure)


def test_optimizer_that_unscales_itself_is_refused_with_a_scaler():
    model = make_model()
    opt = SelfUnscalingSGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError, match="grad_scaler"):
        MixedPrecision("fp16", device="cpu").check(model, opt)
    mp = MixedPrecision("fp16", device="cpu")
    mp.backward(forward_loss(model, *batch(0, 0)))
    with pytest.raises(TypeError, match="fused=True is fine"):
        mp.step(opt)
    MixedPrecision("bf16", device="cpu").check(model, opt)  # no scaler: nothing to fight


def test_step_argument_errors():
    model = make_model()
    opt = make_optimizer(model)
    mp = MixedPrecision("fp16", device="cpu")
    with pytest.raises(RuntimeError, match="without a backward"):
        mp.step(opt)
    mp.backward(forward_loss(model, *batch(0, 0)))
    with pytest.raises(ValueError, match="passed twice"):
        mp.step([opt, opt])
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
    with pytest.raises(TypeError, match="metric"):
        mp.step(opt, scheduler=plateau)
    with pytest.raises(TypeError, match="Optimizer"):
        mp.step(["adamw"])
    assert mp.step(opt) is StepOutcome.STEPPED  # failed checks left the state alone


def test_optimizer_whose_parameters_got_no_gradient():
    model = make_model()
    other = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    mp = MixedPrecision("fp16", device="cpu")
    mp.backward(forward_loss(model, *batch(0, 0)))
    with pytest.raises(RuntimeError, match=r"optimizer 1 .*no parameter with a gradient"):
        mp.step([make_optimizer(model), other])


# -- find_nonfinite -------------------------------------------------------------------------


def no_hooks_left(model):
    return all(not m._forward_hooks for m in model.modules())


def test_find_nonfinite_names_the_overflowing_module():
    model = make_model()
    with torch.no_grad():
        model[2].weight.fill_(3e38)
    with find_nonfinite(model) as probe:
        model(torch.ones(2, 8))
    first = probe.first
    assert (first.module, first.module_type, first.cause) == ("2", "Linear", "computed")
    assert first.has_inf
    assert first.call == 2  # 0: Linear, 1: ReLU, 2: Linear, 3: Sequential
    assert "2 (Linear)" in str(first)
    assert first.to_dict()["cause"] == "computed"
    assert no_hooks_left(model)


def test_find_nonfinite_blames_inputs_and_parameters():
    model = make_model()
    with find_nonfinite(model) as probe:
        model(torch.full((2, 8), math.nan))
    assert (probe.first.module, probe.first.cause) == ("0", NonFiniteCause.INPUT)
    assert probe.first.has_nan
    with torch.no_grad():
        model[2].bias[0] = math.nan
    with find_nonfinite(model) as probe:
        model(torch.ones(2, 8))
    assert (probe.first.module, probe.first.cause) == ("2", NonFiniteCause.PARAMETER)


class LogOfNegative(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(3, 3)

    def forward(self, x, *, shift):
        return {"out": torch.log(-self.inner(x).abs() - shift)}


def test_find_nonfinite_outside_submodules_and_clean_runs():
    model = LogOfNegative()
    with find_nonfinite(model) as probe:
        model(torch.ones(2, 3), shift=1.0)
    assert (probe.first.module, probe.first.cause) == ("(root)", NonFiniteCause.COMPUTED)
    clean = make_model()
    with find_nonfinite(clean) as probe:
        clean(torch.ones(2, 8))
    assert probe.first is None
    assert no_hooks_left(clean)
    assert "4 calls recorded" in repr(probe)
