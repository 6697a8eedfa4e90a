"""`trace_events` on the ledger gives the trace the frozen legacy tracker gave.

Random small models (linear layers, a layer used twice so that its weights are tied,
normalization with running-statistics buffers), every optimizer kind (state or none),
both ``set_to_none`` settings and both targets are traced twice: once with the session
running the legacy `Tracker` and `build_trace` of commit 71111e7 (`legacy_tracker.py`),
once as shipped. The events (ids, kinds, bytes), the storages, the peak and its index,
and the whole estimate must be identical.
"""

from __future__ import annotations

from unittest import mock

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from core.legacy_tracker import LegacyTracker, legacy_build_trace
from torchfit.memory.tracing import session
from torchfit.memory.tracing.tracer import trace_events


def _build(width, hidden, norm, tied, batch):
    torch.manual_seed(0)
    first = nn.Linear(width, hidden)
    layers = [first, nn.GELU()]
    if norm == "layer":
        layers.append(nn.LayerNorm(hidden))
    elif norm == "batch":
        layers.append(nn.BatchNorm1d(hidden))
    layers.append(first if tied and width == hidden else nn.Linear(hidden, width))
    return nn.Sequential(*layers), torch.randn(batch, width)


def _normalized(trace):
    """The trace with free events as ``(kind, id)``: what the legacy tracker recorded."""
    events = tuple(tuple(e) if e[0] == "alloc" else (e[0], e[1]) for e in trace.events)
    return (events, trace.storages, trace.peak, trace.peak_index, trace.ops, trace.estimate)


@settings(max_examples=12)
@given(
    width=st.sampled_from([4, 16, 48]),
    hidden=st.sampled_from([16, 48, 96]),
    norm=st.sampled_from(["none", "layer", "batch"]),
    tied=st.booleans(),
    batch=st.integers(1, 8),
    optimizer=st.sampled_from(["sgd", "sgd-momentum", "adamw", None]),
    set_to_none=st.booleans(),
    device=st.sampled_from(["cpu", "cuda"]),
)
def test_trace_events_match_the_legacy_tracker(
    width, hidden, norm, tied, batch, optimizer, set_to_none, device
):
    model, inputs = _build(width, hidden, norm, tied, max(batch, 2 if norm == "batch" else 1))
    options = {"optimizer": optimizer, "set_to_none": set_to_none, "device": device}
    new = trace_events(model, inputs, **options)
    with (
        mock.patch.object(session, "Tracker", LegacyTracker),
        mock.patch.object(session, "build_trace", legacy_build_trace),
    ):
        old = trace_events(model, inputs, **options)
    assert type(new.events[0]).__name__ == "Event"  # the patch reached only the legacy run
    assert type(old.events[0]).__name__ == "tuple"
    assert _normalized(new) == _normalized(old)
