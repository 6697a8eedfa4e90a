"""CPU cores and disk speed to keep the card fed, and which of them bounds the run.

The step consumes ``batch_size / step_seconds`` samples a second. Loading one sample
costs CPU time and wall time (`torchfit.loaders`' probe measures both in the main
process: ``LoaderReport.baseline_samples_per_s`` and ``cpu_load``, the CPU a loading process
keeps busy) and reads bytes from disk. With ``r = max(w, 1)`` loading processes (``w``
workers, or the main process) the loader delivers at most

    min(r / wall_per_sample, cores / cpu_per_sample)

samples a second when the data is in memory: each worker as fast as one process alone,
all of them no faster than the cores left for loading can compute. When samples are read
from a measured disk, a loading process's cycle is its CPU time ``Z`` plus its own read,
``S = bytes / D(1)``, and ``r`` readers get no more than the disk serves with ``r``
requests at once, ``D(r)`` (measured, not extrapolated: `DiskSpeed.random_at`). These are
the asymptotic bounds of a closed network (Lazowska et al., *Quantitative System
Performance*, 1984, ch. 5: ``X(N) <= min(N / (D + Z), 1 / D_max)``):

    min(r / (Z + S), D(r) / bytes, cores / cpu_per_sample)

exact when every sample costs the same; where read times vary as much as an exponential's,
the exact value (the machine repairman model) is below it by at most about a fifth, at
the knee ``r * S = Z + S`` (20% with 2 readers, 21% with 3, 15% with 16). A disk that serves
at a set rate (a cloud volume's provisioned throughput, Linux's ``blk-throttle``) lets a
read through at once when the reader has been idle long enough: of the ``Z`` a reader
spends computing, the share `DiskSpeed.idle_credit` comes back off its next read, so
``S = max(bytes / D(1) - idle_credit * Z, 0)`` (measured by `measure_disk`; 0 for a
drive that serves at its own pace).

A worker also hands each batch to the main process (`torchfit.host.transfer`): with
``w >= 1`` workers each sample of ``out_bytes`` costs the worker ``T_w`` more CPU (and
wall) time, and the main process ``T_m`` to receive it, so ``Z``, the wall time and the
CPU time above each grow by ``T_w``, and the main process, one process, caps the pace at
``1 / T_m`` whatever the worker count. With ``w = 0`` neither is paid.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from pathlib import Path
from typing import Any

from torchfit.host.disk import DiskSpeed
from torchfit.host.transfer import TYPICAL_TRANSFER, TransferCost
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
        out_bytes: Tensor bytes of one loaded sample, which a worker hands to the main
            process (0: the transfer is left out).

    Example:
        >>> SampleCost.from_rate(200.0, cpu_load=0.5).cpu_seconds
        0.0025
    """

    wall_seconds: float
    cpu_seconds: float
    read_bytes: float = 0.0
    out_bytes: float = 0.0

    @classmethod
    def from_rate(
        cls,
        samples_per_s: float,
        *,
        cpu_load: float = 1.0,
        read_bytes: float = 0.0,
        out_bytes: float = 0.0,
    ) -> SampleCost:
        """From one process's samples/s and the share of a CPU it keeps busy."""
        if not samples_per_s > 0 or not 0 < cpu_load <= 1:
            raise ValueError(
                f"samples_per_s must be > 0 and cpu_load in (0, 1]; got {samples_per_s!r}, "
                f"{cpu_load!r}"
            )
        if not out_bytes >= 0:
            raise ValueError(f"out_bytes must be >= 0 bytes per sample; got {out_bytes!r}")
        wall = 1.0 / samples_per_s
        return cls(wall, wall * cpu_load, read_bytes, out_bytes)

    @classmethod
    def from_report(
        cls,
        report: LoaderReport,
        *,
        read_bytes: float = 0.0,
        out_bytes: float | None = None,
        batch_size: int | None = None,
    ) -> SampleCost:
        """From `torchfit.loaders.tuned_loader_and_report`'s main-process baseline.

        ``out_bytes`` defaults to the report's ``batch_bytes`` over the loader's batch size
        (the report's, else ``batch_size``) when both are known, else 0.
        """
        if not report.baseline_samples_per_s:
            raise ValueError(
                "the report has no main-process baseline (num_workers was fixed by the "
                "caller); tune without fixing num_workers, or pass SampleCost.from_rate(...)"
            )
        if out_bytes is None:
            out_bytes = 0.0
            per_batch = report.batch_size or batch_size
            if report.batch_bytes is not None and per_batch:
                out_bytes = report.batch_bytes / per_batch
        return cls.from_rate(
            report.baseline_samples_per_s,
            cpu_load=report.cpu_load or 1.0,
            read_bytes=read_bytes,
            out_bytes=out_bytes,
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
        batch_size: Samples per batch (the transfer's per-batch costs are shared by them).
        transfer: What moving a batch from a worker costs (``None``: left out).
        main_cpu: Share of the training process's core spent receiving the batches at
            `samples_per_s` (0 without workers or transfer).
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
    batch_size: int = 1
    transfer: TransferCost | None = None
    main_cpu: float = 0.0

    def handoff(self) -> tuple[float, float]:
        """Per sample with workers: the worker's extra CPU and the main process's receive."""
        if self.transfer is None:
            return 0.0, 0.0
        size, batch = self.cost.out_bytes, self.batch_size
        return (
            self.transfer.worker_seconds(size, batch_size=batch),
            self.transfer.main_seconds(size, batch_size=batch),
        )

    def throughput(self, workers: int) -> float:
        """Samples/s a loader with ``workers`` workers delivers here (0: the main process)."""
        cost, readers = self.cost, max(workers, 1)
        extra, receive = self.handoff() if workers > 0 else (0.0, 0.0)
        cpu, wall = cost.cpu_seconds + extra, cost.wall_seconds + extra
        cores = min(readers, self.cores_available + (1 if workers == 0 else 0))
        compute = cores / cpu if cpu > 0 else math.inf
        main = 1 / receive if receive > 0 else math.inf
        if self.disk is None or cost.read_bytes <= 0:
            return min(readers / wall, compute, main)
        own_read = cost.read_bytes / self.disk.random_at(1) - self.disk.idle_credit * cpu
        served = self.disk.random_at(readers) / cost.read_bytes
        return min(readers / (cpu + max(own_read, 0.0)), served, compute, main)

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
        extra, receive = self.handoff()
        if receive > 0:
            lines.insert(
                3,
                f"  hand-off per sample   {extra * 1e3:>10.3f} ms worker, {receive * 1e3:.3f} ms "
                f"main (main's limit {1 / receive:,.0f} samples/s)",
            )
        return "\n".join(lines)


def feed_needs(
    cost: SampleCost | LoaderReport,
    *,
    batch_size: int,
    step_seconds: float,
    cores: int,
    disk: DiskSpeed | None = None,
    transfer: TransferCost | None = None,
) -> Feed:
    """How many workers, cores and bytes/s of disk a run needs, and which one bounds it.

    Args:
        cost: What one sample costs: a `SampleCost`, or the `LoaderReport` of
            `torchfit.loaders.tuned_loader_and_report` (its main-process baseline).
        batch_size: Samples per step, per process.
        step_seconds: Seconds of one training step (GPU time; a number for now).
        cores: CPU cores of this process (``os.sched_getaffinity``; one goes to training).
        disk: The data disk's speed (`measure_disk`); ``None`` leaves reads out.
        transfer: What moving a batch from a worker costs (`measure_transfer`); with
            ``None``, `TYPICAL_TRANSFER` when the cost has ``out_bytes``.

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
    if isinstance(cost, SampleCost):
        sample = cost
    else:
        sample = SampleCost.from_report(cost, batch_size=batch_size)
    if batch_size < 1 or not step_seconds > 0 or cores < 1:
        raise ValueError(
            f"batch_size and cores must be >= 1 and step_seconds > 0; got {batch_size}, "
            f"{cores}, {step_seconds}"
        )
    needed = batch_size / step_seconds
    if transfer is None and sample.out_bytes > 0:
        transfer = TYPICAL_TRANSFER
    feed = Feed(needed, 0, 0.0, needed * sample.read_bytes, max(cores - 1, 1), disk, sample,
                FeedBound.GPU, 0.0, batch_size, transfer)  # fmt: skip
    extra, receive = feed.handoff()
    workers = math.ceil(needed * (sample.wall_seconds + extra) - 1e-9)
    cpu = sample.cpu_seconds + extra
    cpu_limit = feed.cores_available / cpu if cpu > 0 else math.inf
    cpu_limit = min(cpu_limit, 1 / receive if receive > 0 else math.inf)  # the main process
    disk_limit = math.inf
    if disk is not None and sample.read_bytes > 0:
        disk_limit = disk.best / sample.read_bytes
    # with a transfer, the main process alone may outrun any number of workers
    best = max(min(cpu_limit, disk_limit), feed.throughput(0) if receive > 0 else 0.0)
    if best >= needed:
        bound = FeedBound.GPU
    else:
        bound = FeedBound.CPU if cpu_limit <= disk_limit else FeedBound.DISK
    feed = dataclasses.replace(feed, workers=workers, cores=needed * cpu, bound=bound,
                               max_samples_per_s=best, main_cpu=needed * receive)  # fmt: skip
    if bound is not FeedBound.GPU or (receive <= 0 and (disk is None or sample.read_bytes <= 0)):
        return feed
    # readers share the disk, and handing batches over costs: search the smallest count
    fits = (w for w in range(1025) if feed.throughput(w) >= needed * (1 - 1e-9))
    enough = next(fits, workers)
    if enough == 0 and receive <= 0:
        enough = 1  # without a transfer, one worker is no slower than none
    main = 0.0 if enough == 0 else needed * receive
    cores_used = needed * (sample.cpu_seconds if enough == 0 else cpu)
    return dataclasses.replace(feed, workers=enough, main_cpu=main, cores=cores_used)


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
