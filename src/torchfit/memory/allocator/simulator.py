"""Replaying an allocation trace through the caching-allocator model.

A trace is the ordered list of allocations and frees of a step: the `Event` list that
`torchfit.memory.tracing.trace_events` records (``Trace.events``, taken as it is), or plain
tuples. `replay` runs it through a fresh `CachingAllocator`, after the warm-up's
events when given (``Trace.warmup_events``: the step then starts from the segments and
holes the warm-up left, as a measured step does), and returns its counters: this is how
an exact allocation sequence becomes ``max_memory_reserved``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from torchfit._core import checks
from torchfit._core.ledger import Event
from torchfit.memory.allocator.caching import CachingAllocator
from torchfit.memory.allocator.rules import K_ROUND_LARGE, AllocatorStats

__all__ = ["CachingAllocator", "replay", "smallest_capacity"]


def _parse(where: str, index: int, event: object) -> tuple[object, int | None]:
    """``(key, nbytes)`` of an event; ``nbytes`` is ``None`` for a free."""
    if isinstance(event, Event):
        if event.kind not in ("alloc", "free"):
            raise ValueError(f"{where}[{index}] is {event!r}; an Event's kind is 'alloc' or 'free'")
        return event.id, _bytes(where, index, event.nbytes) if event.kind == "alloc" else None
    if not isinstance(event, Sequence) or isinstance(event, str) or len(event) not in (1, 2):
        raise ValueError(
            f"{where}[{index}] is {event!r}; expected an Event, (key, nbytes) to allocate or "
            "(key,) / (key, None) to free"
        )
    nbytes = event[1] if len(event) == 2 else None  # (key, nbytes) or (key, None)
    return event[0], None if nbytes is None else _bytes(where, index, nbytes)


_BYTES = checks.whole()


def _bytes(where: str, index: int, nbytes: object) -> int:
    """An allocation's size, or the error that names the event."""
    if type(nbytes) is int and nbytes >= 0:  # once per event: the common case kept cheap
        return nbytes
    return int(_BYTES(f"{where}[{index}] nbytes", nbytes))


class _Run:
    """A `CachingAllocator` driven by keyed events: the live keys and their handles."""

    def __init__(self, allocator: CachingAllocator) -> None:
        self.allocator = allocator
        self.live: dict[object, tuple[int, int]] = {}  # key -> (handle, nbytes)
        self.inherited: dict[object, int] = {}  # live from the warm-up, not yet re-stated

    def feed(self, events: Iterable[Event | Sequence[object]], where: str) -> None:
        allocator, live, inherited = self.allocator, self.live, self.inherited
        for index, event in enumerate(events):
            # a plain (key, nbytes) tuple, the form `step_schedule` writes, skips the checks
            # of every other form (isinstance against the Sequence ABC costs a microsecond)
            nbytes: int | None
            if type(event) is tuple and len(event) == 2 and type(event[1]) is int and event[1] >= 0:
                key, nbytes = event[0], event[1]
            elif type(event) is tuple and len(event) == 1:  # (key,): a free
                key, nbytes = event[0], None
            else:
                key, nbytes = _parse(where, index, event)
            if nbytes is None:
                if key not in live:
                    raise ValueError(
                        f"{where}[{index}] frees {key!r}, which is not allocated; every free "
                        "needs an earlier (key, nbytes) allocation in the same trace"
                    )
                inherited.pop(key, None)
                allocator.free(live.pop(key)[0])
                continue
            if key in inherited:  # the step starts with it: allocated in the warm-up
                if inherited.pop(key) != nbytes:
                    raise ValueError(
                        f"{where}[{index}] allocates {key!r} with {nbytes} bytes, but the "
                        f"warm-up left it allocated with {live[key][1]}; a key the step "
                        "starts with must keep its size (or be freed in the warm-up)"
                    )
                continue
            if key in live:
                raise ValueError(
                    f"{where}[{index}] allocates {key!r}, which is still allocated; free it "
                    "first or use a fresh key"
                )
            live[key] = (allocator.malloc(nbytes), nbytes)

    def end_warmup(self) -> None:
        """Peaks restart here; what is live may be allocated again by the step: done already."""
        self.allocator.reset_peak_stats()
        self.inherited = {key: nbytes for key, (_, nbytes) in self.live.items()}


@checks.arguments(capacity=checks.whole(at_least=1))
def replay(
    events: Iterable[Event | Sequence[object]],
    *,
    warmup: Iterable[Event | Sequence[object]] | None = None,
    capacity: int | None = None,
    max_split_size: int | None = None,
    roundup_power2_divisions: int = 0,
) -> AllocatorStats:
    """Run a sequence of allocations and frees through a fresh `CachingAllocator`.

    This is how an exact allocation trace (e.g. the storage allocations recorded by the
    fake-tensor tracer, in order) becomes ``max_memory_reserved``. With ``warmup``, the
    warm-up's events run first and the peaks are reset after them, as a user measures
    a step after a warm-up step (``torch.cuda.reset_peak_memory_stats()``): the step
    starts with the segments the warm-up reserved and the holes it left in them
    (reserved memory never goes down by itself), not from an empty allocator.

    Args:
        events: In order, either `Event` tuples (``Event("alloc", id, nbytes)`` and
            ``Event("free", id, nbytes)``, as ``Trace.events`` holds them), or
            ``(key, nbytes)`` to allocate ``nbytes`` under ``key`` (any hashable id, e.g.
            a storage id) and ``(key,)`` or ``(key, None)`` to free it. A key may be
            reused once freed; an `Event`'s key is its ``id``.
        warmup: Events in the same form, run before ``events`` (``Trace.warmup_events``).
            A key still allocated after them is the same storage when ``events``
            allocates it (a step's trace starts by allocating what it starts with:
            weights, optimizer state, inputs): that allocation is already done, and
            must have the same size.
        capacity: See `CachingAllocator`.
        max_split_size: See `CachingAllocator`.
        roundup_power2_divisions: See `round_request`.

    Returns:
        The allocator's `AllocatorStats` after the last event; the peaks are over
        ``events`` (from the state the warm-up left, when there is one).

    Raises:
        ValueError: An event is malformed, allocates a live key, frees an unknown key, or
            allocates a key live from the warm-up with another size.
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

        A warm-up that held 40 MiB at once leaves that segment reserved; the step (which
        starts with ``"w"``, already allocated) places its 24 MiB in it:

        >>> step = [("w", 8 * MiB), ("x", 24 * MiB)]
        >>> warm = [("w", 8 * MiB), ("t", 40 * MiB), ("t",)]
        >>> replay(step, warmup=warm).peak_reserved // MiB, replay(step).peak_reserved // MiB
        (60, 44)
    """
    return _replayed(
        events,
        warmup,
        capacity=capacity,
        max_split_size=max_split_size,
        roundup_power2_divisions=roundup_power2_divisions,
    )[0]


def _replayed(
    events: Iterable[Event | Sequence[object]],
    warmup: Iterable[Event | Sequence[object]] | None,
    *,
    capacity: int | None = None,
    max_split_size: int | None = None,
    roundup_power2_divisions: int = 0,
) -> tuple[AllocatorStats, int]:
    """`replay`'s stats, and the peak reserved over the warm-up and the events together."""
    run = _Run(
        CachingAllocator(
            capacity=capacity,
            max_split_size=max_split_size,
            roundup_power2_divisions=roundup_power2_divisions,
        )
    )
    warm_peak = 0
    if warmup is not None:
        run.feed(warmup, "warmup")
        warm_peak = run.allocator.stats().peak_reserved
        run.end_warmup()
    run.feed(events, "events")
    stats = run.allocator.stats()
    return stats, max(warm_peak, stats.peak_reserved)


def smallest_capacity(
    events: Sequence[Event | Sequence[object]],
    *,
    warmup: Sequence[Event | Sequence[object]] | None = None,
    upper: int | None = None,
    lower: int = 0,
) -> int:
    """The OOM line: the smallest capacity (2 MiB steps) a step fits in, searched from the top.

    Below the peak reserved of an unlimited replay a step can still fit: when
    ``cudaMalloc`` fails the allocator releases its cached free segments and retries.
    Fitting is not quite monotone in the capacity: one that forces an early release can
    leave a better layout than a larger one that does not, so a step may fit in an island
    below a band where it runs out. The line is where the band that reaches the unlimited
    peak starts, as found from the top (a user who leaves that much is clear of the band):
    the search goes down from the peak by 1, 2, 4... pages until a replay runs out, then
    bisects above that (on a monotone trace: the smallest capacity that fits). A replay
    that fits in capacity ``C`` with a peak of ``R`` reserved (over its warm-up too) fits
    in every capacity from ``R`` to ``C`` (each ``cudaMalloc`` it made succeeds there, each
    one refused is refused again: it is the same run), so the search goes on from ``R``.

    ``upper`` is the unlimited replay's peak reserved (replayed when not given);
    ``lower``, bytes known not to fit or less (the peak allocated), bounds the search.

    Example:
        >>> MiB = 2**20
        >>> steps = [("a", 30 * MiB), ("a",), ("b", 40 * MiB)]
        >>> replay(steps).peak_reserved // MiB, smallest_capacity(steps) // MiB
        (70, 40)
    """

    def fits_down_to(pages: int) -> int | None:
        """The page count its replay in ``pages`` vouches for, or None if it runs out."""
        try:
            _, peak = _replayed(events, warmup, capacity=pages * K_ROUND_LARGE)
        except torch.OutOfMemoryError:
            return None
        return -(-peak // K_ROUND_LARGE)

    top = upper if upper is not None else _replayed(events, warmup)[1]
    good = -(-top // K_ROUND_LARGE)  # in 2 MiB pages: fits (the unlimited run itself)
    bad = max(-(-lower // K_ROUND_LARGE) - 1, 0)  # holds less than lower: never fits
    stride = 1
    while good - stride > bad:  # down from the top until a replay runs out
        vouched = fits_down_to(good - stride)
        if vouched is None:
            bad = good - stride
            break
        good, stride = vouched, 2 * stride
    while good - bad > 1:
        middle = (good + bad) // 2
        vouched = fits_down_to(middle)
        if vouched is None:
            bad = middle
        else:
            good = vouched
    return good * K_ROUND_LARGE
