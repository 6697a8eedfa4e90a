"""Measurement primitives of `torchfit.loaders`.

One timed trial of a DataLoader, the index stream trials share, worker seeding, and the
checks: state left as found, samples duplicated across workers, Python objects copied
into workers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from torchfit._core.rng import kept_rng

__all__ = [
    "IndexStream",
    "StreamSampler",
    "TrialResult",
    "WorkerSeeder",
    "batch_bytes",
    "batch_len",
    "close_iterator",
    "cuda_initialized",
    "describe_error",
    "find_generators",
    "leaves",
    "preserved_state",
    "quiet_worker_count",
    "run_trial",
    "runqueue_seconds",
]

_SCHEDSTAT = Path("/proc/thread-self/schedstat")

# torch warns when num_workers exceeds the CPUs it counts (DataLoader.
# check_worker_number_rationality); the probe tries such counts on purpose (an I/O-bound
# dataset gains from them) and reports the choice instead.
_WORKER_COUNT_WARNING = r"This DataLoader will create \d+ worker processes"


class WorkerSeeder:
    """``worker_init_fn`` that seeds ``random``, ``numpy`` and ``torch`` in each worker.

    Each worker's seed is ``base_seed + worker_id``, where the DataLoader draws
    ``base_seed`` from its ``generator`` (or torch's global RNG) once per epoch: seeds
    differ between workers and repeat when the generator is seeded alike. numpy gets a
    128-bit state expanded from that seed by ``numpy.random.SeedSequence``. The caller's
    own ``worker_init_fn`` runs afterwards, so it can still override any of this.

    Example:
        >>> WorkerSeeder(print).user_fn is print
        True
    """

    def __init__(self, user_fn: Callable[[int], object] | None = None) -> None:
        """Wrap ``user_fn`` (``None`` for none); a `WorkerSeeder` is unwrapped, not nested."""
        inner = user_fn.user_fn if isinstance(user_fn, WorkerSeeder) else user_fn
        self.user_fn: Callable[[int], object] | None = inner

    def __call__(self, worker_id: int) -> None:
        """Seed the three generators of this worker, then call the caller's function."""
        info = get_worker_info()
        if info is not None:
            random.seed(info.seed)
            torch.manual_seed(info.seed)
            np.random.seed(np.random.SeedSequence(info.seed).generate_state(4))  # noqa: NPY002
        if self.user_fn is not None:
            self.user_fn(worker_id)


def cuda_initialized() -> bool:
    """True when this process has already initialized CUDA (never initializes it)."""
    return bool(torch.cuda.is_initialized())  # type: ignore[no-untyped-call]


def find_generators(*objects: object) -> list[torch.Generator]:
    """The ``torch.Generator`` objects held by samplers (nested through ``.sampler``)."""
    found: dict[int, torch.Generator] = {}
    queue = list(objects)
    while queue:
        obj = queue.pop()
        if isinstance(obj, torch.Generator):
            found[id(obj)] = obj
        elif obj is not None and not isinstance(obj, Dataset):
            queue += [getattr(obj, "generator", None), getattr(obj, "sampler", None)]
    return list(found.values())


@contextlib.contextmanager
def preserved_state(generators: Iterable[torch.Generator]) -> Iterator[None]:
    """Restore the global RNGs (``random``, numpy, torch, CUDA) and ``generators`` on exit.

    A probe iterates the caller's sampler and dataset like an epoch would; this puts
    every random stream they may have advanced back where it was.
    """
    gens = list(generators)
    gen_states = [gen.get_state() for gen in gens]
    try:
        with kept_rng():
            yield
    finally:
        for gen, state in zip(gens, gen_states, strict=True):
            gen.set_state(state)


def leaves(obj: object) -> Iterator[object]:
    """Every non-container object inside nested mappings, lists and tuples."""
    if isinstance(obj, Mapping):
        for value in obj.values():
            yield from leaves(value)
    elif isinstance(obj, list | tuple):
        for value in obj:
            yield from leaves(value)
    else:
        yield obj


def batch_bytes(batch: object) -> int:
    """Bytes of the tensors and arrays in a (nested) batch: what crosses shared memory."""
    total = 0
    for leaf in leaves(batch):
        if isinstance(leaf, torch.Tensor):
            total += leaf.element_size() * leaf.nelement()
        elif isinstance(leaf, np.ndarray):
            total += leaf.nbytes
    return total


def batch_len(batch: object, default: int) -> int:
    """Samples in a batch: the leading size of its first tensor or array, else ``default``."""
    for leaf in leaves(batch):
        if isinstance(leaf, torch.Tensor | np.ndarray) and leaf.ndim > 0:
            return int(leaf.shape[0])
    return default


class IndexStream:
    """Index batches from the caller's sampler, epoch after epoch, shared by all trials.

    Each trial continues where the last one stopped, so no trial re-reads the samples a
    previous one warmed the page cache with. Stops if an epoch yields nothing.
    """

    def __init__(self, source: Iterable[Any]) -> None:
        """Draw from ``source`` (a batch sampler, or a sampler when not batching)."""
        self.source = source
        self._it: Iterator[Any] = iter(source)
        self._fresh = True

    def __next__(self) -> Any:
        """The next index batch; raises StopIteration for an empty sampler."""
        while True:
            try:
                item = next(self._it)
            except StopIteration:
                if self._fresh:
                    raise
                self._it, self._fresh = iter(self.source), True
                continue
            self._fresh = False
            return item


class StreamSampler:
    """A sampler (or batch sampler) that hands out an `IndexStream`, without end."""

    def __init__(self, stream: IndexStream) -> None:
        """Serve ``stream``."""
        self.stream = stream

    def __iter__(self) -> Iterator[Any]:
        """Index batches until the trial stops asking."""
        while True:
            try:
                yield next(self.stream)
            except StopIteration:
                return


@dataclasses.dataclass(frozen=True)
class TrialResult:
    """Raw figures of one trial."""

    samples_per_s: float
    startup_s: float
    batches: int
    seconds: float
    cpu_load: float | None
    batch_bytes: int | None
    shutdown_s: float = 0.0
    error: str = ""


def close_iterator(it: object) -> None:
    """Shut down a DataLoader iterator's workers now, not at garbage collection."""
    # _MultiProcessingDataLoaderIter._shutdown_workers is private but has been the
    # iterator's own clean-up (called from its __del__) since torch 1.0; calling it
    # early is what leaves no worker process behind.
    shutdown = getattr(it, "_shutdown_workers", None)
    if callable(shutdown):
        shutdown()


@contextlib.contextmanager
def quiet_worker_count() -> Iterator[None]:
    """Silence torch's "more workers than CPUs" warning (torchfit reports it instead)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_WORKER_COUNT_WARNING)
        yield


@dataclasses.dataclass
class _Clock:
    """Running counts of one trial."""

    start: float
    seen: int = 0
    timed: int = 0
    samples: int = 0
    total: int = 0
    t_from: float = 0.0
    t_last: float = 0.0
    cpu_from: float = 0.0
    cpu_last: float = 0.0
    queued_from: float = 0.0
    queued_last: float = 0.0
    first: float | None = None
    nbytes: int | None = None
    ended: bool = False
    arrivals: list[tuple[float, int]] = dataclasses.field(default_factory=list)

    def rate(self) -> float:
        """Steady-state samples/s.

        Batches the workers prefetched while the others started arrive in a burst at
        first, so the rate counts the later half of the timed batches only (from 4 on).
        """
        if self.timed >= 4:
            (t0, _), later = self.arrivals[self.timed // 2 - 1], self.arrivals[self.timed // 2 :]
            return sum(size for _, size in later) / max(self.t_last - t0, 1e-9)
        if self.timed >= 2:
            return self.samples / max(self.t_last - self.t_from, 1e-9)
        if self.seen and (self.ended or self.timed == 0):
            # A short epoch (or a lone main-process batch): everything, start-up included.
            return self.total / max(self.t_last - self.start, 1e-9)
        return 0.0


def runqueue_seconds() -> float:
    """Seconds this thread has waited, runnable, for a CPU (0.0 where Linux does not say).

    The second field of ``/proc/thread-self/schedstat`` (Linux
    Documentation/scheduler/sched-stats.rst: "time spent waiting on a runqueue", in ns).
    """
    try:
        return int(_SCHEDSTAT.read_text(encoding="ascii").split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def describe_error(exc: BaseException) -> str:
    """``"Type: message"``; for an error re-raised from a worker, the original's last line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if len(lines) > 1 and "Original Traceback" in str(exc):
        return f"{lines[-1]} (in a worker)"
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def run_trial(
    loader: DataLoader[Any],
    *,
    window_end: float,
    hard_end: float,
    default_len: int,
    batched: bool = True,
    min_batches: int = 4,
) -> TrialResult:
    """Iterate ``loader`` and time it (ends are ``time.perf_counter`` values).

    The first ``max(1, num_workers)`` batches are warm-up (workers start together, so the
    first round arrives at once); samples/s counts the batches after them. The trial
    stops at ``window_end`` once it has timed ``min_batches`` batches, and at
    ``hard_end`` regardless (after at least one batch). A worker trial that ends with
    fewer than 2 timed batches is inconclusive: an error, not a rate. Errors of a worker
    configuration are returned, not raised; errors in the main process propagate.
    """
    clock = _Clock(start=time.perf_counter())
    clock.t_from = clock.t_last = clock.start
    clock.cpu_from = clock.cpu_last = time.process_time()
    clock.queued_from = clock.queued_last = runqueue_seconds()
    warm = max(1, loader.num_workers)
    it: Iterator[Any] | None = None
    error = ""
    try:
        with quiet_worker_count():
            it = iter(loader)
        while True:
            now = time.perf_counter()
            if clock.seen and (
                now >= hard_end or (now >= window_end and clock.timed >= min_batches)
            ):
                break
            try:
                batch = next(it)
            except StopIteration:
                clock.ended = True
                break
            size = batch_len(batch, default_len) if batched else 1
            _count(clock, batch, warm=warm, size=size)
    except Exception as exc:
        if loader.num_workers == 0:
            raise
        error = describe_error(exc)
    finally:
        closing = time.perf_counter()
        close_iterator(it)
        shutdown = time.perf_counter() - closing
    if not error and loader.num_workers and clock.timed < 2 and not clock.ended:
        error = f"inconclusive: the budget ran out after {clock.seen} batch(es)"
    rate = clock.rate()
    cpu = clock.cpu_last - clock.cpu_from if clock.timed else None
    # Wall time the loading thread sat runnable but without a CPU is not time it needed:
    # without it, CPU over wall is the CPU a loading process needs, contention aside.
    window = clock.t_last - clock.t_from - (clock.queued_last - clock.queued_from)
    return TrialResult(
        samples_per_s=0.0 if error else rate,
        startup_s=(clock.first or clock.t_last) - clock.start,
        batches=clock.timed,
        seconds=time.perf_counter() - clock.start,
        cpu_load=None if cpu is None or window <= 0 else cpu / window,
        batch_bytes=clock.nbytes,
        shutdown_s=shutdown,
        error=error,
    )


def _count(clock: _Clock, batch: object, *, warm: int, size: int) -> None:
    clock.t_last = time.perf_counter()
    clock.seen += 1
    clock.total += size
    if clock.seen == 1:
        clock.first, clock.nbytes = clock.t_last, batch_bytes(batch)
    if clock.seen <= warm:
        clock.t_from, clock.cpu_from = clock.t_last, time.process_time()
        clock.queued_from = runqueue_seconds()
    else:
        clock.timed += 1
        clock.samples += size
        clock.arrivals.append((clock.t_last, size))
        clock.cpu_last = time.process_time()
        clock.queued_last = runqueue_seconds()
