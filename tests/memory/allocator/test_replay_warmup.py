"""`replay` after a warm-up: the step starts in the segments the warm-up step left.

A step measured after a warm-up step (``reset_peak_memory_stats()`` between them) starts
with every segment the warm-up reserved, holes included: reserved memory never goes down
by itself. ``replay(step, warmup=...)`` runs the warm-up's events first, resets the
peaks, and takes the step's allocation of a storage still live from the warm-up as done.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torchfit.memory.allocator import replay, to_device
from torchfit.memory.gpus import GPU
from torchfit.memory.result import MemoryEstimate

MiB = 2**20

# The warm-up holds a 40 MiB transient; the step (which starts with "w") needs 24 MiB.
WARM = [("w", 8 * MiB), ("t", 40 * MiB), ("t",)]
STEP = [("w", 8 * MiB), ("x", 24 * MiB), ("x",)]


def test_the_step_starts_in_the_segments_the_warm_up_left():
    cold = replay(STEP)
    warm = replay(STEP, warmup=WARM)
    # From nothing: a 20 MiB segment for "w", a 24 MiB one for "x".
    assert (cold.peak_reserved, cold.num_device_allocs) == (44 * MiB, 2)
    # After the warm-up: its 40 MiB segment is still held and "x" fits in it.
    assert (warm.peak_reserved, warm.num_device_allocs) == (60 * MiB, 2)
    assert warm.reserved == replay(WARM).reserved == 60 * MiB


def test_the_peaks_are_reset_between_warm_up_and_step():
    warm = replay(STEP, warmup=WARM)
    assert replay(WARM).peak_allocated == 48 * MiB
    assert warm.peak_allocated == 32 * MiB  # "w" and "x": the warm-up's 48 MiB excluded
    assert warm.allocated == 8 * MiB  # "w" once, not twice


def test_an_empty_warm_up_changes_nothing():
    assert replay(STEP, warmup=[]) == replay(STEP)


def test_a_storage_live_from_the_warm_up_is_taken_as_allocated_once():
    # The step's allocation of "w" is the warm-up's; after that, "w" is an ordinary key.
    stats = replay([("w", 3 * MiB), ("w",), ("w", 5 * MiB)], warmup=[("w", 3 * MiB)])
    assert stats.allocated == 5 * MiB
    with pytest.raises(ValueError, match=r"events\[1\] allocates 'w', which is still allocated"):
        replay([("w", 3 * MiB), ("w", 3 * MiB)], warmup=[("w", 3 * MiB)])
    # A storage the warm-up freed is allocated again.
    assert replay([("w", 3 * MiB)], warmup=[("w", 3 * MiB), ("w",)]).num_device_allocs == 1


def test_a_storage_the_step_does_not_start_with_stays_allocated():
    stats = replay([("x", MiB)], warmup=[("kept", 30 * MiB)])
    assert stats.allocated == 31 * MiB


def test_a_storage_live_from_the_warm_up_keeps_its_size():
    with pytest.raises(ValueError, match="warm-up left it allocated with 3145728"):
        replay([("w", 4 * MiB)], warmup=[("w", 3 * MiB)])


def test_errors_say_which_list_the_event_is_in():
    with pytest.raises(ValueError, match=r"warmup\[1\] frees 'a', which is not allocated"):
        replay([], warmup=[("b", 512), ("a",)])
    with pytest.raises(TypeError, match=r"warmup\[0\] nbytes"):
        replay([], warmup=[("a", 1.5)])


# --- a property: warm-up + step is the warm-up followed by the step's own events --------

_OPS = st.lists(st.tuples(st.booleans(), st.integers(1, 40 * MiB), st.integers(0, 99)), max_size=40)


def _events(ops, prefix, live):
    """Keyed events from (allocate?, size, which) triples; ``live`` is updated."""
    events = []
    for index, (allocate, size, which) in enumerate(ops):
        if allocate or not live:
            key = f"{prefix}{index}"
            live[key] = size
            events.append((key, size))
        else:
            key = sorted(live)[which % len(live)]
            del live[key]
            events.append((key,))
    return events


@settings(max_examples=150, deadline=None)
@given(_OPS, _OPS, st.integers(0, 99))
def test_a_warm_up_replay_ends_where_the_joined_events_end(warm_ops, step_ops, keep):
    live: dict[str, int] = {}
    warm = _events(warm_ops, "w", live)
    step = [(key, live[key]) for key in sorted(live)[: keep % (len(live) + 1)]]  # starts with
    rest = _events(step_ops, "s", live)
    stats = replay(step + rest, warmup=warm)
    joined = replay(warm + rest)
    same = ("allocated", "reserved", "num_segments", "num_device_allocs", "num_device_frees")
    assert [getattr(stats, f) for f in same] == [getattr(joined, f) for f in same]
    after_warm_up = replay(warm)
    assert after_warm_up.reserved <= stats.peak_reserved <= joined.peak_reserved
    assert after_warm_up.allocated <= stats.peak_allocated <= joined.peak_allocated


# --- to_device ------------------------------------------------------------------------


def test_to_device_replays_the_warm_up_first_with_the_workspace_in_it(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    e = MemoryEstimate(weights=8 * MiB, activations=24 * MiB)
    gpu = GPU.custom("lab", memory="80GiB", compute_capability=(8, 0))  # 8,519,680 bytes
    out = to_device(e, gpu=gpu, events=STEP, warmup=WARM, context_bytes=0)
    assert out.reserved == replay(STEP, warmup=[("ws", 8_519_680), *WARM]).peak_reserved
    assert out.reserved != to_device(e, gpu=gpu, events=STEP, context_bytes=0).reserved
    assert any("after 4 of the warm-up step's" in note for note in out.notes)


def test_to_device_needs_the_events_with_a_warm_up():
    with pytest.raises(ValueError, match="warmup= was given without events="):
        to_device(MemoryEstimate(weights=MiB), warmup=WARM, context_bytes=0)
