"""Host memory of DataLoader workers: copied pages, batches in flight, pinned buffers.

Each worker is a forked copy of the training process that shares its pages until it
writes one (Linux copy-on-write). A worker adds:

* its own pages: the worker loop, its queues, the pages the interpreter writes anyway
  (`WORKER_BASE_BYTES`, measured);
* the pages of the dataset's Python objects it reads (`torchfit.host.objects`; pytorch
  issue #13246): a worker that reads every item copies them all;
* the batches it has made and not yet handed over: the DataLoader keeps
  ``prefetch_factor * num_workers`` batches outstanding
  (``torch/utils/data/dataloader.py``, ``_MultiProcessingDataLoaderIter._reset``), each in
  shared memory (``/dev/shm``; torch.multiprocessing's "file_descriptor" strategy), plus the
  batch the training step holds.

With ``pin_memory=True`` the pin-memory thread copies each batch into page-locked memory
from torch's ``CachingHostAllocator``, which rounds every block up to a power of two and
keeps freed blocks for reuse (``aten/src/ATen/core/CachingHostAllocator.h``, ``allocate``:
"round up allocation to the nearest power of two to improve reuse").
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

from torchfit._core.units import format_bytes
from torchfit.host.objects import PAGE_BYTES, copied_objects
from torchfit.host.rss import private_bytes
from torchfit.loaders.probe import close_iterator

__all__ = [
    "WORKER_BASE_BYTES",
    "WorkerMeasurement",
    "WorkerMemory",
    "measure_workers",
    "touched_fraction",
    "worker_memory",
]

#: Unique memory (USS) of a forked worker whose dataset holds no Python containers, after
#: an epoch of small batches. It depends on what the parent did before the fork: a worker
#: seeds NumPy's generator (``torch/utils/data/_utils/worker.py``), importing
#: ``numpy.random`` itself when the parent never did. Measured with torch 2.13 and Python
#: 3.11 on Linux (AMD EPYC) under a fresh script that imported torch: 10.5 MiB of written
#: pages when the script had imported ``numpy.random``, 13.3 MiB when it had not, plus up
#: to 3 MiB of library pages the worker alone read in (private until another process maps
#: them: USS 11.5 and 16 MiB on a machine running nothing else). A parent whose heap has
#: freed chunks the worker reuses, or that froze its heap (``gc.freeze``), moves it by a
#: few MiB either way. About the middle:
WORKER_BASE_BYTES = 14 * 2**20


def touched_fraction(
    num_workers: int,
    *,
    item_bytes: float,
    batch_size: int,
    shuffle: bool,
    persistent: bool,
    classes: int = 1,
) -> float:
    """Share of the dataset's object pages one worker copies in an epoch.

    Workers take whole batches in turn. Without shuffling, a worker reads the same
    contiguous runs of ``batch_size`` items each epoch: ``1 / num_workers`` of the pages
    plus one page at each run's edge, per size class (`torchfit.host.objects.size_classes`).
    With shuffling it reads a random ``1 / num_workers`` of the items, and a page holding
    ``k`` of them escapes it with probability ``(1 - 1 / num_workers) ** k``; persistent
    workers re-read a fresh random share each epoch until they hold every page.

    Example:
        >>> touched_fraction(4, item_bytes=100, batch_size=256, shuffle=False, persistent=False)
        0.29
        >>> touched_fraction(4, item_bytes=100, batch_size=256, shuffle=True, persistent=False)
        1.0
    """
    if num_workers <= 1:
        return 1.0 if num_workers == 1 else 0.0
    if shuffle:
        if persistent:
            return 1.0
        per_page = max(PAGE_BYTES * classes / max(item_bytes, 1.0), 1.0)
        escape = (1.0 - 1.0 / num_workers) ** per_page
        return round(1.0 - float(escape), 3)
    run = batch_size * max(item_bytes, 1.0)
    return round(min(1.0, (run + classes * PAGE_BYTES) / (num_workers * run)), 3)


def _pow2(nbytes: int) -> int:
    return 0 if nbytes <= 0 else 1 << math.ceil(math.log2(nbytes))


@dataclasses.dataclass(frozen=True)
class WorkerMemory:
    """What a DataLoader's workers add to host memory, in bytes.

    Attributes:
        num_workers: Worker processes.
        base: Each worker's own pages (`WORKER_BASE_BYTES`).
        python_bytes: The dataset's Python objects, as copy-on-write sees them.
        fraction: Share of those pages each worker copies (`touched_fraction`).
        in_flight: Batches in shared memory: ``(prefetch_factor * num_workers + 1) *
            batch_bytes``.
        pinned: Page-locked copies of the batches in flight, each tensor rounded up to a
            power of two (``pin_memory=True`` only).
        notes: The assumptions, in words.

    Example:
        >>> mem = WorkerMemory(num_workers=4, base=2**20, python_bytes=2**30, fraction=0.25,
        ...                    in_flight=0, pinned=0)
        >>> format_bytes(mem.per_worker), format_bytes(mem.total)
        ('257.00 MiB', '1.00 GiB')
    """

    num_workers: int
    base: int
    python_bytes: int
    fraction: float
    in_flight: int
    pinned: int
    notes: tuple[str, ...] = ()

    @property
    def per_worker(self) -> int:
        """Unique memory of one worker: its own pages and the object pages it copies."""
        return self.base + round(self.python_bytes * self.fraction)

    @property
    def copies(self) -> int:
        """All workers' unique memory."""
        return self.num_workers * self.per_worker

    @property
    def total(self) -> int:
        """Everything the workers add: copies, batches in flight and pinned buffers."""
        return self.copies + self.in_flight + self.pinned

    def to_dict(self) -> dict[str, Any]:
        """Every field and derived figure as plain Python values."""
        data = dataclasses.asdict(self)
        data["notes"] = list(self.notes)
        data.update(per_worker=self.per_worker, copies=self.copies, total=self.total)
        return data

    def __str__(self) -> str:
        """A small table."""
        rows = [
            (f"{self.num_workers} workers' own pages", self.num_workers * self.base),
            (
                f"copied objects ({self.fraction:.0%} each)",
                self.copies - self.num_workers * self.base,
            ),
            ("batches in /dev/shm", self.in_flight),
            ("pinned buffers", self.pinned),
            ("total", self.total),
        ]
        lines = ["Host memory of the DataLoader workers"]
        lines += [f"  {name:<32} {format_bytes(value):>12}" for name, value in rows]
        lines += [f"  - {note}" for note in self.notes]
        return "\n".join(lines)


def worker_memory(
    dataset: object,
    *,
    num_workers: int,
    batch_size: int,
    prefetch_factor: int | None = 2,
    shuffle: bool = False,
    persistent_workers: bool = False,
    batch_bytes: int = 0,
    batch_tensor_bytes: tuple[int, ...] = (),
    pin_memory: bool = False,
    dataset_len: int | None = None,
) -> WorkerMemory:
    """Predict the host memory a DataLoader's workers add, before starting them.

    Args:
        dataset: The dataset (its Python containers are sized from a sample).
        num_workers: Worker processes (0: none, nothing added).
        batch_size: Samples per batch.
        prefetch_factor: Batches each worker keeps ahead (DataLoader's default, 2).
        shuffle: Whether the sampler shuffles.
        persistent_workers: Workers live across epochs (and keep what they copied).
        batch_bytes: Tensor bytes of one batch (`torchfit.loaders.LoaderReport.batch_bytes`).
        batch_tensor_bytes: Bytes of each tensor of a batch, for pinned rounding;
            default: one tensor of ``batch_bytes``.
        pin_memory: Batches are copied into page-locked memory.
        dataset_len: Items in the dataset (default: ``len(dataset)``), to size one item.

    Returns:
        A `WorkerMemory`.

    Raises:
        ValueError: a negative worker count, a batch size below 1.

    Example:
        >>> from torch.utils.data import Dataset
        >>> class Paths(Dataset):
        ...     def __init__(self):
        ...         self.paths = [f"img/{i:08d}.jpg" for i in range(100_000)]
        ...     def __len__(self):
        ...         return len(self.paths)
        >>> mem = worker_memory(Paths(), num_workers=4, batch_size=64, shuffle=True)
        >>> mem.fraction, format_bytes(mem.python_bytes), format_bytes(mem.per_worker)
        (1.0, '7.72 MiB', '21.72 MiB')
    """
    if isinstance(num_workers, bool) or num_workers < 0:
        raise ValueError(f"num_workers must be a whole number >= 0; got {num_workers!r}")
    if isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a whole number >= 1; got {batch_size!r}")
    found = copied_objects(dataset)
    count = dataset_len if dataset_len is not None else _length(dataset, found.items)
    item = found.total / max(count, 1)
    fraction = touched_fraction(
        num_workers, item_bytes=item, batch_size=batch_size, shuffle=shuffle,
        persistent=persistent_workers, classes=found.classes,
    )  # fmt: skip
    ahead = (prefetch_factor or 2) * num_workers
    in_flight = (ahead + 1) * batch_bytes if num_workers else 0
    tensors = batch_tensor_bytes or ((batch_bytes,) if batch_bytes else ())
    pinned = (ahead + 1) * sum(_pow2(size) for size in tensors) if pin_memory else 0
    notes = [
        f"{where}: {items:,} objects, {format_bytes(size)}" for where, items, size in found.found
    ]
    if shuffle and persistent_workers:
        notes.append("shuffled persistent workers end up copying every object page")
    return WorkerMemory(
        num_workers=num_workers,
        base=WORKER_BASE_BYTES if num_workers else 0,
        python_bytes=found.total,
        fraction=fraction,
        in_flight=in_flight,
        pinned=pinned,
        notes=tuple(notes),
    )


def _length(dataset: object, fallback: int) -> int:
    try:
        return len(dataset)  # type: ignore[arg-type]
    except TypeError:
        return fallback


@dataclasses.dataclass(frozen=True)
class WorkerMeasurement:
    """What a DataLoader's workers really added, read from ``/proc``.

    Attributes:
        uss: Each worker's unique memory (USS, ``/proc/<pid>/smaps_rollup``) after the
            batches were read: its own pages and the pages it copied.
        dirty: Of each ``uss``, the written pages; the rest are library pages the worker
            alone has read in, shared as soon as another process maps them
            (`torchfit.host.rss.PrivateBytes`).
        shm_peak: Peak of the ``/dev/shm`` files the loader's processes hold, above what
            the main process held before the first batch.
        batches: Batches read.
    """

    uss: tuple[int, ...]
    shm_peak: int
    batches: int
    dirty: tuple[int, ...]

    @property
    def copies(self) -> int:
        """All workers' unique memory (compare with `WorkerMemory.copies`)."""
        return sum(self.uss)

    def to_dict(self) -> dict[str, Any]:
        """Every field, plus `copies`, as plain Python values."""
        data = dataclasses.asdict(self)
        return {**data, "uss": list(self.uss), "dirty": list(self.dirty), "copies": self.copies}


def _shm_held(pids: list[int]) -> int:
    """Bytes of the ``/dev/shm`` files these processes hold, each file once.

    A batch in flight is a deleted ``/dev/shm/torch_*`` file that its worker holds open
    until the main process (``pids[0]``) takes it and maps it: the open files of every
    process and the mappings of the first are read (``/proc/<pid>/fd``, ``/proc/<pid>/maps``),
    which leaves out every other process's shared memory, which the file system's level
    would count.
    """
    files: dict[tuple[int, int], int] = {}
    try:
        maps = Path("/proc", str(pids[0]), "maps").read_text(encoding="ascii", errors="replace")
    except OSError:
        maps = ""
    for line in (row for row in maps.splitlines() if _SHM in row):
        fields = line.split(maxsplit=5)
        low, high = (int(x, 16) for x in fields[0].split("-"))
        major, minor = (int(x, 16) for x in fields[3].split(":"))
        key = (os.makedev(major, minor), int(fields[4]))
        files[key] = max(files.get(key, 0), high - low)
    for pid in pids:
        folder = f"/proc/{pid}/fd"  # os, not pathlib: read after every batch, 3x faster
        try:
            fds = os.listdir(folder)  # noqa: PTH208
        except OSError:
            continue  # the process ended
        for fd in fds:
            link = f"{folder}/{fd}"
            try:
                if not os.readlink(link).startswith(_SHM):  # noqa: PTH115
                    continue
                stat = os.stat(link)  # noqa: PTH116
            except OSError:
                continue  # closed meanwhile
            key = (stat.st_dev, stat.st_ino)
            files[key] = max(files.get(key, 0), stat.st_size)
    return sum(files.values())


_SHM = "/dev/shm/"  # noqa: S108 - read only


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text(encoding="ascii", errors="replace")
        except OSError:
            continue
        if int(stat.rpartition(")")[2].split()[1]) == pid:  # field 4: the parent's pid
            found.append(int(entry.name))
    return found


def measure_workers(
    loader: DataLoader[Any], *, batches: int | None = None, hold_seconds: float = 0.0
) -> WorkerMeasurement:
    """Read ``batches`` batches (default: all but the last) and measure the workers.

    The workers' unique memory is read while they are alive, after the batches; the
    ``/dev/shm`` files the main process and its workers hold after each batch (another
    process's shared memory is not counted). ``hold_seconds`` sleeps after each batch, so the
    workers fill their prefetch queues as behind a slow training step. Linux only.

    Example:
        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> loader = DataLoader(TensorDataset(torch.zeros(64, 4)), batch_size=8, num_workers=2)
        >>> m = measure_workers(loader)
        >>> len(m.uss), m.batches
        (2, 7)
    """
    before = set(_children(os.getpid()))
    count = batches if batches is not None else max(len(loader) - 1, 1)
    start = _shm_held([os.getpid()])
    peak = 0
    it = iter(loader)  # starts the workers
    ours = [os.getpid(), *(pid for pid in _children(os.getpid()) if pid not in before)]
    try:
        for _ in range(count):
            batch = next(it)  # held while "the step runs", as training holds it
            if hold_seconds:
                time.sleep(hold_seconds)
            peak = max(peak, _shm_held(ours) - start)
            del batch
        private = [private_bytes(pid) for pid in ours[1:]]
    finally:
        close_iterator(it)
    return WorkerMeasurement(
        uss=tuple(p.uss for p in private),
        shm_peak=peak,
        batches=count,
        dirty=tuple(p.dirty for p in private),
    )
