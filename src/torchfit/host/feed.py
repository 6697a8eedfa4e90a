"""CPU cores and disk speed to keep the card fed, and which of them bounds the run.

The step consumes ``batch_size / step_seconds`` samples a second. Loading one sample
costs CPU time and wall time (`torchfit.loaders`' probe measures both in the main
process: ``LoaderReport.baseline_samples_per_s`` and ``cpu_load``, the CPU a loading process
keeps busy) and reads bytes from disk. With ``r = max(w, 1)`` loading processes (``w``
workers, or the main process) the loader delivers at most

    min(r / wall_per_sample, cores / cpu_per_sample)

samples a second when the data is in memory: each worker as fast as one process alone,
all of them no faster than the cores left for loading can compute. When samples are read
from a measured disk, a sample's wall time is its CPU time ``Z`` plus its read, and ``r``
readers share what the disk serves with ``r`` requests at once, ``D(r)`` (measured, not
extrapolated: `DiskSpeed.random_at`). Each read then waits ``r * bytes / D(r)``, and by
the response time law (Lazowska et al., *Quantitative System Performance*, 1984, ch. 3:
``X = N / (R + Z)`` for ``N`` closed-loop clients) the loader delivers

    min(r / (Z + r * bytes / D(r)), cores / cpu_per_sample)

which is ``D(r) / bytes`` when reads dominate and ``r / Z`` when the CPU work does.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from pathlib import Path
from typing import Any

from torchfit.host.disk import DiskSpeed
from torchfit.loaders import LoaderReport

__all__ = ["Feed", "FeedBound", "SampleCost", "feed_needs", "read_bytes_per_sample"]


class FeedBound(enum.StrEnum):
    """What limits the run's pace."""

    GPU = "gpu"
    CPU = "cpu"
    DISK = "disk"


@dataclasses.dataclass(frozen=True)
class SampleCost:
    """What loading one sample costs.

    Attributes:
        wall_seconds: Wall time of one sample in one process (``1 / samples_per_s``).
        cpu_seconds: CPU time of one sample (``cpu_load * wall_seconds``).
        read_bytes: Bytes read from disk per sample (0: data in memory).

    Example:
        >>> SampleCost.from_rate(200.0, cpu_load=0.5).cpu_seconds
        0.0025
    """

    wall_seconds: float
    cpu_seconds: float
    read_bytes: float = 0.0

    @classmethod
    def from_rate(
        cls, samples_per_s: float, *, cpu_load: float = 1.0, read_bytes: float = 0.0
    ) -> SampleCost:
        """From one process's samples/s and the share of a CPU it keeps busy."""
        if not samples_per_s > 0 or not 0 < cpu_load <= 1:
            raise ValueError(
                f"samples_per_s must be > 0 and cpu_load in (0, 1]; got {samples_per_s!r}, "
                f"{cpu_load!r}"
            )
        wall = 1.0 / samples_per_s
        return cls(wall, wall * cpu_load, read_bytes)

    @classmethod
    def from_report(cls, report: LoaderReport, *, read_bytes: float = 0.0) -> SampleCost:
        """From `torchfit.loaders.tuned_loader_and_report`'s main-process baseline."""
        if not report.baseline_samples_per_s:
            raise ValueError(
                "the report has no main-process baseline (num_workers was fixed by the "
                "caller); tune without fixing num_workers, or pass SampleCost.from_rate(...)"
            )
        return cls.from_rate(
            report.baseline_samples_per_s, cpu_load=report.cpu_load or 1.0, read_bytes=read_bytes
        )


@dataclasses.dataclass(frozen=True)
class Feed:
    """The cores and read speed a run needs, against what the machine has.

    Attributes:
        samples_per_s: What the step consumes: ``batch_size / step_seconds``.
        workers: Workers needed to deliver it (each as fast as one process).
        cores: CPU cores the loading keeps busy at that pace (the training process's
            own core not included).
        read_bytes_per_s: Disk read speed needed.
        cores_available: Cores for loading: the affinity mask less one for training.
        disk: The measured disk, or ``None`` when reads were not weighed.
        cost: The per-sample cost used.
        bound: What limits the pace: the GPU (the loader keeps up), the CPU or the disk.
        max_samples_per_s: The pace the machine's CPU and disk allow, any worker count.
    """

    samples_per_s: float
    workers: int
    cores: float
    read_bytes_per_s: float
    cores_available: int
    disk: DiskSpeed | None
    cost: SampleCost
    bound: FeedBound
    max_samples_per_s: float

    def throughput(self, workers: int) -> float:
        """Samples/s a loader with ``workers`` workers delivers here (0: the main process)."""
        cost, readers = self.cost, max(workers, 1)
        cores = min(readers, self.cores_available + (1 if workers == 0 else 0))
        compute = cores / cost.cpu_seconds if cost.cpu_seconds > 0 else math.inf
        if self.disk is None or cost.read_bytes <= 0:
            return min(readers / cost.wall_seconds, compute)
        wait = readers * cost.read_bytes / self.disk.random_at(readers)
        return min(readers / (cost.cpu_seconds + wait), compute)

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain Python values."""
        data = dataclasses.asdict(self)
        data["bound"] = str(self.bound)
        return data

    def __str__(self) -> str:
        """What is needed, what is there, and the verdict."""
        disk = (
            "not weighed"
            if self.disk is None
            else f"{self.disk.random_at(self.workers) / 1e6:,.0f} MB/s"
        )
        read = self.read_bytes_per_s / 1e6
        limit = f"(machine's limit {self.max_samples_per_s:,.0f} samples/s)"
        lines = [
            f"Keeping the card fed: {self.samples_per_s:,.0f} samples/s",
            f"  workers needed        {self.workers:>10}",
            f"  cores needed          {self.cores:>10.1f}   available {self.cores_available}",
            f"  disk read needed      {read:>10,.1f} MB/s   available {disk}",
            f"  bound by              {self.bound.value:>10}   {limit}",
        ]
        return "\n".join(lines)


def feed_needs(
    cost: SampleCost | LoaderReport,
    *,
    batch_size: int,
    step_seconds: float,
    cores: int,
    disk: DiskSpeed | None = None,
) -> Feed:
    """How many workers, cores and bytes/s of disk a run needs, and which one bounds it.

    Args:
        cost: What one sample costs: a `SampleCost`, or the `LoaderReport` of
            `torchfit.loaders.tuned_loader_and_report` (its main-process baseline).
        batch_size: Samples per step, per process.
        step_seconds: Seconds of one training step (GPU time; a number for now).
        cores: CPU cores of this process (``os.sched_getaffinity``; one goes to training).
        disk: The data disk's speed (`measure_disk`); ``None`` leaves reads out.

    Returns:
        A `Feed`.

    Example:
        >>> cost = SampleCost(wall_seconds=0.004, cpu_seconds=0.004)  # 250 samples/s, CPU-bound
        >>> feed = feed_needs(cost, batch_size=64, step_seconds=0.1, cores=6)
        >>> feed.samples_per_s, feed.workers, round(feed.cores, 2), feed.bound.value
        (640.0, 3, 2.56, 'gpu')
        >>> feed_needs(cost, batch_size=64, step_seconds=0.02, cores=6).bound.value
        'cpu'
    """
    sample = cost if isinstance(cost, SampleCost) else SampleCost.from_report(cost)
    if batch_size < 1 or not step_seconds > 0 or cores < 1:
        raise ValueError(
            f"batch_size and cores must be >= 1 and step_seconds > 0; got {batch_size}, "
            f"{cores}, {step_seconds}"
        )
    needed = batch_size / step_seconds
    workers = math.ceil(needed * sample.wall_seconds - 1e-9)
    available = max(cores - 1, 1)
    cpu_limit = available / sample.cpu_seconds if sample.cpu_seconds > 0 else math.inf
    disk_limit = math.inf
    if disk is not None and sample.read_bytes > 0:
        disk_limit = disk.best / sample.read_bytes
    best = min(cpu_limit, disk_limit)
    if best >= needed:
        bound = FeedBound.GPU
    else:
        bound = FeedBound.CPU if cpu_limit <= disk_limit else FeedBound.DISK
    feed = Feed(
        samples_per_s=needed,
        workers=workers,
        cores=needed * sample.cpu_seconds,
        read_bytes_per_s=needed * sample.read_bytes,
        cores_available=available,
        disk=disk,
        cost=sample,
        bound=bound,
        max_samples_per_s=best,
    )
    if disk is None or sample.read_bytes <= 0 or bound is not FeedBound.GPU:
        return feed
    # readers share the disk, so more workers may be needed than the wall time says
    fits = (w for w in range(1, 1025) if feed.throughput(w) >= needed * (1 - 1e-9))
    enough = next(fits, workers)
    return dataclasses.replace(feed, workers=enough)


def read_bytes_per_sample(dataset: Any, *, samples: int = 64) -> float:
    """Bytes ``dataset[i]`` reads through ``read()`` per sample (``/proc/self/io`` rchar).

    Counts what the process asks of the file system, cached or not; reads through a
    memory map do not count. Reads the first ``samples`` items. Linux only.

    Example:
        >>> import torch
        >>> read_bytes_per_sample(torch.utils.data.TensorDataset(torch.zeros(8)), samples=8)
        0.0
    """
    io = Path("/proc/self/io")

    def rchar() -> int:
        for line in io.read_text(encoding="ascii").splitlines():
            if line.startswith("rchar:"):
                return int(line.split()[1])
        return 0

    count = min(samples, len(dataset))
    before = rchar()
    for index in range(count):
        dataset[index]
    # reading /proc/self/io is itself a read of a few hundred bytes
    return max(rchar() - before - 512, 0) / max(count, 1)
