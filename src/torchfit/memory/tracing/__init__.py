"""The traced estimator: the real step on fake tensors, its live storages counted op by op."""

from torchfit.memory.tracing.result import Event, Trace, TracedStorage
from torchfit.memory.tracing.tracer import TraceDevice, trace, trace_events
from torchfit.memory.tracing.user_step import trace_step

# The event record is defined in the private bottom layer (the one ledger); its public
# home is here, where a `Trace` hands its events out.
Event.__module__ = __name__

__all__ = [
    "Event",
    "Trace",
    "TraceDevice",
    "TracedStorage",
    "trace",
    "trace_events",
    "trace_step",
]
