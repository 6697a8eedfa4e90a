"""One event format: what the trace records is what the allocator model replays."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from torchfit._core.ledger import Event
from torchfit.memory.allocator import replay
from torchfit.memory.tracing.tracer import trace_events

MiB = 2**20

_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("malloc"), st.integers(0, 30 * MiB)),
        st.tuples(st.just("free"), st.integers(0, 100)),
    ),
    max_size=60,
)


@given(_STEPS)
@settings(max_examples=60)
def test_events_replay_exactly_like_the_plain_tuples(steps):
    events, tuples, live, next_id = [], [], [], 0
    for op, arg in steps:
        if op == "malloc":
            events.append(Event("alloc", next_id, arg))
            tuples.append((next_id, arg))
            live.append((next_id, arg))
            next_id += 1
        elif live:
            key, nbytes = live.pop(arg % len(live))
            events.append(Event("free", key, nbytes))
            tuples.append((key,))
    assert replay(events) == replay(tuples)


def test_a_trace_replays_as_it_is():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    traced = trace_events(model, torch.randn(16, 64), optimizer="adamw", device="cuda")
    stats = replay(traced.events)
    assert stats.peak_allocated == traced.peak  # every event is already a 512-byte multiple
    assert stats.allocated == sum(
        e.nbytes if e.kind == "alloc" else -e.nbytes for e in traced.events
    )
    plain = [(e.id, e.nbytes) if e.kind == "alloc" else (e.id,) for e in traced.events]
    assert stats == replay(plain)
    assert traced.allocator_events() == list(traced.events)


@pytest.mark.parametrize(
    ("events", "error", "match"),
    [
        ([Event("grow", 0, 10)], ValueError, "kind is 'alloc' or 'free'"),
        ([Event("free", 0, 10)], ValueError, "not allocated"),
        ([Event("alloc", 0, 10), Event("alloc", 0, 10)], ValueError, "still allocated"),
        ([Event("alloc", 0, 1.5)], TypeError, r"events\[0\] nbytes must be a whole number"),
    ],
)
def test_replay_rejects_malformed_events(events, error, match):
    with pytest.raises(error, match=match):
        replay(events)
