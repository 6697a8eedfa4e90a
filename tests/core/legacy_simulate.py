"""A frozen copy of simulate_gpu's card and of LiveBytes before the storage ledger (71111e7).

`LegacySimulatedGPU` is ``torchfit/memory/batch/simulate.py``'s ``SimulatedGPU`` (with
its dispatch mode) and `LegacyLiveBytes` is ``torchfit/memory/modules/live.py``'s
``LiveBytes`` as they were at commit 71111e7, before both were rebuilt on
``torchfit._core.ledger``; kept, unchanged but for their names, only for the
differential tests in ``tests/core``. `_ACTIVE` is this copy's own list of entered cards.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Iterator
from typing import Any, Self

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from torchfit._core.tensors import reachable_tensors
from torchfit._core.units import format_bytes

# CUDA's caching allocator rounds every block up to 512 bytes (kMinBlockSize in
# c10/cuda/CUDACachingAllocator.cpp), so memory_allocated counts rounded blocks.
_CUDA_BLOCK = 512

# Ops whose output is the (untracked) input itself but whose storage was made a moment
# earlier, outside dispatch: torch.tensor([...]) and friends end in lift_fresh.
_FRESH = frozenset({torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default})

#: Simulators currently entered, innermost last (`find_batch_size` reads it).
_ACTIVE: list[LegacySimulatedGPU] = []


def _rounded(nbytes: int) -> int:
    return -(-nbytes // _CUDA_BLOCK) * _CUDA_BLOCK


def _storage_of(tensor: torch.Tensor) -> torch.UntypedStorage | None:
    if tensor.device.type != "cpu" or tensor.is_sparse:
        return None
    try:
        storage = tensor.untyped_storage()
    except (RuntimeError, NotImplementedError):  # tensor subclasses without a storage
        return None
    # Fake tensors (FakeTensorMode, torchfit's trace) say "cpu" but keep a meta storage.
    return storage if storage.device.type == "cpu" else None


def _leaves(value: object) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, tuple | list):
        for item in value:
            yield from _leaves(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)


class _Entry:
    __slots__ = ("ref", "size")

    def __init__(self, ref: weakref.ref[torch.UntypedStorage], size: int) -> None:
        self.ref = ref
        self.size = size


class _Mode(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch's class is untyped
    def __init__(self, card: LegacySimulatedGPU) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.card = card

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        error = self.card._account(func, args, kwargs, out)
        if error is None:
            return out
        del out  # the refused output must not live on in this frame of the traceback
        try:
            raise error
        finally:
            # A local holding the raised error is a cycle (error -> traceback -> this
            # frame -> error) that keeps every frame of the failed step, and its tensors,
            # alive until a full garbage collection. A real CUDA OOM, raised in C++, has
            # no such frame: reference counting alone must free the step's memory here too.
            del error


class LegacySimulatedGPU:
    """A simulated card: capacity, live bytes and peak of the CPU tensors created under it.

    Made by `simulate_gpu`; use it as a context manager. Figures are in bytes, each
    storage rounded up to CUDA's 512-byte block.

    Attributes:
        name: The card's name (or the budget as given).
        capacity: Total bytes of the card.
        used: Bytes counted as taken from the start (e.g. a CUDA context).
        peak: Highest `live` value since entry or the last `reset_peak`.
        demand: Highest ``live + request`` seen, refused requests included: a lower bound on
            what the code needed.
        ooms: How many allocations were refused.
    """

    def __init__(self, capacity: int, *, name: str, track: tuple[object, ...], used: int) -> None:
        self.name = name
        self.capacity = capacity
        self.used = used
        self.peak = used
        self.demand = used
        self.ooms = 0
        self._track = track
        self._tensor_bytes = 0
        self._storages: dict[int, _Entry] = {}
        self._mode: _Mode | None = None
        self._paused = 0

    @property
    def live(self) -> int:
        return self.used + self._tensor_bytes

    @property
    def free(self) -> int:
        return self.capacity - self.live

    def reset_peak(self) -> None:
        self.peak = self.demand = self.live

    def __enter__(self) -> Self:
        if self._mode is not None:
            raise RuntimeError(
                f"this simulate_gpu({self.name!r}) is already active; nest a new "
                "simulate_gpu(...) instead of re-entering the same one"
            )
        for tensor in reachable_tensors(self._track):
            storage = _storage_of(tensor)
            if storage is not None:
                self._register(storage, _rounded(storage.nbytes()))
        if self.live > self.capacity:
            held = self.live
            self._forget()
            raise self._oom(0, held=held)
        self.reset_peak()
        self._mode = _Mode(self)
        self._mode.__enter__()  # type: ignore[no-untyped-call]
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        mode, self._mode = self._mode, None
        _ACTIVE.remove(self)
        if mode is not None:
            mode.__exit__(None, None, None)  # type: ignore[no-untyped-call]

    def __repr__(self) -> str:
        return (
            f"LegacySimulatedGPU({self.name!r}, capacity={format_bytes(self.capacity)}, "
            f"live={format_bytes(self.live)}, peak={format_bytes(self.peak)})"
        )

    # -- accounting ---------------------------------------------------------------------

    def _register(self, storage: torch.UntypedStorage, size: int) -> None:
        key = id(storage)
        if key in self._storages:
            return
        ref = weakref.ref(storage, functools.partial(self._freed, key))
        self._storages[key] = _Entry(ref, size)
        self._tensor_bytes += size

    def _freed(self, key: int, _ref: object) -> None:
        entry = self._storages.pop(key, None)
        if entry is not None:
            self._tensor_bytes -= entry.size

    def _forget(self) -> None:
        self._storages.clear()
        self._tensor_bytes = 0

    def _account(
        self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: object
    ) -> torch.OutOfMemoryError | None:
        if self._paused:
            return None
        new, growth = self._classify(func, (args, kwargs), out)
        request = sum(size for _, size in new.values())
        request += sum(size - entry.size for entry, size in growth)
        if request and self.live + request > self.capacity:
            self.ooms += 1
            self.demand = max(self.demand, self.live + request)
            return self._oom(request)
        for storage, size in new.values():
            self._register(storage, size)
        for entry, size in growth:
            self._tensor_bytes += size - entry.size
            entry.size = size
        self.peak = max(self.peak, self.live)
        self.demand = max(self.demand, self.live)
        return None

    def _classify(
        self, func: Any, inputs: object, out: object
    ) -> tuple[dict[int, tuple[torch.UntypedStorage, int]], list[tuple[_Entry, int]]]:
        new: dict[int, tuple[torch.UntypedStorage, int]] = {}
        growth: list[tuple[_Entry, int]] = []
        input_ids: set[int] | None = None
        for tensor in _leaves(out):
            storage = _storage_of(tensor)
            if storage is None or id(storage) in new:
                continue
            size = _rounded(storage.nbytes())
            entry = self._storages.get(id(storage))
            if entry is not None:
                if size > entry.size:  # resize_ or an out= argument grew in place
                    growth.append((entry, size))
                continue
            if input_ids is None:
                input_ids = set() if func in _FRESH else _storage_ids(inputs)
            if id(storage) not in input_ids:  # a view of an untracked input is not new memory
                new[id(storage)] = (storage, size)
        return new, growth

    def _oom(self, request: int, *, held: int | None = None) -> torch.OutOfMemoryError:
        held = self.live if held is None else held
        # The first sentence is CUDA's own ("CUDA out of memory. Tried to allocate ..."), so
        # handlers that match on it (accelerate's should_reduce_batch_size looks for
        # " out of memory.", Lightning's is_oom_error for "CUDA" and "out of memory") react.
        what = (
            f"Tried to allocate {format_bytes(request)}"
            if request
            else f"The tracked tensors alone hold {format_bytes(held)}"
        )
        return torch.OutOfMemoryError(
            f"CUDA out of memory. {what}. (simulated by torchfit.memory.simulate_gpu on the "
            f"CPU: GPU {self.name!r}; {format_bytes(self.capacity)} total capacity; "
            f"{format_bytes(held)} already allocated; "
            f"{format_bytes(max(self.capacity - held, 0))} free)"
        )


def _storage_ids(value: object) -> set[int]:
    ids = set()
    for tensor in _leaves(value):
        storage = _storage_of(tensor)
        if storage is not None:
            ids.add(id(storage))
    return ids


class LegacyLiveBytes(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts the bytes of storages created under it while they live, and their peak.

    Storages are Python objects with a lifetime tied to the tensor data (PyObject
    preservation), so a weakref finalizer sees each free, also on the meta device.
    """

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.live = 0
        self.peak = 0
        self._seen: weakref.WeakSet[torch.UntypedStorage] = weakref.WeakSet()

    def exclude(self, tensors: object) -> None:
        for leaf in tree_flatten(tensors)[0]:
            if isinstance(leaf, torch.Tensor):
                self._seen.add(leaf.untyped_storage())

    def _free(self, nbytes: int) -> None:
        self.live -= nbytes

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        for leaf in tree_flatten(out)[0]:
            if isinstance(leaf, torch.Tensor):
                storage = leaf.untyped_storage()
                if storage not in self._seen:
                    self._seen.add(storage)
                    nbytes = storage.nbytes()
                    self.live += nbytes
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(storage, self._free, nbytes)
        return out
