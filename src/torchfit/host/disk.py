"""How fast this machine reads from the disk that holds the data, page cache excluded.

A read the page cache serves says nothing about the disk, so `measure_disk` writes a
temporary file beside the data, flushes it (``fsync``), drops its pages from the cache
(``posix_fadvise(POSIX_FADV_DONTNEED)``, Linux ``mm/fadvise.c``: clean pages are
invalidated) and reads it back with ``O_DIRECT`` (open(2): "transfers are performed
directly to or from user-space buffers", the buffer, offset and size aligned to the block
size), falling back to buffered reads of pages dropped this way where ``O_DIRECT`` is
refused (tmpfs, some network file systems). Every block is read once, so no read can be
a cache hit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import mmap
import os
import random
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torchfit._core.units import format_bytes, parse_bytes

__all__ = ["DiskSpeed", "measure_disk"]

_ALIGN = 4096


@dataclasses.dataclass(frozen=True)
class DiskSpeed:
    """Read speeds of one file system, in bytes per second.

    Attributes:
        path: The folder measured.
        sequential: One reader, the file front to back, in ``1 MiB`` requests.
        random: One reader, blocks of `block` bytes in random order (queue depth 1).
        parallel: `threads` readers at once, random blocks (what DataLoader workers do).
        block: Bytes per random read.
        threads: Readers in the parallel test.
        method: How the page cache was kept out (``"O_DIRECT"`` or ``"fadvise"``).

    Example:
        >>> speed = DiskSpeed(path="/data", sequential=2e9, random=2e8, parallel=8e8,
        ...                   block=131072, threads=4, method="O_DIRECT")
        >>> speed.random_at(2) / 1e6, speed.random_at(16) / 1e6
        (400.0, 800.0)
    """

    path: str
    sequential: float
    random: float
    parallel: float
    block: int
    threads: int
    method: str

    def random_at(self, readers: int) -> float:
        """Random-read bytes/s with ``readers`` at once: linear up to `parallel`."""
        return min(self.random * max(readers, 1), max(self.parallel, self.random))

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain Python values."""
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        """One line per speed."""
        per_s = format_bytes
        return (
            f"disk under {self.path} ({self.method}): sequential {per_s(self.sequential)}/s, "
            f"random {per_s(self.block)} blocks {per_s(self.random)}/s, "
            f"{self.threads} readers {per_s(self.parallel)}/s"
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


def _drop(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _open(path: Path) -> tuple[int, str]:
    direct = getattr(os, "O_DIRECT", 0)
    if direct:
        try:
            return os.open(path, os.O_RDONLY | direct), "O_DIRECT"
        except OSError:
            pass
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    return fd, "fadvise"


def _read(path: Path, offsets: list[int], block: int, deadline: float) -> tuple[int, str]:
    """Read ``block`` bytes at each offset until ``deadline``; the bytes read and the method."""
    fd, method = _open(path)
    buffer = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT needs
    done = 0
    try:
        for offset in offsets:
            done += os.preadv(fd, [buffer], offset)
            if time.perf_counter() > deadline:
                break
    finally:
        os.close(fd)
        buffer.close()
    return done, method


def measure_disk(
    path: str | Path = ".",
    *,
    size: int | str = "256MiB",
    block: int | str = "128KiB",
    threads: int = 4,
    seconds: float = 1.0,
) -> DiskSpeed:
    """Measure sequential, random and parallel read speed of the disk under ``path``.

    Writes a ``size`` temporary file there (removed afterwards): keep it larger than the
    disk's own cache. Takes about ``3 * seconds`` plus the write.

    Args:
        path: A folder on the disk that holds the data.
        size: Bytes of the temporary file (whole MiB).
        block: Bytes per random read (about one sample); a multiple of 4 KiB.
        threads: Readers at once in the parallel test (DataLoader workers).
        seconds: Longest time per test.

    Returns:
        A `DiskSpeed`.

    Raises:
        ValueError: a block that is not a multiple of 4 KiB, a size under 8 MiB.

    Example:
        >>> speed = measure_disk(tempfile.gettempdir(), size="16MiB", seconds=0.2)
        >>> speed.sequential > 0 and speed.random > 0
        True
    """
    total, chunk = parse_bytes(size), parse_bytes(block)
    if chunk % _ALIGN or not chunk:
        raise ValueError(f"block must be a whole multiple of 4 KiB; got {chunk} bytes")
    if total < 8 << 20:
        raise ValueError(f"size must be at least 8 MiB; got {format_bytes(total)}")
    folder = Path(path)
    with _scratch_file(folder, total) as file:
        begin = time.perf_counter()
        done, method = _read(file, list(range(0, total, 1 << 20)), 1 << 20, begin + seconds)
        sequential = done / (time.perf_counter() - begin)
        offsets = list(range(0, total - chunk + 1, chunk))
        random.Random(0).shuffle(offsets)  # noqa: S311 - an order of reads, not a secret
        half = len(offsets) // 2  # each half read once: no block twice
        _drop(file)
        begin = time.perf_counter()
        done, _ = _read(file, offsets[:half], chunk, begin + seconds)
        rand = done / (time.perf_counter() - begin)
        parallel = _parallel(file, offsets[half:], chunk, threads, seconds)
    return DiskSpeed(str(folder), sequential, rand, parallel, chunk, threads, method)


def _parallel(file: Path, offsets: list[int], block: int, threads: int, seconds: float) -> float:
    shares = [offsets[i::threads] for i in range(threads)]
    results = [0] * threads
    deadline = time.perf_counter() + seconds

    def work(index: int) -> None:
        results[index] = _read(file, shares[index], block, deadline)[0]

    begin = time.perf_counter()
    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return sum(results) / (time.perf_counter() - begin)
