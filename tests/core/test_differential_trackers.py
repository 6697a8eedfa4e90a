"""The dispatch trackers on the ledger count what the frozen legacy trackers counted.

Each random program (`programs.py`) runs twice on fresh tensors: under the legacy
implementation (commit 71111e7, `legacy_tracker.py`, `legacy_simulate.py`) and under
the ledger-based one. Every figure must be identical: live and peak bytes after every
instruction, the event list (ids, kinds, bytes), the history and the tags of the trace
tracker; the live, peak, demand and refusals of `simulate_gpu`; the live and peak bytes
of `LiveBytes`.
"""

from __future__ import annotations

import gc

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensorMode

from core.legacy_simulate import LegacyLiveBytes, LegacySimulatedGPU
from core.legacy_tracker import LegacyTracker
from core.programs import GROWTH_OPS, TENSOR_OPS, programs, run, traced_programs
from torchfit.memory.batch.simulate import SimulatedGPU
from torchfit.memory.modules.live import LiveBytes
from torchfit.memory.tracing.tracker import Tracker


def _quiet_gc(fn):
    """Run ``fn`` with automatic collection off: frees come from reference counting only."""
    gc.disable()
    try:
        return fn()
    finally:
        gc.enable()


# -- the trace's tracker --------------------------------------------------------------------


def _run_tracker(tracker, program, *, block):
    """Run ``program`` on fake tensors under ``tracker``; return what it counted."""
    seen = []

    def other(instruction, env, target):
        name, *args = instruction
        if name == "tag" and target is not None:
            tracker.tag(target, args[1])
        elif name == "scratch":
            tracker.transient(args[0], "block", "aten.mm.default")
        elif name == "start":
            live = [t for t in env if t is not None]
            rows = [
                (t, "weights" if i % 2 else "activations", f"(t{i})") for i, t in enumerate(live)
            ]
            seen.append(("dropped", tracker.start(rows)))
        elif name == "stop":
            tracker.stop()
        tracker.drain()
        seen.append((tracker.live, tracker.peak, tracker.peak_index, tracker.peak_where))

    def go():
        with FakeTensorMode(), tracker:
            env = []
            run(program, env, other)
            del env
        tracker.stop()

    _quiet_gc(go)
    seen.append((tracker.live, tracker.peak, tracker.peak_index, tracker.peak_where))
    return seen


def _old_events(events):
    return [tuple(event) for event in events]


def _new_events(events):
    sizes = {}
    out = []
    for event in events:
        if event.kind == "alloc":
            sizes[event.id] = event.nbytes
            out.append(tuple(event))
        else:
            assert event.nbytes == sizes.pop(event.id)  # a free carries its allocation's bytes
            out.append((event.kind, event.id))
    return out


@settings(max_examples=120)
@given(
    program=traced_programs(),
    block=st.sampled_from([1, 512]),
)
def test_tracker_counts_every_program_like_the_legacy_tracker(program, block):
    old, new = LegacyTracker(block=block), Tracker(block=block)
    assert _run_tracker(new, program, block=block) == _run_tracker(old, program, block=block)
    assert _new_events(new.events) == _old_events(old.events)
    assert new.history == old.history
    assert new.tags == old.tags


def test_the_differential_program_exercises_frees_resizes_and_the_peak():
    """A fixed program through both, checked against hand-counted figures too."""
    program = [
        ("new", 100),  # 400 bytes
        ("start",),
        ("view", 0, "slice"),
        ("new", 50),  # 200 bytes: 600 live
        ("resize", 0, 300),  # the first storage grows 400 -> 1200: free + alloc
        ("del", 1),  # the view: nothing freed
        ("scratch", 1000),  # 1200 + 200 + 1000 at the peak
        ("del", 0),
        ("stop",),
    ]
    old, new = LegacyTracker(), Tracker()
    assert _run_tracker(new, program, block=1) == _run_tracker(old, program, block=1)
    assert new.peak == 2400
    assert [event.kind for event in new.events] == [
        "alloc",  # the baseline storage
        "alloc",
        "free",  # the resize
        "alloc",
        "alloc",  # the scratch ...
        "free",  # ... freed at once
        "free",  # the grown storage, once its last tensor is gone
    ]
    assert _new_events(new.events) == _old_events(old.events)


# -- simulate_gpu's card -----------------------------------------------------------------


def _run_card(kind, program, *, capacity, used, tracked):
    outside = torch.ones(64)  # made before entry: tracked, or a view of it is free
    card = kind(capacity, name="test card", track=(outside,) if tracked else (), used=used)
    seen = []

    def go():
        try:
            with card:
                env = [outside]
                try:
                    run(program, env, lambda *_: seen.append((card.live, card.peak, card.demand)))
                except torch.OutOfMemoryError as error:
                    seen.append(("oom", str(error)))
                seen.append((card.live, card.peak, card.demand, card.ooms))
                del env
        except torch.OutOfMemoryError as error:  # the tracked tensor alone does not fit
            seen.append(("refused", str(error)))
        seen.append((card.live, card.peak, card.demand, card.ooms))

    _quiet_gc(go)
    return seen


@settings(max_examples=120)
@given(
    program=programs(TENSOR_OPS, GROWTH_OPS, min_size=15, size=60),
    capacity=st.integers(2_000, 40_000),
    used=st.integers(0, 3_000),
    tracked=st.booleans(),
)
def test_simulated_card_counts_and_refuses_like_the_legacy_card(program, capacity, used, tracked):
    options = {"capacity": capacity, "used": used, "tracked": tracked}
    for kind in (LegacySimulatedGPU, SimulatedGPU):  # the first dispatch imports lazily, and
        _run_card(kind, [("new", 10**4)], **options)  # a frame of that import stays alive
    checked = [step for instruction in program for step in (instruction, ("check",))]
    legacy = _run_card(LegacySimulatedGPU, checked, **options)
    assert _run_card(SimulatedGPU, checked, **options) == legacy


# -- LiveBytes -----------------------------------------------------------------------------


def _run_live(counter, program, excluded):
    seen = []

    def other(*_):
        seen.append((counter.live, counter.peak))

    def go():
        counter.exclude(excluded)
        with torch.device("meta"), counter:
            env = list(excluded)
            run([*program, ("check",)], env, other)
            del env
        seen.append((counter.live, counter.peak))

    _quiet_gc(go)
    return seen


@settings(max_examples=100)
@given(program=programs(TENSOR_OPS, [st.tuples(st.just("check"))], min_size=15, size=60))
def test_live_bytes_counts_every_program_like_the_legacy_counter(program):
    excluded = [torch.ones(32, device="meta"), torch.ones(8, device="meta")]
    assert _run_live(LiveBytes(), program, excluded) == _run_live(
        LegacyLiveBytes(), program, excluded
    )


def test_live_bytes_now_sees_growth_in_place_where_the_legacy_counter_did_not():
    """The one deliberate difference: a storage resized in place counts its new size."""
    program = [("new", 10), ("resize", 0, 1000), ("check",)]
    assert _run_live(LiveBytes(), program, [])[0] == (4000, 4000)
    assert _run_live(LegacyLiveBytes(), program, [])[0] == (40, 40)
