"""Batch-size prediction, the search, and simulated out-of-memory errors."""

from __future__ import annotations

import copy
import gc
import inspect
import itertools
import math
import random

import numpy as np
import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensorMode

from gloo_ranks import leave, start_ranks
from torchfit._core.units import parse_bytes
from torchfit.memory.allocator import (
    CONTEXT_ENV_VAR,
    DEFAULT_CUDA_CONTEXT_BYTES,
    cuda_context_bytes,
)
from torchfit.memory.batch import (
    BatchSizeResult,
    Margin,
    TrialOutcome,
    find_batch_size,
    is_oom,
    max_batch_size,
    simulate_gpu,
    solve_batch_size,
)
from torchfit.memory.batch import simulate as _simulate
from torchfit.memory.batch.probe import Snapshot
from torchfit.memory.batch.search import Options, Search, split_effective
from torchfit.memory.gpus import GPU
from torchfit.memory.measure import measure_peak
from torchfit.memory.result import AffineEstimate, MemoryEstimate

MiB = 2**20
FLOAT = 4
BLOCK = 512  # CUDA's allocation granule, which the simulated card rounds to


def line(fixed, per_sample):
    return AffineEstimate(MemoryEstimate(weights=fixed), MemoryEstimate(activations=per_sample))


# ---------------------------------------------------------------------------------- is_oom


@pytest.mark.parametrize(
    "exc",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB."),
        RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total)"),
        RuntimeError(
            "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate "
            "memory: you tried to allocate 1099511627776 bytes."
        ),
        RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
        RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if ..."),
        RuntimeError("MPS backend out of memory (MPS allocated: 17.00 GB)"),
        MemoryError(),
    ],
)
def test_is_oom_recognises_out_of_memory_errors(exc):
    assert is_oom(exc)


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 4x3)"),
        ValueError("out of memory"),  # not a RuntimeError: a user's own message
        KeyError("CUDA out of memory"),
        RuntimeError(),
    ],
)
def test_is_oom_rejects_other_errors(exc):
    assert not is_oom(exc)


def _failing_step():
    raise torch.OutOfMemoryError("CUDA out of memory.")


def _trainer_that_wraps_an_oom():
    try:
        _failing_step()
    except torch.OutOfMemoryError as oom:
        raise ValueError("the trainer failed") from oom


def test_is_oom_follows_raise_from():
    with pytest.raises(ValueError, match="the trainer failed") as caught:
        _trainer_that_wraps_an_oom()
    assert is_oom(caught.value)
    assert not is_oom(ValueError("the trainer failed"))


# ------------------------------------------------------------------------ solving the line


def test_solve_batch_size_inverts_the_line_with_the_margin():
    assert solve_batch_size(line(1000, 10), 2000, margin=0.0) == 100
    assert solve_batch_size(line(1000, 10), 2000) == 90  # 5% of 2000 kept free (1900)
    assert solve_batch_size(line(1000, 10), "2KB", margin=Margin(0.0, reserve=500)) == 50
    assert solve_batch_size(line(3000, 10), 2000) == 0


@settings(max_examples=60, deadline=None)
@given(
    fixed=st.integers(0, 10**10),
    per_sample=st.integers(1, 10**8),
    budget=st.integers(1, 10**11),
    fraction=st.floats(0, 0.5),
)
def test_solve_batch_size_is_the_largest_size_within_the_usable_bytes(
    fixed, per_sample, budget, fraction
):
    chosen = solve_batch_size(line(fixed, per_sample), budget, margin=fraction)
    usable = Margin(fraction).usable(budget)
    assert chosen >= 0
    if chosen:
        assert fixed + chosen * per_sample <= usable
    assert fixed + (chosen + 1) * per_sample > usable


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"fraction": 1.5}, r"fraction must be in \[0, 1\); got 1.5"),
        ({"fraction": -0.1}, r"fraction must be in \[0, 1\)"),
        ({"fraction": 0.1, "reserve": -1}, "reserve must be a whole number >= 0; got -1"),
    ],
)
def test_margin_rejects_nonsense(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Margin(**kwargs)


def test_max_batch_size_for_a_card_holds_back_the_cuda_context(monkeypatch):
    monkeypatch.delenv(CONTEXT_ENV_VAR, raising=False)
    card = GPU(name="Test 8GB", memory=8 * 2**30)
    plain = max_batch_size(line(2**30, 10 * MiB), 8 * 2**30)
    on_card = max_batch_size(line(2**30, 10 * MiB), card)
    usable = math.floor(8 * 2**30 * (1 - Margin().fraction)) - cuda_context_bytes(card)
    assert on_card == (usable - 2**30) // (10 * MiB)
    assert on_card < plain
    # An estimate that models its own context is trusted over the default.
    own = AffineEstimate(
        MemoryEstimate(weights=2**30, context=100 * MiB), MemoryEstimate(activations=10 * MiB)
    )
    expected = (math.floor(8 * 2**30 * (1 - Margin().fraction)) - 100 * MiB - 2**30) // (10 * MiB)
    assert max_batch_size(own, card) == expected


@pytest.mark.parametrize("context", ["1GiB", "100MiB"])
def test_the_batch_margin_reserves_the_context_to_device_adds(monkeypatch, context):
    """One CUDA context figure: the env var moves the margin and the device estimate alike."""
    from torchfit.memory.allocator import to_device
    from torchfit.memory.batch.predict import BudgetKind, find_budget, resolve_margin

    card = GPU(name="Test 8GB", memory=8 * 2**30)
    monkeypatch.delenv(CONTEXT_ENV_VAR, raising=False)
    before = max_batch_size(line(2**30, 10 * MiB), card)
    monkeypatch.setenv(CONTEXT_ENV_VAR, context)
    found = find_budget(card)
    reserve = resolve_margin(None, found.kind, 0, found.card).reserve
    assert found.kind is BudgetKind.GPU
    assert reserve == cuda_context_bytes(card) == parse_bytes(context)
    assert reserve == to_device(MemoryEstimate(device="cuda"), gpu=card).context
    after = max_batch_size(line(2**30, 10 * MiB), card)
    assert after == (math.floor(8 * 2**30 * (1 - Margin().fraction)) - reserve - 2**30) // (
        10 * MiB
    )
    assert after != before
    assert (after > before) is (reserve < DEFAULT_CUDA_CONTEXT_BYTES)


def test_max_batch_size_keeps_to_the_allowed_sizes():
    assert max_batch_size(line(0, 100), 1000, margin=0.0, batch_sizes=[2, 4, 8, 16]) == 8
    assert max_batch_size(line(0, 100), 1000, margin=0.0, batch_sizes=range(3, 100, 3)) == 9
    assert max_batch_size(line(0, 100), 50, margin=0.0, batch_sizes=[1, 2]) == 0


def test_max_batch_size_fits_a_callable_with_four_evaluations():
    calls = []

    def predict(batch_size):
        calls.append(batch_size)
        return line(1000, 37).at(batch_size)

    assert max_batch_size(predict, 100_000, margin=0.0) == (100_000 - 1000) // 37
    assert len(calls) == 4  # two to fit the line, two to check its answer


def test_max_batch_size_on_a_card_asks_each_size_once():
    # the card's context comes from the prediction at 1, which the fit asks for again: a
    # traced step costs about a second a size, so each size is asked once
    calls = []

    def predict(batch_size):
        calls.append(batch_size)
        return line(2**30, 10 * MiB).at(batch_size)

    card = GPU(name="Test 8GB", memory=8 * 2**30)
    assert max_batch_size(predict, card) > 0
    assert len(calls) == len(set(calls)) == 4, calls


@settings(max_examples=40, deadline=None)
@given(
    fixed=st.integers(0, 10**6),
    per_sample=st.integers(0, 10**4),
    quadratic=st.integers(0, 50),
    budget=st.integers(10**6, 10**8),
)
def test_max_batch_size_bisects_when_memory_is_not_affine(fixed, per_sample, quadratic, budget):
    def total(b):
        return fixed + per_sample * b + quadratic * b * b + b  # + b: always grows

    def predict(b):
        return MemoryEstimate(weights=fixed, activations=total(b) - fixed)

    usable = Margin(0.0).usable(budget)
    chosen = max_batch_size(predict, budget, margin=0.0)
    # total() strictly grows, so this pins the largest fitting size exactly.
    assert chosen == 0 or total(chosen) <= usable
    assert total(chosen + 1) > usable


def test_max_batch_size_handles_a_peak_that_is_flat_at_small_batches():
    # The optimizer step (10_000 bytes) sets the peak until activations pass it.
    def predict(b):
        return MemoryEstimate(weights=1000, workspace=max(10_000, 100 * b))

    assert max_batch_size(predict, 51_000, margin=0.0) == 500


def test_max_batch_size_explains_bad_inputs():
    with pytest.raises(ValueError, match="does not grow with the batch"):
        max_batch_size(line(10, 0), 1000)
    with pytest.raises(TypeError, match="must return a torchfit MemoryEstimate"):
        max_batch_size(lambda b: b * 100, 1000)
    with pytest.raises(TypeError, match="AffineEstimate or a callable"):
        max_batch_size(42, 1000)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="neither a size such as '12GB' nor a GPU name"):
        max_batch_size(line(10, 1), "RTX 9999 Ultra")


# -------------------------------------------------------------------------- simulate_gpu


def test_simulated_card_raises_a_cuda_like_out_of_memory_error():
    accelerate_memory = pytest.importorskip("accelerate.utils.memory")
    with simulate_gpu("1MiB") as card:
        kept = torch.empty(200_000)  # 800,256 bytes after rounding
        with pytest.raises(torch.OutOfMemoryError) as caught:
            torch.empty(100_000)
    message = str(caught.value)
    assert message.startswith("CUDA out of memory. Tried to allocate 391.00 KiB.")
    for part in ("simulate_gpu", "1.00 MiB total capacity", "781.50 KiB already allocated"):
        assert part in message
    assert is_oom(caught.value)
    assert accelerate_memory.should_reduce_batch_size(caught.value)
    assert card.ooms == 1
    assert card.demand == _rounded(800_000) + _rounded(400_000)
    del kept


def _rounded(nbytes):
    return -(-nbytes // BLOCK) * BLOCK


def test_a_caught_simulated_oom_is_freed_without_garbage_collection():
    # As with a real CUDA OOM (raised in C++), leaving the except block frees the failed
    # step's tensors by reference counting; handlers that collect inside it (accelerate)
    # must not find them still alive afterwards.
    def step():
        held = torch.empty(200_000)
        more = torch.empty(200_000)
        return held, more

    with simulate_gpu("1MiB"):  # the first dispatch imports torch._dynamo lazily, and
        torch.empty(1)  # a frame of that import keeps its caller's frame: warm up first
    gc.collect()
    gc.disable()
    try:
        with simulate_gpu("1MiB") as card:
            caught = False  # not pytest.raises: its ExceptionInfo keeps the frames alive
            try:
                step()
            except torch.OutOfMemoryError:
                caught = True
            assert caught
            assert card.live == 0
    finally:
        gc.enable()


def test_simulated_card_counts_frees_views_and_in_place_growth():
    outside = torch.zeros(1000)
    with simulate_gpu("10MiB", used=1000) as card:
        assert card.live == 1000
        a = torch.ones(1000)
        assert card.live == 1000 + _rounded(4000)
        view = a[10:].view(-1, 10)
        assert card.live == 1000 + _rounded(4000)  # a view is no new memory
        _ = outside[:10]  # nor is a view of an untracked tensor
        assert card.live == 1000 + _rounded(4000)
        del a
        assert card.live == 1000 + _rounded(4000)  # the view keeps the storage alive
        del view
        assert card.live == 1000
        grow = torch.empty(0)
        grow.resize_(5000)
        assert card.live == 1000 + _rounded(20_000)
        made = torch.tensor([1.0, 2.0])  # made outside dispatch, lifted in: still counted
        assert card.live == 1000 + _rounded(20_000) + BLOCK
        del grow, made
        assert card.live == 1000
        assert card.peak == 1000 + _rounded(20_000) + BLOCK


def test_simulated_card_counts_tracked_tensors_and_refuses_a_model_that_does_not_fit():
    net = torch.nn.Linear(256, 256)  # 263,168 bytes
    with simulate_gpu("1MiB", track=net) as card:
        assert card.live == _rounded(256 * 256 * FLOAT) + _rounded(256 * FLOAT)
        net.weight.grad = torch.zeros_like(net.weight)
        assert card.live == 2 * _rounded(256 * 256 * FLOAT) + _rounded(256 * FLOAT)
    with pytest.raises(torch.OutOfMemoryError, match="tracked tensors alone hold"):
        simulate_gpu("100KiB", track=net).__enter__()
    assert not _simulate._ACTIVE


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_simulated_peak_matches_the_real_cpu_allocator(kind):
    torch.manual_seed(0)
    if kind == "mlp":
        net = torch.nn.Sequential(
            torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
        )
        x = torch.randn(64, 256)
    else:
        net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.Flatten(),
            torch.nn.Linear(16 * 16 * 16, 10),
        )
        x = torch.randn(32, 3, 16, 16)
    opt = torch.optim.AdamW(net.parameters())

    def step():
        net(x).square().mean().backward()
        opt.step()
        opt.zero_grad()

    step()  # optimizer state exists before both measurements
    gc.collect()
    real = measure_peak(step, track=(net, opt, x), device="cpu").peak
    with simulate_gpu("1GiB", track=(net, opt, x)) as card:
        step()
    # The card rounds each storage up to 512 bytes, and cannot see kernel scratch
    # (the CNN's convolution backward): it may read a little high or a little low.
    assert abs(card.peak - real) / real < 0.02


def test_simulated_cards_nest_and_unwind_on_errors():
    with simulate_gpu("4MiB") as outer:
        with pytest.raises(torch.OutOfMemoryError, match="'1MiB'"), simulate_gpu("1MiB"):
            torch.empty(2 * MiB // FLOAT)
        kept = torch.empty(2 * MiB // FLOAT)  # the inner card is gone; the outer allows it
        assert outer.live == 2 * MiB
        with pytest.raises(ZeroDivisionError), simulate_gpu("8MiB"):
            _ = 1 / 0
        assert [outer] == _simulate._ACTIVE
    assert not _simulate._ACTIVE
    del kept
    big = torch.empty(16 * MiB // FLOAT)  # no card left to refuse it
    assert big.numel() == 4 * MiB


def test_fake_tensors_cost_a_simulated_card_nothing():
    with simulate_gpu("1MiB") as card:
        with FakeTensorMode():
            big = torch.empty(10**8)  # 400 MB, on paper only
            _ = big + 1
        assert card.live == 0
        assert card.ooms == 0


def test_a_predictor_runs_outside_the_card():
    # The predictor allocates (as a real-tensor estimator might); that is not the step's memory.
    def predict(batch_size):
        scratch = torch.empty(MiB)  # 4 MiB: more than the card
        del scratch
        return line(0, 2 * PER_SAMPLE_FLOATS * FLOAT).at(batch_size)

    with simulate_gpu("1MiB") as card:
        result = find_batch_size(affine_step, predict=predict)()
    assert result.ooms == 0
    assert card.ooms == 0


def test_a_simulated_card_cannot_be_entered_twice():
    card = simulate_gpu("1MiB")
    with card, pytest.raises(RuntimeError, match="already active"), card:
        pass
    assert not _simulate._ACTIVE


def test_simulate_gpu_rejects_an_empty_card():
    with pytest.raises(ValueError, match="capacity > 0"):
        simulate_gpu(0)


# ------------------------------------------------------------------- find_batch_size forms

PER_SAMPLE_FLOATS = 1024  # 4 KiB per sample (a multiple of the 512-byte block)


def affine_step(batch_size, *, times=2):
    """Peak above the resident bytes: times * batch * 4 KiB, exactly."""
    act = torch.empty(batch_size * PER_SAMPLE_FLOATS)
    extra = [act + 1 for _ in range(times - 1)]
    del act, extra


def true_max(capacity, resident, times=2):
    return (capacity - resident) // (times * PER_SAMPLE_FLOATS * FLOAT)


def test_find_batch_size_as_a_bare_decorator():
    @find_batch_size
    def step(batch_size, scale, *, shift=0):
        calls.append((batch_size, scale, shift))

    calls = []
    result = step(3, shift=1)
    assert isinstance(result, BatchSizeResult)
    assert result.batch_size == 128  # no prediction, no card: accelerate's start
    assert calls == [(128, 3, 1)]
    assert list(inspect.signature(step).parameters) == ["scale", "shift"]
    assert step.__name__ == "step"


def test_find_batch_size_as_a_decorator_with_arguments():
    @find_batch_size(start=4096, batch_limit=300)
    def step(batch_size):
        affine_step(batch_size)

    with simulate_gpu("1MiB"):
        result = step()
    assert result.batch_size <= true_max(MiB, 0)
    assert result.trials[0].batch_size == 300


def test_find_batch_size_as_a_plain_function():
    search = find_batch_size(affine_step, predict=line(0, 2 * PER_SAMPLE_FLOATS * FLOAT))
    with simulate_gpu("1MiB"):
        result = search(times=2)
    assert result.predicted == solve_batch_size(line(0, 8192), MiB, margin=0.02)
    assert result.batch_size == result.predicted
    assert (result.real_steps, result.ooms) == (1, 0)


def test_find_batch_size_checks_the_step_signature():
    with pytest.raises(TypeError, match=r"step\(batch_size, \.\.\.\)"):
        find_batch_size(lambda: None)
    with pytest.raises(TypeError, match="accumulation_steps"):
        find_batch_size(lambda batch_size: None, effective_batch_size=8)
    search = find_batch_size(lambda batch_size, x: None, start=2)
    with pytest.raises(TypeError, match="passes the first 1 itself"):
        search(2, 3)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"start": 0}, ValueError, "start must be >= 1; got 0"),
        ({"batch_limit": 2.5}, TypeError, "batch_limit must be a whole number"),
        ({"start": 4, "predict": line(0, 1)}, ValueError, "either predict= .* or start="),
        ({"predict": "big"}, TypeError, "AffineEstimate or a callable"),
        ({"budget": "lots"}, ValueError, "cannot read 'lots'"),
        ({"margin": "some"}, TypeError, "margin must be a fraction such as 0.1, a Margin, or None"),
        ({"max_trials": 0}, ValueError, "max_trials must be >= 1; got 0"),
    ],
)
def test_find_batch_size_rejects_bad_options_at_once(options, error, message):
    with pytest.raises(error, match=message):
        find_batch_size(affine_step, **options)


def test_a_prediction_needs_a_budget():
    search = find_batch_size(affine_step, predict=line(0, 1))
    with pytest.raises(ValueError, match="predict= needs a budget"):
        search()


# -------------------------------------------------------------------- find_batch_size search


def test_the_predicted_path_is_one_step_and_no_oom():
    resident = torch.empty(64 * 1024)  # 256 KiB of "model" on the card
    capacity = 2 * MiB
    predict = line(resident.numel() * FLOAT, 2 * PER_SAMPLE_FLOATS * FLOAT)
    with simulate_gpu(capacity, track=resident):
        result = find_batch_size(affine_step, predict=predict)()
    best = true_max(capacity, resident.numel() * FLOAT)
    assert (result.real_steps, result.ooms) == (1, 0)
    assert result.batch_size >= 0.95 * best
    assert result.trials[0].peak <= result.usable


def test_an_underestimate_backs_off_from_what_the_oom_showed():
    # The prediction misses half the activations; the OOM bytes correct it.
    capacity = 4 * MiB
    predict = line(0, PER_SAMPLE_FLOATS * FLOAT)
    with simulate_gpu(capacity):
        result = find_batch_size(affine_step, predict=predict)()
    assert result.trials[0].outcome is TrialOutcome.OOM
    assert 0.95 * true_max(capacity, 0) <= result.batch_size <= true_max(capacity, 0)
    # accelerate's rule (x 0.9 per OOM) needs 7 OOMs to get from 2x too big to a fit.
    assert (result.real_steps, result.ooms) == (2, 1)


def test_a_second_oom_in_a_row_at_least_halves():
    # Memory arrives in 4 KiB pieces, so an OOM reports barely more than the card: a
    # weak bound. Trusting it would creep down ~2% per OOM from 1000 to 64 (1000, 976,
    # 952, ...); the first OOM shrinks by a real factor instead, then each one halves.
    def step(batch_size):
        pieces = [torch.empty(PER_SAMPLE_FLOATS) for _ in range(4 * batch_size)]
        del pieces

    with simulate_gpu("1MiB"):
        result = find_batch_size(step, start=1000)()
    failed = [t.batch_size for t in result.trials if t.outcome is TrialOutcome.OOM]
    best = MiB // (4 * PER_SAMPLE_FLOATS * FLOAT)
    assert failed[:2] == [1000, 700]  # x0.7: the bound (976) is not trusted
    assert all(b2 <= b1 // 2 for b1, b2 in itertools.pairwise(failed[1:]))  # then halving
    assert 0.95 * best <= result.batch_size <= best  # the measured step closes the gap
    assert result.trials[-1].reason == "refine"
    assert result.ooms <= 6


def test_probing_upward_reaches_the_true_maximum_from_a_small_start():
    capacity = 4 * MiB
    with simulate_gpu(capacity):
        result = find_batch_size(affine_step, start=4, probe_upward=True)()
    best = true_max(capacity, 0)
    assert 0.95 * best <= result.batch_size <= best
    assert (result.real_steps, result.ooms) == (2, 0)  # one at 4, one at the solved size


def test_probing_upward_without_measurements_doubles_then_bisects():
    limit = 37

    def step(batch_size):
        if batch_size > limit:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB.")

    result = find_batch_size(step, start=2, probe_upward=True, max_trials=20)()
    assert result.batch_size == limit
    assert [t.batch_size for t in result.trials][:5] == [2, 4, 8, 16, 32]


def test_a_measured_pick_keeps_the_margin():
    # start= lands inside the margin: the verified size shrinks to respect it, no extra step.
    capacity = 4 * MiB
    near_full = true_max(capacity, 0)
    with simulate_gpu(capacity):
        result = find_batch_size(affine_step, start=near_full, margin=0.25)()
    assert result.real_steps == 1
    assert result.trials[0].outcome is TrialOutcome.OK
    assert result.batch_size == Margin(0.25).usable(capacity) // (2 * PER_SAMPLE_FLOATS * FLOAT)


def test_max_trials_bounds_the_search_and_no_fit_is_an_oom_error():
    def never(batch_size):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB.")

    with pytest.raises(torch.OutOfMemoryError, match="found no batch size that fits"):
        find_batch_size(never, start=8)()
    calls = []

    def counting(batch_size):
        calls.append(batch_size)
        never(batch_size)

    with pytest.raises(torch.OutOfMemoryError, match="no batch size"):
        find_batch_size(counting, start=10**9, max_trials=3)()
    assert len(calls) == 3


def test_errors_that_are_not_oom_pass_through_untouched():
    net = torch.nn.Linear(4, 4)
    before = copy.deepcopy(net.state_dict())
    error = ValueError("a bug in the step")

    def step(batch_size):
        with torch.no_grad():
            net.weight.add_(1.0)
        raise error

    with pytest.raises(ValueError, match="a bug in the step") as caught:
        find_batch_size(step, start=8, restore=net)()
    assert caught.value is error
    assert torch.equal(net.weight, before["weight"])  # restored on the way out


def test_effective_batch_size_scales_accumulation():
    seen = []

    @find_batch_size(effective_batch_size=96)
    def step(batch_size, accumulation_steps):
        seen.append((batch_size, accumulation_steps))
        for _ in range(accumulation_steps):
            affine_step(batch_size)

    with simulate_gpu("1MiB"):
        result = step()
    assert result.batch_size * result.accumulation_steps == 96 == result.effective_batch_size
    assert result.batch_size <= true_max(MiB, 0)
    assert all(b * steps >= 96 for b, steps in seen)
    assert "effective 96" in str(result)


@settings(max_examples=80, deadline=None)
@given(effective=st.integers(1, 5000), cap=st.integers(1, 5000))
def test_split_keeps_the_effective_batch(effective, cap):
    micro, steps = split_effective(effective, cap)
    assert 1 <= micro <= cap
    assert micro * steps >= effective
    assert steps == math.ceil(effective / cap) or micro * steps == effective
    if any(
        effective % s == 0
        for s in range(math.ceil(effective / cap), 2 * math.ceil(effective / cap) + 1)
    ):
        assert micro * steps == effective


@settings(max_examples=25, deadline=None)
@given(
    resident_kib=st.integers(0, 512),
    times=st.integers(1, 4),
    error=st.floats(0.5, 1.5),
    capacity_kib=st.integers(1024, 8192),
)
def test_any_prediction_error_ends_in_a_size_that_runs(resident_kib, times, error, capacity_kib):
    resident = torch.empty(resident_kib * 256)
    capacity = capacity_kib * 1024
    per_sample = times * PER_SAMPLE_FLOATS * FLOAT
    predict = line(resident.numel() * FLOAT, max(1, round(per_sample * error)))
    best = true_max(capacity, resident.numel() * FLOAT, times)
    with simulate_gpu(capacity, track=resident) as card:
        search = find_batch_size(affine_step, predict=predict, max_trials=20)
        if best == 0:
            with pytest.raises(torch.OutOfMemoryError):
                search(times=times)
            return
        result = search(times=times)
        card.reset_peak()
        affine_step(result.batch_size, times=times)  # runs, and within the margin
        assert card.peak <= Margin(0.02).usable(capacity) or result.batch_size == 1
    assert result.batch_size <= best
    if error >= 1:  # an over-estimate never hits an OOM
        assert result.ooms == 0


# ---------------------------------------------------------------------------- warm-up


def _adam_probe(*, warmup):
    torch.manual_seed(0)
    net = torch.nn.Linear(512, 512)
    opt = torch.optim.Adam(net.parameters())

    def step(batch_size):
        net(torch.randn(batch_size, 512)).square().mean().backward()
        opt.step()
        opt.zero_grad()

    with simulate_gpu(10 * MiB, track=(net, opt)) as card:
        search = find_batch_size(
            step, start=2, probe_upward=True, restore=(net, opt), warmup=warmup
        )
        result = search()
        assert not opt.state  # restored to "no state yet"
        ooms = card.ooms
        try:
            for _ in range(3):  # the steady state: Adam's moments alive during the step
                step(result.batch_size)
        except torch.OutOfMemoryError:
            return result, False
        assert card.ooms == ooms
    return result, True


def test_a_fresh_optimizer_gets_a_warm_up_step_first():
    result, steady_state_fits = _adam_probe(warmup=None)
    assert result.trials[0].reason == "warm-up"
    assert result.trials[0].batch_size == 2
    assert steady_state_fits


def test_without_the_warm_up_the_pick_fails_in_the_steady_state():
    # The control: probing from the first step (which creates Adam's state only at its
    # end) over-estimates what fits.
    result, steady_state_fits = _adam_probe(warmup=False)
    assert result.trials[0].reason == "start"
    assert not steady_state_fits


# ------------------------------------------------------------------------- state safety


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(32, 64),
            torch.nn.BatchNorm1d(64),
            torch.nn.Dropout(0.5),
            torch.nn.ReLU(),
            torch.nn.Linear(64, 8),
        )

    def forward(self, x):
        return self.body(x)


def _state(net, opt, scheduler):
    return {
        "params": [p.detach().clone() for p in net.parameters()],
        "grads": [None if p.grad is None else p.grad.clone() for p in net.parameters()],
        "buffers": [b.clone() for b in net.buffers()],
        "training": [m.training for m in net.modules()],
        "opt": copy.deepcopy(opt.state_dict()),
        "scheduler": copy.deepcopy(scheduler.state_dict()),
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
        "numpy_rng": np.random.get_state()[1].copy(),  # noqa: NPY002
    }


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    return a == b


def _stateful_setup(with_grads):
    torch.manual_seed(1)
    net = Net()
    opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    net(torch.randn(8, 32)).sum().backward()
    opt.step()
    scheduler.step()
    if not with_grads:
        opt.zero_grad()
    net.eval()  # a mode the step changes

    def step(batch_size):
        net.train()
        x = torch.randn(batch_size, 32)
        random.random()  # noqa: S311 - advances the RNG the probe must restore
        np.random.rand()  # noqa: NPY002
        net(x).square().mean().backward()
        opt.step()
        scheduler.step()
        if batch_size > 40:
            torch.empty(batch_size * 10**4)  # out of memory on the card below

    return net, opt, scheduler, step


@pytest.mark.parametrize("with_grads", [False, True])
def test_a_probe_restores_everything_bitwise(with_grads):
    net, opt, scheduler, step = _stateful_setup(with_grads)
    before = _state(net, opt, scheduler)
    with simulate_gpu("2MiB", track=(net, opt)):
        result = find_batch_size(
            step, start=100, probe_upward=True, restore=(net, opt, scheduler)
        )()
    assert result.ooms >= 1
    assert all(t.outcome is TrialOutcome.OK for t in result.trials if t.batch_size <= 40)
    assert _same(before, _state(net, opt, scheduler))


def test_without_restore_the_same_probe_changes_the_model():
    # The control for the test above: the step does change everything it touches.
    net, opt, scheduler, step = _stateful_setup(with_grads=False)
    before = _state(net, opt, scheduler)
    with simulate_gpu("2MiB", track=(net, opt)):
        find_batch_size(step, start=100)()
    after = _state(net, opt, scheduler)
    for key in ("params", "buffers", "training", "opt", "scheduler", "torch_rng"):
        if key == "torch_rng":
            continue  # RNGs are always restored
        assert not _same(before[key], after[key]), key
    assert _same(before["torch_rng"], after["torch_rng"])


def test_snapshot_copies_do_not_count_on_the_simulated_card():
    net = torch.nn.Linear(256, 256)
    with simulate_gpu("1MiB", track=net) as card:
        live = card.live
        snap = Snapshot((net,))
        assert card.live == live
        snap.restore()
        assert card.live == live


def test_restore_rejects_objects_it_cannot_snapshot():
    with pytest.raises(TypeError, match="restore= got a str"):
        find_batch_size(affine_step, start=1, restore="model")()


# ------------------------------------------------------------------------------- leaks


def _graph_step(net):
    def step(batch_size):
        hidden = net(torch.randn(batch_size, 64))  # a graph with saved activations
        loss = hidden.square().mean()
        torch.empty(batch_size * 10**5)  # out of memory while the graph is alive
        loss.backward()

    return step


def _live_tensors():
    gc.collect()
    # type(), not isinstance(): isinstance reads __class__, which some torch objects
    # answer with a deprecation warning.
    return sum(issubclass(type(obj), torch.Tensor) for obj in gc.get_objects())


def test_fifty_ooms_in_a_row_leak_nothing():
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    step = _graph_step(net)
    options = Options(None, None, None, None, False, None, None, (net,), False, 100)
    with simulate_gpu("4MiB", track=net) as card:
        search = Search(lambda b, _steps: step(b), options)
        state = Snapshot((net,))
        gc.collect()
        live, tensors = card.live, _live_tensors()
        for _ in range(50):
            assert not search.trial(64, "back-off", state, accumulation=1)
        assert card.ooms == 50
        assert card.live == live
        assert _live_tensors() == tensors


def test_the_leak_check_can_fail():
    # Keeping the caught errors (as a naive handler might) keeps their frames' tensors.
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    step = _graph_step(net)
    kept = []
    with simulate_gpu("4MiB", track=net) as card:
        live = card.live
        for _ in range(5):
            try:
                step(64)
            except torch.OutOfMemoryError as error:
                kept.append(error)
        assert card.live > live
    kept.clear()


def test_repeated_searches_with_ooms_return_to_the_same_live_bytes():
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    step = _graph_step(net)
    with simulate_gpu("4MiB", track=net) as card:
        gc.collect()
        live = card.live
        results = [find_batch_size(step, start=64, restore=net)() for _ in range(10)]
        gc.collect()
        assert card.live == live
    assert sum(r.ooms for r in results) >= 10


# ------------------------------------------------------------------------------- results


def test_result_table_and_dict():
    with simulate_gpu("1MiB"):
        result = find_batch_size(affine_step, start=1000)()
    text = str(result)
    assert "BatchSizeResult: batch size" in text
    assert "oom" in text
    assert "out of memory" in text.splitlines()[-1]
    data = result.to_dict()
    assert data["batch_size"] == result.batch_size
    assert data["ooms"] == result.ooms
    assert data["trials"][0]["outcome"] == "oom"
    assert data["trials"][0]["error"].startswith("CUDA out of memory.")


# --------------------------------------------------------------------------- distributed


def _distributed_worker(rank, world_size, store_path, capacities, results_path):
    dist.init_process_group(
        "gloo", init_method=f"file://{store_path}", rank=rank, world_size=world_size
    )
    try:
        with simulate_gpu(capacities[rank]):
            result = find_batch_size(affine_step, start=4, probe_upward=True)()
        torch.save(
            {"batch_size": result.batch_size, "sizes": [t.batch_size for t in result.trials]},
            f"{results_path}.{rank}",
        )
    finally:
        dist.destroy_process_group()
    leave()


def test_ranks_agree_on_the_smallest_batch(tmp_path):
    capacities = [4 * MiB, 2 * MiB]
    start_ranks(
        _distributed_worker,
        (2, str(tmp_path / "store"), capacities, str(tmp_path / "result")),
        2,
    )
    results = [torch.load(tmp_path / f"result.{rank}") for rank in range(2)]
    assert results[0] == results[1]  # every size tried, and the answer, agreed
    with simulate_gpu(capacities[1]):
        alone = find_batch_size(affine_step, start=4, probe_upward=True)()
    assert results[0]["batch_size"] == alone.batch_size
