"""`simulate_gpu`: a GPU-sized memory limit for CPU code that raises real OOM errors.

A ``TorchDispatchMode`` sees every ATen op and the tensors it returns. Each output whose
storage is new is added to an account of live bytes (rounded up to CUDA's 512-byte
block), a weak reference on the storage takes it off again when the storage is freed,
and an op whose new storages would push the account past the card's capacity raises a
real ``torch.OutOfMemoryError`` with a CUDA-like message. OOM handling (``except``,
``is_oom``, accelerate's ``should_reduce_batch_size``, `find_batch_size`) can so be
exercised on a CPU-only machine.

What the account sees: the outputs of every op dispatched while the context is active
(forward, backward, optimizer step, factory functions, ``torch.tensor``), in-place growth
(``resize_``, ``out=``) of storages it already counts, the storages of ``track=`` objects
alive at entry, and ``used`` bytes. What it does not see: scratch a kernel allocates
inside itself and frees before returning (measured here with torch 2.13 on the CPU: a
training step of ``Conv2d(32, 32, 3)`` on an 8x32x32x32 input peaks at 4.27 MB of real
allocations where a dispatch-level tracker sees 2.13 MB); tensors made
outside dispatch (``torch.from_numpy``, DataLoader workers) or before entry and not
tracked; ``UntypedStorage.resize_`` called directly; CUDA tensors; fake and meta tensors
(a trace run inside the context costs the card nothing). The check runs when
an op returns, so the refused output exists on the CPU for an instant: keep simulated
cards smaller than host memory. There is no caching allocator behind it: no segments,
no fragmentation, no CUDA context (pass ``used=`` to model one). It follows
``torch.cuda.memory_allocated``, not ``memory_reserved``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Self

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from torchfit._core import checks
from torchfit._core.ledger import CUDA_BLOCK, Entry, Ledger, storage_key
from torchfit._core.tensors import reachable_tensors
from torchfit._core.units import format_bytes, parse_bytes
from torchfit.memory.gpus import GPU
from torchfit.memory.gpus.budget import budget_of

__all__ = ["SimulatedGPU", "active_simulator", "paused", "simulate_gpu"]

# Ops whose output is the (untracked) input itself but whose storage was made a moment
# earlier, outside dispatch: torch.tensor([...]) and friends end in lift_fresh.
_FRESH = frozenset({torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default})

#: Simulators currently entered, innermost last (`find_batch_size` reads it).
_ACTIVE: list[SimulatedGPU] = []


def _storage_of(tensor: torch.Tensor) -> torch.UntypedStorage | None:
    """The CPU storage that holds real bytes for ``tensor``, if any."""
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


class _Mode(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch's class is untyped
    def __init__(self, card: SimulatedGPU) -> None:
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
        error = self.card._account(func, args, kwargs, out)  # noqa: SLF001 - our own class
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


class SimulatedGPU:
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
        """A card of ``capacity`` bytes; `simulate_gpu` makes it."""
        self.name = name
        self.capacity = capacity
        self.used = used
        self.peak = used
        self.demand = used
        self.ooms = 0
        self._track = track
        self._ledger = Ledger(block=CUDA_BLOCK)
        self._mode: _Mode | None = None
        self._paused = 0

    @property
    def live(self) -> int:
        """Bytes counted as allocated now: `used` plus every live storage in the account."""
        return self.used + self._ledger.live

    @property
    def free(self) -> int:
        """``capacity - live``."""
        return self.capacity - self.live

    def reset_peak(self) -> None:
        """Start `peak` and `demand` again from the current `live` bytes."""
        self.peak = self.demand = self.live

    def __enter__(self) -> Self:
        """Count the tracked storages, then start checking every op (re-entry is an error)."""
        if self._mode is not None:
            raise RuntimeError(
                f"this simulate_gpu({self.name!r}) is already active; nest a new "
                "simulate_gpu(...) instead of re-entering the same one"
            )
        for tensor in reachable_tensors(self._track):
            storage = _storage_of(tensor)
            if storage is not None and self._ledger.get(storage) is None:
                self._ledger.add(storage)
        if self.live > self.capacity:
            held = self.live
            self._ledger.clear()
            raise self._oom(0, held=held)
        self.reset_peak()
        self._mode = _Mode(self)
        self._mode.__enter__()  # type: ignore[no-untyped-call]
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Stop checking; the account stops changing with new ops (frees are still seen)."""
        mode, self._mode = self._mode, None
        _ACTIVE.remove(self)
        if mode is not None:
            mode.__exit__(None, None, None)  # type: ignore[no-untyped-call]

    def __repr__(self) -> str:
        """Name, capacity, live and peak bytes."""
        return (
            f"SimulatedGPU({self.name!r}, capacity={format_bytes(self.capacity)}, "
            f"live={format_bytes(self.live)}, peak={format_bytes(self.peak)})"
        )

    # -- accounting ---------------------------------------------------------------------

    def _account(
        self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: object
    ) -> torch.OutOfMemoryError | None:
        if self._paused:
            return None
        changes = self._classify(func, (args, kwargs), out)
        request = sum(extra for _, extra in changes.values())
        if request and self.live + request > self.capacity:
            self.ooms += 1
            self.demand = max(self.demand, self.live + request)
            return self._oom(request)
        for storage, _ in changes.values():
            self._ledger.add(storage)
        self.peak = max(self.peak, self.live)
        self.demand = max(self.demand, self.live)
        return None

    def _classify(
        self, func: Any, inputs: object, out: object
    ) -> dict[int, tuple[torch.UntypedStorage, int]]:
        """Storages an op's outputs add (new) or grow (counted ones resized in place).

        Returns ``{storage key: (storage, bytes it adds)}``. A storage that shrank is left
        at its counted size, as before the ledger (tensor ops never shrink a storage).
        """
        changes: dict[int, tuple[torch.UntypedStorage, int]] = {}
        input_keys: set[int] | None = None
        for tensor in _leaves(out):
            storage = _storage_of(tensor)
            if storage is None:
                continue
            key = storage_key(storage)
            if key in changes:
                continue
            size = self._ledger.size_of(storage)
            entry: Entry | None = self._ledger.get(storage)
            if entry is not None:
                if size > entry.nbytes:  # resize_ or an out= argument grew in place
                    changes[key] = (storage, size - entry.nbytes)
                continue
            if input_keys is None:
                input_keys = set() if func in _FRESH else _storage_keys(inputs)
            if key not in input_keys:  # a view of an untracked input is not new memory
                changes[key] = (storage, size)
        return changes

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


def _storage_keys(value: object) -> set[int]:
    keys = set()
    for tensor in _leaves(value):
        storage = _storage_of(tensor)
        if storage is not None:
            keys.add(storage_key(storage))
    return keys


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Stop every active simulator from counting (host-side copies made by a probe)."""
    cards = list(_ACTIVE)
    for card in cards:
        card._paused += 1  # noqa: SLF001 - module-private protocol
    try:
        yield
    finally:
        for card in cards:
            card._paused -= 1  # noqa: SLF001


def active_simulator() -> SimulatedGPU | None:
    """The innermost `simulate_gpu` now entered, or ``None``."""
    return _ACTIVE[-1] if _ACTIVE else None


@checks.arguments(
    gpu_or_bytes=checks.parsed(budget_of, kinds=(str, int, float)),
    used=checks.parsed(parse_bytes, kinds=(str, int, float)),
)
def simulate_gpu(
    gpu_or_bytes: int | str | GPU,
    *,
    track: object = (),
    used: int | str = 0,
) -> SimulatedGPU:
    """Make CPU code run out of memory like a GPU of the given size.

    Inside ``with simulate_gpu(...)``, every op whose new output storages would take the
    live bytes past the card's capacity raises a real ``torch.OutOfMemoryError`` whose
    message starts like CUDA's (``CUDA out of memory. Tried to allocate ...``) and names
    simulate_gpu. Live bytes are the storages created inside the context and still alive,
    plus those of ``track`` at entry, plus ``used``; each is rounded up to 512 bytes as
    CUDA's allocator does. Kernel-internal scratch is not seen (see the module notes).

    Nesting works (each card keeps its own account; the smaller one refuses first), and
    leaving the context, by an exception too, removes the mode.

    Args:
        gpu_or_bytes: The card: a `GPU` (its ``memory``), a byte count, a size string
            (``"8GiB"``) or a GPU name from the catalog.
        track: Objects already holding tensors that belong on the card (model, optimizer,
            inputs): their storages count from the start, and their frees are seen.
        used: Bytes taken before any tensor, e.g. the CUDA context (about 300 MB: PyTorch
            PR #86509 measured 287,047,680 bytes with lazy module loading).

    Returns:
        A `SimulatedGPU` to enter; it reports `live`, `peak`, `demand` and `ooms`.

    Raises:
        torch.OutOfMemoryError: On entry, if the tracked tensors alone exceed the card;
            inside, when an op would exceed it.

    Example:
        >>> with simulate_gpu("1MiB") as card:
        ...     a = torch.empty(2**18)  # 1 MiB of float32: fits exactly
        ...     try:
        ...         b = torch.empty(1)
        ...     except torch.OutOfMemoryError as error:
        ...         print(str(error)[:47])
        CUDA out of memory. Tried to allocate 512 B. (s
        >>> card.peak, card.ooms
        (1048576, 1)
    """
    capacity, name = budget_of(gpu_or_bytes)
    if capacity <= 0:
        raise ValueError(f"gpu_or_bytes must be a capacity > 0 bytes; got {gpu_or_bytes!r}")
    taken = parse_bytes(used)
    if taken >= capacity:
        raise ValueError(
            f"used={used!r} ({format_bytes(taken)}) leaves nothing of the "
            f"{format_bytes(capacity)} card {name!r}; pass used= below the capacity (it is "
            "what the card holds before any tensor, e.g. the CUDA context)"
        )
    track_tuple = track if isinstance(track, tuple) else (track,)
    return SimulatedGPU(capacity, name=name, track=track_tuple, used=taken)
