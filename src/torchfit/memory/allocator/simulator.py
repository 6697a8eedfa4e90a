"""Replaying an allocation trace through the caching-allocator model.

A trace is the ordered list of allocations and frees of a step: the `Event` list that
`torchfit.memory.trace_events` records (``Trace.events``, taken as it is), or plain
tuples. `replay` runs it through a fresh `CachingAllocator` and returns its counters:
this is how an exact allocation sequence becomes ``max_memory_reserved``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from torchfit._core import checks
from torchfit._core.ledger import Event
from torchfit.memory.allocator.caching import CachingAllocator
from torchfit.memory.allocator.rules import AllocatorStats

__all__ = ["CachingAllocator", "replay"]


def _parse(index: int, event: object) -> tuple[object, int | None]:
    """``(key, nbytes)`` of an event; ``nbytes`` is ``None`` for a free."""
    if isinstance(event, Event):
        if event.kind not in ("alloc", "free"):
            raise ValueError(f"events[{index}] is {event!r}; an Event's kind is 'alloc' or 'free'")
        return event.id, _bytes(index, event.nbytes) if event.kind == "alloc" else None
    if not isinstance(event, Sequence) or isinstance(event, str) or len(event) not in (1, 2):
        raise ValueError(
            f"events[{index}] is {event!r}; expected an Event, (key, nbytes) to allocate or "
            "(key,) / (key, None) to free"
        )
    nbytes = event[1] if len(event) == 2 else None  # (key, nbytes) or (key, None)
    return event[0], None if nbytes is None else _bytes(index, nbytes)


_BYTES = checks.whole()


def _bytes(index: int, nbytes: object) -> int:
    """An allocation's size, or the error that names the event."""
    if type(nbytes) is int and nbytes >= 0:  # once per event: the common case kept cheap
        return nbytes
    return int(_BYTES(f"events[{index}] nbytes", nbytes))


@checks.arguments(capacity=checks.whole(at_least=1))
def replay(
    events: Iterable[Event | Sequence[object]],
    *,
    capacity: int | None = None,
    max_split_size: int | None = None,
    roundup_power2_divisions: int = 0,
) -> AllocatorStats:
    """Run a sequence of allocations and frees through a fresh `CachingAllocator`.

    This is how an exact allocation trace (e.g. the storage allocations recorded by the
    fake-tensor tracer, in order) becomes ``max_memory_reserved``.

    Args:
        events: In order, either `Event` tuples (``Event("alloc", id, nbytes)`` and
            ``Event("free", id, nbytes)``, as ``Trace.events`` holds them), or
            ``(key, nbytes)`` to allocate ``nbytes`` under ``key`` (any hashable id, e.g.
            a storage id) and ``(key,)`` or ``(key, None)`` to free it. A key may be
            reused once freed; an `Event`'s key is its ``id``.
        capacity: See `CachingAllocator`.
        max_split_size: See `CachingAllocator`.
        roundup_power2_divisions: See `round_request`.

    Returns:
        The allocator's `AllocatorStats` after the last event (peaks over the whole run).

    Raises:
        ValueError: An event is malformed, allocates a live key, or frees an unknown key.
        TypeError: An allocation's size is not an int.
        torch.OutOfMemoryError: The trace does not fit in ``capacity``.

    Example:
        >>> MiB = 2**20
        >>> s = replay([("a", 3 * MiB), ("b", 3 * MiB), ("a",), ("c", 16 * MiB)])
        >>> s.peak_allocated // MiB, s.peak_reserved // MiB, s.num_segments
        (19, 36, 2)
        >>> trace = [Event("alloc", 0, 3 * MiB), Event("alloc", 1, 3 * MiB)]
        >>> trace += [Event("free", 0, 3 * MiB), Event("alloc", 2, 16 * MiB)]
        >>> replay(trace) == s
        True
    """
    allocator = CachingAllocator(
        capacity=capacity,
        max_split_size=max_split_size,
        roundup_power2_divisions=roundup_power2_divisions,
    )
    handles: dict[object, int] = {}
    for index, event in enumerate(events):
        key, nbytes = _parse(index, event)
        if nbytes is None:
            if key not in handles:
                raise ValueError(
                    f"events[{index}] frees {key!r}, which is not allocated; every free needs "
                    "an earlier (key, nbytes) allocation in the same trace"
                )
            allocator.free(handles.pop(key))
            continue
        if key in handles:
            raise ValueError(
                f"events[{index}] allocates {key!r}, which is still allocated; free it first "
                "or use a fresh key"
            )
        handles[key] = allocator.malloc(nbytes)
    return allocator.stats()
