"""The storage ledger: one notion of "same storage", one CUDA block, one event format.

**Identity.** Tensors share memory when they share a storage, a ``c10::StorageImpl``;
`storage_key` is that object's address (``UntypedStorage._cdata``). It exists for real
CPU and CUDA tensors, for meta tensors and for fake tensors (whose storage is a meta
storage) alike, it does not change when a storage is resized in place, and views,
``detach()``, ``.data`` and tied parameters share it. It is unique among live storages
and may be reused once a storage is freed, which is why `Ledger` watches every storage
it counts with a weak reference. ``data_ptr()`` is not used: it is 0 for every meta,
fake and empty storage, and it moves when a storage grows. Two storages aliasing the
same bytes by other means (``torch.from_numpy`` called twice on one array) are two
storages here. `view_key` is a different identity, for a different question: whether
two tensor objects are *the same tensor* (same storage, offset, shape and strides), as
tied parameters are; a fused QKV weight split into three views is one storage but three
views.

**Rounding.** `CUDA_BLOCK` is the CUDA caching allocator's block: every allocation is
rounded up to a multiple of 512 bytes (``kMinBlockSize`` in PyTorch's
``c10/cuda/CUDACachingAllocator.cpp``), so ``torch.cuda.memory_allocated`` counts
rounded blocks.

**Counting.** `Ledger` counts storages once each: it registers a storage with its
(rounded) size, learns of its free through a weak reference on the storage object
(PyTorch keeps one Python object per storage while the storage lives), treats a storage
resized in place as a free plus a new allocation, keeps live and peak bytes, and can
record every allocation and free as an `Event`, the format `torchfit.memory.allocator`
replays. Frees are queued by the weak-reference callbacks and applied before the next
lookup, so a callback that fires in the middle of an update cannot corrupt the counts
and a freed storage's key is never mistaken for a live one.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import weakref
from collections.abc import Iterable, Iterator
from typing import Literal, NamedTuple, overload

import torch

__all__ = [
    "CUDA_BLOCK",
    "Entry",
    "Event",
    "Ledger",
    "cuda_block_bytes",
    "round_up",
    "storage_key",
    "storage_of",
    "view_key",
]

#: The CUDA caching allocator's block: every allocation is a multiple of 512 bytes
#: (``kMinBlockSize`` in PyTorch's ``c10/cuda/CUDACachingAllocator.cpp``).
CUDA_BLOCK = 512


def round_up(nbytes: int, block: int) -> int:
    """``nbytes`` rounded up to a multiple of ``block`` (0 stays 0).

    Example:
        >>> round_up(1, 512), round_up(512, 512), round_up(513, 512), round_up(0, 512)
        (512, 512, 1024, 0)
    """
    if block <= 0:
        raise ValueError(f"block must be a positive number of bytes; got {block}")
    return -(-nbytes // block) * block


def cuda_block_bytes(nbytes: int) -> int:
    """Bytes a CUDA tensor of ``nbytes`` holds in the caching allocator (`CUDA_BLOCK`).

    Example:
        >>> cuda_block_bytes(4), cuda_block_bytes(4000), cuda_block_bytes(0)
        (512, 4096, 0)
    """
    return round_up(nbytes, CUDA_BLOCK)


def storage_of(tensor: torch.Tensor) -> torch.UntypedStorage | None:
    """The storage behind ``tensor``; ``None`` for tensors without one (sparse, nested).

    Example:
        >>> w = torch.zeros(4)
        >>> storage_of(w[1:]).nbytes()
        16
    """
    try:
        return tensor.untyped_storage()
    except (RuntimeError, NotImplementedError):  # sparse, nested, storage-less subclasses
        return None


@overload
def storage_key(obj: torch.UntypedStorage) -> int: ...
@overload
def storage_key(obj: torch.Tensor) -> int | None: ...
def storage_key(obj: torch.Tensor | torch.UntypedStorage) -> int | None:
    """Which storage a tensor uses (or which a storage is): equal keys, same memory.

    Works for real, meta and fake tensors (see the module notes); ``None`` for a tensor
    without a storage.

    Example:
        >>> w = torch.zeros(3, 3)
        >>> storage_key(w) == storage_key(w.t()) == storage_key(w[1:].detach())
        True
        >>> storage_key(w) == storage_key(w.clone())
        False
    """
    storage = obj if isinstance(obj, torch.UntypedStorage) else storage_of(obj)
    return None if storage is None else int(storage._cdata)  # noqa: SLF001 - the StorageImpl


def view_key(tensor: torch.Tensor) -> tuple[int, int, tuple[int, ...], tuple[int, ...]] | None:
    """Which tensor ``tensor`` is: same storage, offset, shape and strides (tied weights).

    ``None`` when the tensor has no storage.

    Example:
        >>> w = torch.zeros(6)
        >>> view_key(w) == view_key(w.detach()), view_key(w[:3]) == view_key(w[3:])
        (True, False)
    """
    key = storage_key(tensor)
    if key is None:
        return None
    return (key, int(tensor.storage_offset()), tuple(tensor.shape), tuple(tensor.stride()))


class Event(NamedTuple):
    """One allocator event: a storage allocated or freed, with its (rounded) bytes.

    `torchfit.memory.tracing.trace_events` records them, `torchfit.memory.allocator.replay`
    replays them. ``id`` names the allocation; a resized storage gets a new one.

    Example:
        >>> e = Event("alloc", 0, 512)
        >>> e.kind, e[2]
        ('alloc', 512)
    """

    kind: Literal["alloc", "free"]
    id: int
    nbytes: int


@dataclasses.dataclass(eq=False, slots=True)
class Entry:
    """One counted storage.

    Attributes:
        key: Its `storage_key`.
        id: Its allocation id in the events (``-1`` for an empty storage: no events).
        raw: The storage's own size in bytes.
        nbytes: Bytes counted: ``raw`` rounded up to the ledger's block.
        previous: The id this allocation replaced when the storage was resized in
            place, else ``-1``.
    """

    key: int
    id: int
    raw: int
    nbytes: int
    previous: int = -1
    ref: weakref.ref[torch.UntypedStorage] | None = dataclasses.field(default=None, repr=False)


class Ledger:
    """Live and peak bytes of the storages registered with it, each counted once.

    Args:
        block: Round every storage up to a multiple of this many bytes (`CUDA_BLOCK` to
            count as CUDA's allocator does, 1 for exact bytes).

    Attributes:
        block: The rounding block.
        peak: Highest live bytes since creation, `reset_peak` or `restart`.
        peak_index: Index in `events` of the allocation that reached `peak` (``-1`` when
            no event recorded it).
        recording: Whether allocations and frees are appended to `events`.
        events: The recorded `Event` list.

    Example:
        >>> ledger = Ledger(block=512)
        >>> ledger.recording = True
        >>> a = torch.empty(100)  # 400 bytes: one 512-byte block
        >>> entry, fresh = ledger.add(a.untyped_storage())
        >>> fresh, ledger.add(a[10:].untyped_storage())[1], ledger.live
        (True, False, 512)
        >>> del a
        >>> ledger.live, ledger.peak, ledger.events
        (0, 512, [Event(kind='alloc', id=0, nbytes=512), Event(kind='free', id=0, nbytes=512)])
    """

    def __init__(self, *, block: int = 1) -> None:
        """Start with nothing counted."""
        round_up(0, block)  # validates the block
        self.block = block
        self.peak = 0
        self.peak_index = -1
        self.recording = False
        self.events: list[Event] = []
        self._live = 0
        self._entries: dict[int, Entry] = {}  # by storage key, in registration order
        self._pending: collections.deque[tuple[int, object]] = collections.deque()
        self._next_id = 0

    # -- reading ----------------------------------------------------------------------
    @property
    def live(self) -> int:
        """Bytes of the registered storages alive now (queued frees applied first)."""
        self.drain()
        return self._live

    def __len__(self) -> int:
        """How many storages are counted now."""
        self.drain()
        return len(self._entries)

    def entries(self) -> Iterator[Entry]:
        """The counted storages' entries, in registration order (resized ones moved last)."""
        self.drain()
        return iter(list(self._entries.values()))

    def size_of(self, storage: torch.UntypedStorage) -> int:
        """Bytes ``storage`` would be counted as now: its size rounded up to `block`."""
        return round_up(storage.nbytes(), self.block)

    def get(self, storage: torch.UntypedStorage) -> Entry | None:
        """The entry of ``storage`` if it is counted, else ``None``."""
        self.drain()
        return self._entries.get(storage_key(storage))

    # -- changing -----------------------------------------------------------------------
    def add(self, storage: torch.UntypedStorage) -> tuple[Entry, bool]:
        """Count ``storage`` once; return its entry and whether this call allocated.

        A storage seen before is not counted again, unless its size changed since (it
        was resized in place): then its old allocation is freed and a new one, with a
        new id, is counted. Empty storages are registered (so that their growth is
        seen) but count 0 bytes and record no events.
        """
        self.drain()
        key = storage_key(storage)
        raw = storage.nbytes()
        entry = self._entries.get(key)
        if entry is not None:
            if raw == entry.raw:
                return entry, False
            del self._entries[key]  # resized in place: a free and a new allocation
            self._release(entry)
            new = self._allocate(key, raw, previous=entry.id)
            new.ref = entry.ref
            self._entries[key] = new
            return new, True
        entry = self._allocate(key, raw)
        entry.ref = weakref.ref(storage, functools.partial(self._on_free, key))
        self._entries[key] = entry
        return entry, True

    def transient(self, raw: int) -> Entry:
        """Count ``raw`` bytes allocated and freed at once (kernel scratch); for the peak."""
        entry = self._allocate(-1, raw)
        self._release(entry)
        return entry

    def drain(self) -> None:
        """Apply the frees queued by weak-reference callbacks."""
        while self._pending:
            key, ref = self._pending.popleft()
            entry = self._entries.get(key)
            if entry is not None and entry.ref is ref:
                del self._entries[key]
                self._release(entry)

    def restart(self, keep: Iterable[Entry]) -> int:
        """Count only ``keep`` from now on and record afresh; return the bytes dropped.

        The other storages are forgotten (their frees are no longer watched); when
        recording, the events so far end with a ``free`` of each, so that they stay a
        whole trace whose live storages at the end are ``keep`` (a recorded warm-up
        replays into the state the step starts from). `events` is then a new list,
        starting with one ``alloc`` per kept storage, in registration order, with the
        ids they had; recording is switched on, and `peak` restarts from `live`.
        """
        self.drain()
        kept = {entry.key: entry for entry in keep}
        dropped = 0
        for key, entry in list(self._entries.items()):
            if kept.get(key) is not entry:
                dropped += entry.nbytes
                del self._entries[key]
                if self.recording and entry.nbytes:
                    self.events.append(Event("free", entry.id, entry.nbytes))
        self._live = sum(entry.nbytes for entry in self._entries.values())
        self.events = [
            Event("alloc", entry.id, entry.nbytes)
            for entry in self._entries.values()
            if entry.nbytes
        ]
        self.recording = True
        self.peak, self.peak_index = self._live, len(self.events) - 1
        return dropped

    def clear(self) -> None:
        """Forget every storage (without frees): live bytes 0."""
        self._entries.clear()
        self._pending.clear()
        self._live = 0

    def reset_peak(self) -> None:
        """Start `peak` again from the live bytes now."""
        self.peak = self.live
        self.peak_index = len(self.events) - 1 if self.recording else -1

    # -- internals ----------------------------------------------------------------------
    def _on_free(self, key: int, ref: object) -> None:
        self._pending.append((key, ref))

    def _allocate(self, key: int, raw: int, *, previous: int = -1) -> Entry:
        nbytes = round_up(raw, self.block)
        if not nbytes:
            return Entry(key, -1, raw, 0, previous)
        entry = Entry(key, self._next_id, raw, nbytes, previous)
        self._next_id += 1
        self._live += nbytes
        if self.recording:
            self.events.append(Event("alloc", entry.id, nbytes))
        if self._live > self.peak:
            self.peak = self._live
            self.peak_index = len(self.events) - 1 if self.recording else -1
        return entry

    def _release(self, entry: Entry) -> None:
        if not entry.nbytes:
            return
        self._live -= entry.nbytes
        if self.recording:
            self.events.append(Event("free", entry.id, entry.nbytes))
