"""Resident memory of a process, read from Linux's ``/proc``: the truth of `torchfit.host`.

``/proc/<pid>/status`` gives the resident set (``VmRSS``), its high-water mark (``VmHWM``)
and its parts: anonymous memory (``RssAnon``: what ``malloc`` and torch's CPU allocator
hand out), file-backed pages (``RssFile``: memory-mapped checkpoints once their pages are
read, and shared libraries) and shared memory (``RssShmem``: ``/dev/shm``, DataLoader
batches). Linux ``Documentation/filesystems/proc.rst``, "Contents of the status fields".

``VmHWM`` is a lifetime high-water mark, like ``getrusage``'s ``ru_maxrss``. Writing ``5``
to ``/proc/self/clear_refs`` resets it to the current RSS (Linux >= 4.0, proc.rst
"/proc/<pid>/clear_refs"), so a peak can be measured above a baseline inside one process;
where that is refused, measure each load in a fresh process (`torchfit.host.measure_load`).
A process's unique memory (USS: pages no other process maps) and proportional share (PSS)
come from ``/proc/<pid>/smaps_rollup`` (Linux >= 4.14).
"""

from __future__ import annotations

import dataclasses
import gc
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, NamedTuple, TypeVar

from torchfit._core.units import format_bytes

__all__ = [
    "PrivateBytes",
    "RssMeasurement",
    "RssSample",
    "measure_rss",
    "private_bytes",
    "read_rss",
    "reset_peak",
]

T = TypeVar("T")

_PROC = Path("/proc")
#: Writing 5 here resets this process's ``VmHWM`` (Linux >= 4.0).
CLEAR_REFS = _PROC / "self" / "clear_refs"
_FIELDS = {"VmHWM": "peak", "VmRSS": "rss", "RssAnon": "anon", "RssFile": "file",
           "RssShmem": "shmem"}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class RssSample:
    """One reading of a process's resident memory, in bytes.

    Attributes:
        rss: Resident set now (``VmRSS``) = ``anon + file + shmem``.
        peak: Its high-water mark (``VmHWM``) since start or since `reset_peak`.
        anon: Anonymous pages (heap, torch tensors, Python objects).
        file: File-backed pages: mapped checkpoints that were read, shared libraries.
        shmem: Shared memory mapped by the process (``/dev/shm``, DataLoader batches).

    Example:
        >>> sample = read_rss()
        >>> sample.rss > 0 and sample.peak >= sample.rss
        True
    """

    rss: int
    peak: int
    anon: int
    file: int
    shmem: int


def read_rss(pid: int | str = "self") -> RssSample:
    """Read ``/proc/<pid>/status`` now.

    Raises:
        OSError: no ``/proc`` (not Linux) or no such process.

    Example:
        >>> read_rss().anon > 0
        True
    """
    values = dict.fromkeys(_FIELDS.values(), 0)
    text = (_PROC / str(pid) / "status").read_text(encoding="ascii", errors="replace")
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in _FIELDS:
            values[_FIELDS[key]] = int(rest.split()[0]) * 1024  # the file says kB
    return RssSample(**values)


def reset_peak() -> bool:
    """Reset this process's ``VmHWM`` to its current RSS; False where Linux refuses.

    Example:
        >>> reset_peak() in (True, False)
        True
    """
    try:
        CLEAR_REFS.write_text("5", encoding="ascii")
    except OSError:
        return False
    return True


class PrivateBytes(NamedTuple):
    """A process's unique and proportional memory, from ``/proc/<pid>/smaps_rollup``.

    Attributes:
        uss: Pages only this process maps (``Private_Clean + Private_Dirty``): what a forked
            DataLoader worker copied on write, and the file pages (library code) it alone
            has read in.
        pss: Each page shared among the processes that map it.
        dirty: Of ``uss``, the written pages (``Private_Dirty``). The clean rest are file
            pages, private only while no other process maps them: another process that
            imported the same libraries makes them shared.
    """

    uss: int
    pss: int
    dirty: int


def private_bytes(pid: int | str = "self") -> PrivateBytes:
    """USS, PSS and the dirty part of the USS of a process, in bytes.

    Example:
        >>> uss, pss, dirty = private_bytes()
        >>> 0 < dirty <= uss <= pss
        True
    """
    fields = {"Private_Clean": 0, "Private_Dirty": 0, "Pss": 0}
    text = (_PROC / str(pid) / "smaps_rollup").read_text(encoding="ascii", errors="replace")
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in fields:
            fields[key] = int(rest.split()[0]) * 1024
    clean, dirty = fields["Private_Clean"], fields["Private_Dirty"]
    return PrivateBytes(uss=clean + dirty, pss=fields["Pss"], dirty=dirty)


@dataclasses.dataclass(frozen=True)
class RssMeasurement(Generic[T]):
    """The resident memory a call added, above the process's RSS when it started.

    Attributes:
        peak: ``VmHWM`` at the end minus RSS at the start: the peak the call added.
        end: RSS at the end minus RSS at the start (what the result still holds).
        anon_end: Anonymous bytes added by the end.
        file_end: File-backed bytes added by the end (mapped checkpoint pages).
        baseline: RSS at the start (interpreter, libraries, whatever was loaded before).
        exact_peak: False when ``VmHWM`` could not be reset (`reset_peak`): `peak` is then
            the process's lifetime peak above `baseline`, an upper bound.
        seconds: Wall time of the call.
        value: What the call returned.
    """

    peak: int
    end: int
    anon_end: int
    file_end: int
    baseline: int
    exact_peak: bool
    seconds: float
    value: T

    def to_dict(self) -> dict[str, Any]:
        """Every field but `value`, as plain Python values."""
        data = dataclasses.asdict(self)
        data.pop("value")
        return data

    def __str__(self) -> str:
        """One line: peak and end above the baseline."""
        note = "" if self.exact_peak else " (lifetime peak: VmHWM could not be reset)"
        return (
            f"RSS +{format_bytes(self.peak)} at peak, +{format_bytes(self.end)} at the end "
            f"(anon +{format_bytes(self.anon_end)}, file-backed +{format_bytes(self.file_end)}) "
            f"above {format_bytes(self.baseline)}{note}"
        )


def measure_rss(fn: Callable[..., T], *args: Any, **kwargs: Any) -> RssMeasurement[T]:
    """Run ``fn(*args, **kwargs)`` and measure the resident memory it added.

    Garbage is collected first, then ``VmHWM`` is reset (`reset_peak`), so the peak is
    this call's. Memory the C allocator kept from earlier work can be reused by the call
    and hide part of its need: for a clean figure, run it first thing in a fresh process.

    Example:
        >>> import torch
        >>> m = measure_rss(torch.ones, 64, 2**20 // 4)  # 64 MiB of fp32, written
        >>> m.value.shape, m.peak >= m.end  # how much shows depends on the process's past
        (torch.Size([64, 262144]), True)
    """
    gc.collect()
    exact = reset_peak()
    start = read_rss()
    began = time.perf_counter()
    value = fn(*args, **kwargs)
    seconds = time.perf_counter() - began
    end = read_rss()
    return RssMeasurement(
        peak=end.peak - start.rss,
        end=end.rss - start.rss,
        anon_end=end.anon - start.anon,
        file_end=end.file - start.file,
        baseline=start.rss,
        exact_peak=exact,
        seconds=seconds,
        value=value,
    )
