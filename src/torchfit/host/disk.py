"""How fast the disk that holds the data reads, the way a DataLoader's workers read it.

A read the page cache serves says nothing about the disk, so `measure_disk` reads with
``O_DIRECT`` (open(2): "transfers are performed directly to or from user-space buffers",
buffer, offset and size aligned to the block size). It reads either a temporary file it
writes beside the data (``fsync``, then ``posix_fadvise(POSIX_FADV_DONTNEED)``, Linux
``mm/fadvise.c``: clean pages are invalidated; buffered reads of dropped pages where
``O_DIRECT`` is refused) or, with ``file=``, the data file itself, read-only.

The loader's pattern decides the speed, so the probe copies it: ``block`` bytes per read
(one sample), ``1..threads`` readers at once (the workers), the blocks shuffled or in file
order and dealt ``batch`` at a time (`DataLoader` hands each worker whole batches in turn:
``_MultiProcessingDataLoaderIter._try_put_index``, torch/utils/data/dataloader.py, torch
2.13). Each reader count is measured on its own, never extrapolated: a virtual disk or a
single queue may serve four readers no faster than one. A disk shared with other machines
drifts from second to second, so the tests run in interleaved rounds and the median
counts; `DiskSpeed.spread` says how far the rounds disagreed.

Inside a virtual machine ``O_DIRECT`` bypasses the guest's cache, not the host's: a file
the host still caches (one just written, or just read) reads as fast as the host's
memory path. The probe never reads a block twice until it has read the whole file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import errno
import mmap
import os
import random
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torchfit._core.units import format_bytes, parse_bytes

__all__ = ["DiskSpeed", "ReadOrder", "idle_credit", "measure_disk"]

_ALIGN = 4096
_SEQUENTIAL_BLOCK = 1 << 20
#: `measure_disk`'s lone reader idles this many reads' time before each read.
_IDLE_READS = 1.5


class ReadOrder(enum.StrEnum):
    """The order a Dataset's ``__getitem__`` reads its blocks in."""

    RANDOM = "random"  # a shuffled loader
    SEQUENTIAL = "sequential"  # a loader without shuffle over a file in sample order


@dataclasses.dataclass(frozen=True)
class DiskSpeed:
    """Read speeds of one file system, in bytes per second.

    Attributes:
        path: The folder (or data file) measured.
        sequential: One reader, front to back, in ``1 MiB`` requests.
        random: One reader, blocks of `block` bytes (queue depth 1).
        parallel: `threads` readers at once.
        block: Bytes per read.
        threads: Most readers measured.
        method: How the page cache was kept out (``"O_DIRECT"`` or ``"fadvise"``).
        curve: Measured bytes/s with 1, 2, ... `threads` readers (median of the rounds);
            empty for a speed from a spec sheet.
        spread: The widest disagreement between rounds: ``(max - min) / median``.
        order: The read order measured (`ReadOrder`).
        idle_credit: Share of a read the disk takes off after its reader idled, 0 to 1
            (`idle_credit`): 0 for a drive that serves at its own pace, 1 for a set rate
            (a cloud volume's provisioned throughput, Linux's ``blk-throttle``) that lets
            a read through at once after the reader idled as long as the read takes.
            Measured by `measure_disk` with one reader that idles one and a half reads'
            time between reads; `Feed.throughput` takes ``idle_credit * cpu`` off each
            read.

    Example:
        >>> speed = DiskSpeed(path="/data", sequential=2e9, random=2e8, parallel=8e8,
        ...                   block=131072, threads=4, method="O_DIRECT")
        >>> speed.random_at(2) / 1e6, speed.random_at(16) / 1e6
        (400.0, 800.0)
        >>> measured = dataclasses.replace(speed, curve=(2e8, 2.2e8, 2.3e8, 2.3e8))
        >>> measured.random_at(2) / 1e6, measured.random_at(16) / 1e6
        (220.0, 230.0)
    """

    path: str
    sequential: float
    random: float
    parallel: float
    block: int
    threads: int
    method: str
    curve: tuple[float, ...] = ()
    spread: float = 0.0
    order: str = ReadOrder.RANDOM.value
    idle_credit: float = 0.0

    def random_at(self, readers: int) -> float:
        """Bytes/s with ``readers`` at once: the measured curve (its last point beyond it).

        Without a curve (a spec sheet's two numbers): linear from one reader up to
        `parallel`.
        """
        readers = max(readers, 1)
        if self.curve:
            return self.curve[min(readers, len(self.curve)) - 1]
        return min(self.random * readers, max(self.parallel, self.random))

    @property
    def best(self) -> float:
        """The fastest reads seen at any reader count."""
        return max(self.curve) if self.curve else max(self.parallel, self.random)

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain Python values."""
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        """One line per speed."""
        per_s = format_bytes
        readers = ", ".join(f"{i} {per_s(rate)}/s" for i, rate in enumerate(self.curve, 1))
        readers = readers or f"{self.threads} readers {per_s(self.parallel)}/s"
        spread = f", rounds within {self.spread:.0%}" if self.curve else ""
        credit = f", idle time credited {self.idle_credit:.0%}" if self.idle_credit else ""
        return (
            f"disk under {self.path} ({self.method}, {self.order} {per_s(self.block)} "
            f"blocks): sequential {per_s(self.sequential)}/s, readers {readers}{spread}{credit}"
        )


@contextlib.contextmanager
def _scratch_file(folder: Path, size: int) -> Iterator[Path]:
    handle, name = tempfile.mkstemp(prefix=".torchfit-disk-", dir=folder)
    path = Path(name)
    try:
        chunk = os.urandom(1 << 20)  # incompressible, for file systems that compress
        for _ in range(size >> 20):
            os.write(handle, chunk)
        os.fsync(handle)
        os.posix_fadvise(handle, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(handle)
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.close(handle)
        path.unlink(missing_ok=True)


def _open(path: Path, *, owned: bool) -> tuple[int, str]:
    """Open for reading past the cache; ``owned``: ours, so its cached pages may be dropped."""
    direct, noatime = getattr(os, "O_DIRECT", 0), getattr(os, "O_NOATIME", 0)
    # O_NOATIME (open(2)): the read leaves the file's access time alone; only the file's
    # owner may ask (EPERM otherwise); EINVAL: a file system that refuses O_DIRECT
    for extra in (noatime, 0) if direct else ():
        try:
            return os.open(path, os.O_RDONLY | direct | extra), "O_DIRECT"
        except OSError as error:
            if error.errno not in (errno.EPERM, errno.EINVAL):
                raise
    if not owned:
        raise ValueError(
            f"{path} cannot be opened with O_DIRECT, so its reads would come from the "
            "page cache; measure a folder on the same disk instead (measure_disk(folder))"
        )
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    return fd, "fadvise"


class _Blocks:
    """Offsets handed out ``batch`` at a time, every block once before any again."""

    def __init__(self, path: Path, size: int, block: int, order: ReadOrder, *, owned: bool) -> None:
        offsets = list(range(0, size - block + 1, block))
        # a private RNG, seeded afresh: the user's global one is left alone, and each
        # probe starts elsewhere in the file, away from blocks the last one read
        rng = random.Random()  # noqa: S311 - an order of reads, not a secret
        if order is ReadOrder.RANDOM:
            rng.shuffle(offsets)
        start = rng.randrange(len(offsets))
        self.offsets = offsets[start:] + offsets[:start]
        self.path, self.owned, self.cursor = path, owned, 0
        self.lock = threading.Lock()

    def take(self, count: int) -> list[int]:
        with self.lock:
            if self.cursor + count > len(self.offsets):
                self.cursor = 0
                if self.owned:  # a buffered fallback would hit the pages read last pass
                    fd = os.open(self.path, os.O_RDONLY)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    os.close(fd)
            taken = self.offsets[self.cursor : self.cursor + count]
            self.cursor += count
            return taken


@contextlib.contextmanager
def _reading(blocks: _Blocks, block: int) -> Iterator[tuple[int, mmap.mmap]]:
    """One reader's file descriptor and page-aligned buffer (as O_DIRECT needs), closed after."""
    fd, _ = _open(blocks.path, owned=blocks.owned)
    buffer = mmap.mmap(-1, block)
    try:
        yield fd, buffer
    finally:
        os.close(fd)
        buffer.close()


def _reader(blocks: _Blocks, block: int, batch: int, deadline: float, done: list[int]) -> None:
    with _reading(blocks, block) as (fd, buffer):
        while time.perf_counter() < deadline:
            done.extend(os.preadv(fd, [buffer], offset) for offset in blocks.take(batch))


def _read_time_after_idling(blocks: _Blocks, block: int, idle: float, seconds: float) -> float:
    """Mean seconds of one read by a lone reader that idles ``idle`` seconds before each."""
    reading, reads = 0.0, 0
    deadline = time.perf_counter() + seconds
    with _reading(blocks, block) as (fd, buffer):
        while time.perf_counter() < deadline or not reads:
            time.sleep(idle)
            (offset,) = blocks.take(1)
            begin = time.perf_counter()
            os.preadv(fd, [buffer], offset)
            reading += time.perf_counter() - begin
            reads += 1
    return reading / reads


def idle_credit(alone: float, after_idling: float) -> float:
    """Share of a read a disk took off after the reader idled, 0 to 1.

    A read took ``alone`` seconds back to back, ``after_idling`` after the reader idled
    longer than that.

    Example:
        >>> idle_credit(0.010, 0.010), idle_credit(0.010, 0.0002), idle_credit(0.01, 0.012)
        (0.0, 0.98, 0.0)
    """
    return min(max(1.0 - after_idling / alone, 0.0), 1.0) if alone > 0 else 0.0


def _rate(blocks: _Blocks, block: int, batch: int, readers: int, seconds: float) -> float:
    done: list[list[int]] = [[] for _ in range(readers)]
    begin = time.perf_counter()
    threads = [
        threading.Thread(target=_reader, args=(blocks, block, batch, begin + seconds, done[i]))
        for i in range(readers)
    ]  # preadv releases the GIL: threads read as concurrently as worker processes
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(map(sum, done)) / (time.perf_counter() - begin)


def measure_disk(
    path: str | Path = ".",
    *,
    file: str | Path | None = None,
    size: int | str = "256MiB",
    block: int | str = "128KiB",
    threads: int = 4,
    order: ReadOrder | str = ReadOrder.RANDOM,
    batch: int = 1,
    seconds: float = 0.5,
    rounds: int = 3,
) -> DiskSpeed:
    """Measure the read speed of the disk under ``path`` with 1 to ``threads`` readers.

    Without ``file`` it writes a ``size`` temporary file there (removed afterwards; keep
    it larger than the disk's own cache). With ``file`` it reads that file, read-only,
    with ``O_DIRECT`` (and ``O_NOATIME`` where the file is yours): nothing is written.
    Each round also times a lone reader that idles one and a half reads' time before each
    read (`DiskSpeed.idle_credit`). Takes about ``rounds * (threads + 2) * seconds`` plus the
    write.

    Args:
        path: A folder on the disk that holds the data.
        file: A data file to read instead of a temporary one (at least 8 MiB).
        size: Bytes of the temporary file (whole MiB).
        block: Bytes per read (one sample); a multiple of 4 KiB.
        threads: Most readers at once (the DataLoader's workers).
        order: `ReadOrder`: ``"random"`` for a shuffled loader, ``"sequential"`` for
            samples stored in the order an unshuffled loader asks for them.
        batch: Consecutive blocks a reader takes at a time (the loader's batch size
            for ``"sequential"``).
        seconds: Time per reader count per round.
        rounds: Rounds; the median of each reader count counts.

    Returns:
        A `DiskSpeed`.

    Raises:
        ValueError: a block that is not a multiple of 4 KiB, a file or size under
            8 MiB, a data file that refuses ``O_DIRECT``, threads, batch or rounds < 1.

    Example:
        >>> speed = measure_disk(tempfile.gettempdir(), size="16MiB", seconds=0.1, rounds=1)
        >>> len(speed.curve), speed.sequential > 0 and speed.random_at(2) > 0
        (4, True)
    """
    chunk, kind = parse_bytes(block), ReadOrder(order)
    if chunk % _ALIGN or not chunk:
        raise ValueError(f"block must be a whole multiple of 4 KiB; got {chunk} bytes")
    if min(threads, batch, rounds) < 1:
        raise ValueError(
            f"threads, batch and rounds must be >= 1; got {threads}, {batch}, {rounds}"
        )
    with contextlib.ExitStack() as stack:
        if file is None:
            total = parse_bytes(size)
            _at_least_8mib(total, "size")
            target, where = stack.enter_context(_scratch_file(Path(path), total)), Path(path)
        else:
            target = where = Path(file)
            total = target.stat().st_size // _ALIGN * _ALIGN
            _at_least_8mib(total, f"file {target}")
        owned = file is None
        fd, method = _open(target, owned=owned)
        os.close(fd)
        runs, given_back = _rounds(target, total, chunk, order=kind, batch=batch, threads=threads,
                                seconds=seconds, rounds=rounds, owned=owned)  # fmt: skip
    sequential, curve = runs[0], runs[1:]
    medians = tuple(statistics.median(rates) for rates in curve)
    spread = max((max(r) - min(r)) / statistics.median(r) for r in runs)
    return DiskSpeed(
        str(where), statistics.median(sequential), medians[0], medians[-1], chunk, threads,
        method, medians, spread, kind.value, statistics.median(given_back),
    )  # fmt: skip


def _at_least_8mib(total: int, what: str) -> None:
    if total < 8 << 20:
        raise ValueError(f"{what} must be at least 8 MiB; got {format_bytes(total)}")


def _rounds(
    target: Path,
    total: int,
    chunk: int,
    *,
    order: ReadOrder,
    batch: int,
    threads: int,
    seconds: float,
    rounds: int,
    owned: bool,
) -> tuple[list[list[float]], list[float]]:
    """The rates of every round, and each round's `idle_credit`.

    Rates per test: sequential, then 1..threads readers.
    """
    front = _Blocks(target, total, _SEQUENTIAL_BLOCK, ReadOrder.SEQUENTIAL, owned=owned)
    blocks = _Blocks(target, total, chunk, order, owned=owned)
    runs: list[list[float]] = [[] for _ in range(threads + 1)]
    given_back = []
    for _ in range(rounds):  # interleaved, so a drift of the disk reaches every count alike
        runs[0].append(_rate(front, _SEQUENTIAL_BLOCK, 1, 1, seconds))
        for readers in range(1, threads + 1):
            runs[readers].append(_rate(blocks, chunk, batch, readers, seconds))
        alone = chunk / runs[1][-1]
        # idling past the read's time: a set rate's budget is refilled whatever its slices
        after = _read_time_after_idling(blocks, chunk, _IDLE_READS * alone, seconds)
        given_back.append(idle_credit(alone, after))
    return runs, given_back
