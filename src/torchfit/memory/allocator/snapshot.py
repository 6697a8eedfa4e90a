"""Replaying a real CUDA memory snapshot through the caching-allocator model.

``torch.cuda.memory._record_memory_history()`` followed by ``_dump_snapshot()`` (or
``torch.cuda.memory._snapshot()``) gives the allocator's segments when the snapshot was
taken and the trace of what happened since recording began: every ``alloc``,
``free_requested``/``free_completed``, ``segment_alloc``/``segment_free`` with its
address and size. `read_snapshot` turns that into the state the allocator was in when
recording began (`SnapshotTrace`), and `replay_snapshot` runs the trace's allocations and
frees through `CachingAllocator` from that state, with the real ``cudaMalloc`` addresses.
A model that is right places every block where the real allocator did and reserves the
same segments; `SnapshotReplay` says how far it got.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import pathlib
import pickle
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple, get_args

from torchfit._core import checks
from torchfit._core.units import format_bytes
from torchfit.memory.allocator.caching import CachingAllocator
from torchfit.memory.allocator.rules import (
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    AllocatorStats,
    SegmentInfo,
    round_request,
)

__all__ = ["SnapshotEvent", "SnapshotReplay", "SnapshotTrace", "read_snapshot", "replay_snapshot"]

Action = Literal["alloc", "free_requested", "free_completed", "segment_alloc", "segment_free"]
_ACTIONS: frozenset[str] = frozenset(get_args(Action))
# Trace entries that change no block or segment: skipped.
_IGNORED = frozenset({"snapshot", "oom", "user_defined", "empty_cache"})
_LIVE_STATES = frozenset({"active_allocated", "active_pending_free"})


class SnapshotEvent(NamedTuple):
    """One entry of a snapshot's trace: what the allocator did, where, how many bytes.

    ``size`` is the request (``orig_size``) for ``alloc`` and the frees, the segment's size
    for ``segment_alloc``/``segment_free``.
    """

    action: Action
    addr: int
    size: int


@dataclasses.dataclass(frozen=True)
class SnapshotTrace:
    """The allocator's state when recording began, and the trace recorded since.

    Attributes:
        segments: Every segment held when recording began, with its blocks.
        events: The trace, in order.
        end_segments: The segments when the snapshot was taken (after the trace).
    """

    segments: tuple[SegmentInfo, ...]
    events: tuple[SnapshotEvent, ...]
    end_segments: tuple[SegmentInfo, ...]

    @property
    def reserved(self) -> int:
        """Bytes reserved when recording began."""
        return sum(segment.size for segment in self.segments)

    @property
    def allocated(self) -> int:
        """Bytes allocated when recording began."""
        return sum(segment.allocated for segment in self.segments)

    @property
    def recorded_peak_reserved(self) -> int:
        """The real allocator's highest reserved bytes over the trace (its segment events)."""
        reserved = peak = self.reserved
        for action, _, size in self.events:
            if action == "segment_alloc":
                reserved += size
                peak = max(peak, reserved)
            elif action == "segment_free":
                reserved -= size
        return peak


@dataclasses.dataclass(frozen=True)
class SnapshotReplay:
    """What the model did with a recorded trace, beside what the real allocator did.

    Attributes:
        stats: The model's counters after the last event; ``peak_reserved`` and
            ``peak_allocated`` are over the trace, from the state when recording began.
        recorded_peak_reserved: The real allocator's peak reserved over the trace.
        allocations: Allocations replayed.
        same_address: Allocations the model placed at the real allocator's address: all
            of them when the model follows the real allocator exactly.
        first_divergence: Index in the trace of the first allocation placed elsewhere
            (None when every one matched).
        same_end_state: Whether the model ends with the snapshot's segments and blocks.
    """

    stats: AllocatorStats
    recorded_peak_reserved: int
    allocations: int
    same_address: int
    first_divergence: int | None
    same_end_state: bool

    def __str__(self) -> str:
        """A small table: model against the recorded run."""
        rows = [
            ("peak reserved (model)", format_bytes(self.stats.peak_reserved)),
            ("peak reserved (recorded)", format_bytes(self.recorded_peak_reserved)),
            ("peak allocated (model)", format_bytes(self.stats.peak_allocated)),
            ("allocations", str(self.allocations)),
            ("at the real address", str(self.same_address)),
            ("same end state", "yes" if self.same_end_state else "no"),
        ]
        return "\n".join(
            ["SnapshotReplay (caching-allocator model on a recorded trace)"]
            + [f"  {name:<24}  {value:>12}" for name, value in rows]
        )


def _load(snapshot: Mapping[str, Any] | str | os.PathLike[str]) -> Mapping[str, Any]:
    if isinstance(snapshot, Mapping):
        return snapshot
    with pathlib.Path(snapshot).open("rb") as file:
        data = pickle.load(file)  # noqa: S301 - a snapshot the caller names
    if not isinstance(data, Mapping) or "segments" not in data:
        raise ValueError(
            f"{os.fspath(snapshot)!r} holds no memory snapshot (a dict with 'segments' and "
            "'device_traces'); write one with torch.cuda.memory._dump_snapshot(path)"
        )
    return data


def _check_settings(settings: Mapping[str, Any]) -> None:
    """Refuse settings the replay does not follow (PYTORCH_CUDA_ALLOC_CONF's options)."""
    divisions = settings.get("roundup_power2_divisions") or {}
    values = set(divisions.values()) if isinstance(divisions, Mapping) else {divisions}
    if (
        settings.get("expandable_segments")
        or values - {0, 1}
        or settings.get("max_split_size", -1) not in (-1, None, 2**64 - 1)
        or (settings.get("garbage_collection_threshold") or 0) > 0
    ):
        raise ValueError(
            f"the snapshot was recorded with allocator settings {dict(settings)}; only the "
            "defaults are replayed (no expandable_segments, max_split_size, "
            "roundup_power2_divisions or garbage_collection_threshold): record it again "
            "without PYTORCH_CUDA_ALLOC_CONF"
        )


@checks.arguments()
def read_snapshot(
    snapshot: Mapping[str, Any] | str | os.PathLike[str], *, device: int = 0
) -> SnapshotTrace:
    """The allocator state when recording began, and the trace since, from a snapshot.

    The segments at the end are walked back through the trace: segments the trace
    ``segment_alloc``'d are dropped and those it ``segment_free``'d come back; the blocks
    allocated at the start are those live at the end that the trace did not allocate, plus
    those the trace freed without allocating them. A block freed in the trace has only its
    requested size recorded; its block size is that rounded, plus the gap behind it when
    that gap is at most 1 MiB in the large pool (the remainder ``should_split`` refuses to
    split off: a free large-pool block is always bigger than 1 MiB).

    Args:
        snapshot: The dict of ``torch.cuda.memory._snapshot()``, or the path of a pickle
            written by ``torch.cuda.memory._dump_snapshot()``.
        device: Which device's trace to read.

    Returns:
        The `SnapshotTrace`.

    Raises:
        ValueError: The snapshot has no trace for ``device``, uses several streams or
            settings the model does not follow, or its trace does not fit its segments.

    Example:
        A 2 MiB segment whose first 512 bytes were freed during the trace:

        >>> seg = {"address": 4096, "total_size": 2**21, "segment_type": "small",
        ...        "stream": 0, "blocks": [{"size": 2**21, "state": "inactive"}]}
        >>> trace = [{"action": a, "addr": 4096, "size": 100, "stream": 0}
        ...          for a in ("free_requested", "free_completed")]
        >>> t = read_snapshot({"segments": [seg], "device_traces": [trace]})
        >>> t.reserved, t.allocated, t.segments[0].blocks
        (2097152, 512, ((512, True), (2096640, False)))
        >>> t.events[0]
        SnapshotEvent(action='free_requested', addr=4096, size=100)
    """
    data = _load(snapshot)
    _check_settings(data.get("allocator_settings", {}))
    traces = data.get("device_traces", [])
    if device >= len(traces):
        raise ValueError(
            f"the snapshot has traces for {len(traces)} device(s), none for device {device}; "
            "record with torch.cuda.memory._record_memory_history() before the step"
        )
    entries = [e for e in traces[device] if e["action"] not in _IGNORED]
    segments = [s for s in data["segments"] if s.get("device", device) == device]
    streams = {e["stream"] for e in entries} | {s["stream"] for s in segments}
    if len(streams) > 1:
        raise ValueError(
            f"the snapshot uses {len(streams)} streams ({sorted(streams)}); the model follows "
            "one stream only: record a step that allocates on one stream"
        )
    unknown = {e["action"] for e in entries} - _ACTIONS
    if unknown:
        raise ValueError(
            f"trace actions {sorted(unknown)} are not replayed; expected {sorted(_ACTIONS)} "
            "(segment_map/segment_unmap come from expandable_segments, which is not modelled)"
        )
    events = tuple(SnapshotEvent(e["action"], int(e["addr"]), int(e["size"])) for e in entries)
    end = tuple(
        SegmentInfo(
            address=int(s["address"]),
            size=int(s["total_size"]),
            is_large=s["segment_type"] == "large",
            blocks=tuple((int(b["size"]), b["state"] in _LIVE_STATES) for b in s["blocks"]),
        )
        for s in sorted(segments, key=lambda s: int(s["address"]))
    )
    return SnapshotTrace(segments=_initial_segments(end, events), events=events, end_segments=end)


def _block_addresses(segment: SegmentInfo) -> list[int]:
    """Where each block of ``segment`` starts."""
    sizes = [size for size, _ in segment.blocks[:-1]]
    return list(itertools.accumulate(sizes, initial=segment.address))


def _initial_segments(
    end: Sequence[SegmentInfo], events: Sequence[SnapshotEvent]
) -> tuple[SegmentInfo, ...]:
    """Walk the end state back through ``events`` to the segments held at the start."""
    held = {segment.address: segment.size for segment in end}
    large = {segment.address for segment in end if segment.is_large}
    live = {  # address -> block size (0: known by its request only)
        addr: size
        for segment in end
        for addr, (size, used) in zip(_block_addresses(segment), segment.blocks, strict=True)
        if used
    }
    requested: dict[int, int] = {}
    for action, addr, size in reversed(events):
        if action == "alloc" and live.pop(addr, None) is None:
            raise ValueError(f"the trace allocates at {addr}, which is not live after it")
        if action == "free_requested":
            live[addr], requested[addr] = 0, size
        elif action == "segment_alloc":
            del held[addr]
        elif action == "segment_free":
            held[addr] = size
            if size != K_SMALL_BUFFER:  # small-pool segments are 2 MiB, large ones 10+ MiB
                large.add(addr)
    start = tuple(
        _segment((base, size), live, requested, large=base in large)
        for base, size in sorted(held.items())
    )
    outside = live.keys() - {a for s in start for a in _block_addresses(s)}
    if outside:
        raise ValueError(f"the block at {min(outside)} lies in no segment")
    return start


def _segment(
    span: tuple[int, int], live: Mapping[int, int], requested: Mapping[int, int], *, large: bool
) -> SegmentInfo:
    """The segment at ``span`` (base, size): its live blocks, free blocks in the gaps."""
    base, end = span[0], span[0] + span[1]
    starts = sorted(addr for addr in live if base <= addr < end)
    blocks: list[tuple[int, bool]] = []
    cursor = base
    for addr, after in itertools.pairwise([*starts, end]):
        if addr < cursor:
            raise ValueError(f"blocks overlap at {addr} in the segment at {base}")
        if addr > cursor:
            blocks.append((addr - cursor, False))
        size = live[addr] or round_request(requested[addr])
        if not live[addr] and large and 0 < after - addr - size <= K_SMALL_SIZE:
            size = after - addr  # should_split refused: the remainder stayed in the block
        blocks.append((size, True))
        cursor = addr + size
    if cursor > end:
        raise ValueError(f"a block runs past the end of the segment at {base}")
    if cursor < end:
        blocks.append((end - cursor, False))
    return SegmentInfo(address=base, size=span[1], is_large=large, blocks=tuple(blocks))


def _start(trace: SnapshotTrace) -> tuple[CachingAllocator, dict[int, int]]:
    """A model in the trace's initial state, and its live blocks' handles by address."""
    pending: dict[int, list[int]] = {}  # segment size -> the real addresses, in order
    for action, addr, size in trace.events:
        if action == "segment_alloc":
            pending.setdefault(size, []).append(addr)

    def placement(size: int) -> int | None:
        queue = pending.get(size)
        return queue.pop(0) if queue else None

    allocator = CachingAllocator(placement=placement)
    handles: dict[int, int] = {}
    for segment in trace.segments:
        starts = _block_addresses(segment)
        used = [addr for addr, (_, alive) in zip(starts, segment.blocks, strict=True) if alive]
        handles.update(zip(used, allocator.adopt_segment(segment), strict=True))
    return allocator, handles


@checks.arguments()
def replay_snapshot(
    snapshot: SnapshotTrace | Mapping[str, Any] | str | os.PathLike[str], *, device: int = 0
) -> SnapshotReplay:
    """Run a recorded trace through `CachingAllocator`, from the state recording began in.

    Each ``alloc`` is a `CachingAllocator.malloc` of the recorded request, each
    ``free_completed`` a `CachingAllocator.free` (the block goes back to the pool then;
    a free deferred by ``record_stream`` completes later); a run of ``segment_free``
    entries is an ``empty_cache`` (``release_cached_blocks``, also what a failed
    ``cudaMalloc`` does before its retry). New segments go where the real ``cudaMalloc``
    put the next segment of that size, so ties in the best-fit search break as they did.

    Args:
        snapshot: A `SnapshotTrace`, or what `read_snapshot` reads.
        device: Which device's trace to read (not for a `SnapshotTrace`).

    Returns:
        A `SnapshotReplay`: the model's counters, and how closely it followed the trace.

    Raises:
        ValueError: See `read_snapshot`; also a free of an address that is not allocated.

    Example:
        A 2 MiB segment, free when recording began, that the trace allocated 100 bytes in:

        >>> blocks = [{"size": 512, "state": "active_allocated"},
        ...           {"size": 2**21 - 512, "state": "inactive"}]
        >>> seg = {"address": 4096, "total_size": 2**21, "segment_type": "small",
        ...        "stream": 0, "blocks": blocks}
        >>> trace = [{"action": "alloc", "addr": 4096, "size": 100, "stream": 0}]
        >>> r = replay_snapshot({"segments": [seg], "device_traces": [trace]})
        >>> r.stats.peak_reserved, r.stats.peak_allocated, r.same_address, r.same_end_state
        (2097152, 512, 1, True)
    """
    if not isinstance(snapshot, SnapshotTrace):
        snapshot = read_snapshot(snapshot, device=device)
    allocator, handles = _start(snapshot)
    allocations = same = 0
    first: int | None = None
    previous = ""
    for index, (action, addr, size) in enumerate(snapshot.events):
        if action == "alloc":
            handles[addr] = handle = allocator.malloc(size)
            allocations += 1
            same += allocator.address(handle) == addr
            first = index if first is None and allocator.address(handle) != addr else first
        elif action == "free_completed":
            if addr not in handles:
                raise ValueError(f"trace entry {index} frees {addr}, which is not allocated")
            allocator.free(handles.pop(addr))
        elif action == "segment_free" and previous != "segment_free":
            allocator.empty_cache()
        previous = action
    return SnapshotReplay(
        stats=allocator.stats(),
        recorded_peak_reserved=snapshot.recorded_peak_reserved,
        allocations=allocations,
        same_address=same,
        first_divergence=first,
        same_end_state=allocator.segments() == snapshot.end_segments,
    )
