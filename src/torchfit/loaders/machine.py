"""What the machine lets a DataLoader use: CPUs, local ranks, and ``/dev/shm``.

``os.cpu_count()`` counts the machine's CPUs, not the ones this process may use: a
container limited by a cgroup CPU quota, or a job pinned by CPU affinity (``taskset``,
SLURM, Kubernetes), sees all of them. torchfit reads the affinity mask and the cgroup
quota, divides the result among the ranks on this node, and compares the bytes that
worker processes keep in flight with the free space of ``/dev/shm``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any

import torch

from torchfit._core.units import format_bytes

__all__ = [
    "MachineBudget",
    "affinity_cpus",
    "cgroup_cpu_limit",
    "local_world_size",
    "machine_budget",
    "shm_free_bytes",
    "shm_worker_limit",
]

#: Where worker processes put the tensors they send to the main process on Linux.
#: torch's default sharing strategy there, "file_descriptor", backs each shared tensor
#: with a POSIX shared-memory object, i.e. a file in /dev/shm (torch.multiprocessing docs,
#: "Sharing strategies"); a full /dev/shm kills a worker with SIGBUS (pytorch #5040).
SHM_PATH = Path("/dev/shm")  # noqa: S108 - the real shared-memory mount, read only

#: Keep the batches in flight under half of this rank's share of /dev/shm: the pin-memory
#: thread, the batch the step holds and other programs need room too.
SHM_FRACTION = 0.5

#: Launchers that say how many ranks share this node: torchrun sets LOCAL_WORLD_SIZE
#: (torch/distributed/run.py docs), Open MPI sets OMPI_COMM_WORLD_LOCAL_SIZE.
_LOCAL_SIZE_VARS = ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE")


@dataclasses.dataclass(frozen=True)
class MachineBudget:
    """The resources a tuned DataLoader of this process may use.

    Attributes:
        cpus: CPUs for this rank's loader: ``min(affinity, cgroup quota)`` divided by the
            local world size, at least 1.
        affinity_cpus: CPUs in this process's affinity mask (``os.sched_getaffinity``),
            or ``os.cpu_count()`` where there is no mask.
        cgroup_cpus: The cgroup CPU quota in CPUs (``quota / period``), ``None`` when
            unlimited or unknown.
        local_world_size: Ranks sharing this node (and these CPUs and ``/dev/shm``).
        local_world_size_source: Where `local_world_size` came from, in words.
        shm_free_bytes: Free bytes of ``/dev/shm``; ``None`` where there is none.

    Example:
        >>> budget = MachineBudget(cpus=4, affinity_cpus=8, cgroup_cpus=8.0,
        ...                        local_world_size=2, local_world_size_source="LOCAL_WORLD_SIZE",
        ...                        shm_free_bytes=2**30)
        >>> budget.shm_share_bytes
        536870912
    """

    cpus: int
    affinity_cpus: int
    cgroup_cpus: float | None
    local_world_size: int
    local_world_size_source: str
    shm_free_bytes: int | None

    @property
    def shm_share_bytes(self) -> int | None:
        """This rank's share of the free ``/dev/shm`` (ranks on a node share one)."""
        if self.shm_free_bytes is None:
            return None
        return self.shm_free_bytes // self.local_world_size

    def describe(self) -> str:
        """One line: CPUs and where the limit comes from, and ``/dev/shm``."""
        quota = "none" if self.cgroup_cpus is None else f"{self.cgroup_cpus:g}"
        shm = "n/a" if self.shm_free_bytes is None else f"{format_bytes(self.shm_free_bytes)} free"
        return (
            f"{self.cpus} CPU(s) for this rank (affinity {self.affinity_cpus}, cgroup quota "
            f"{quota}, local world size {self.local_world_size} from "
            f"{self.local_world_size_source}); /dev/shm {shm}"
        )

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain Python values."""
        return dataclasses.asdict(self)


def affinity_cpus() -> int:
    """CPUs this process may run on: the affinity mask where the OS has one.

    Example:
        >>> affinity_cpus() >= 1
        True
    """
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None


def _quota_v2(text: str | None) -> float | None:
    # cgroup v2 cpu.max holds "$MAX $PERIOD", MAX being "max" when unlimited
    # (Linux Documentation/admin-guide/cgroup-v2.rst, "CPU Interface Files").
    if not text:
        return None
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _quota_v1(directory: Path) -> float | None:
    # cgroup v1 cpu.cfs_quota_us is -1 when unlimited (Documentation/scheduler/sched-bwc.rst).
    quota, period = _read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us")
    try:
        q, p = int(quota or ""), int(period or "")
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def _ancestors(mount: Path, relative: str) -> list[Path]:
    """``mount/relative`` and each of its parents up to ``mount`` (quotas nest)."""
    parts = [part for part in relative.split("/") if part]
    dirs = [mount.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]
    return [directory for directory in dirs if directory.is_dir()]


def cgroup_cpu_limit(root: Path = Path("/")) -> float | None:
    """The tightest cgroup CPU quota on this process, in CPUs, or ``None`` if unlimited.

    Reads ``/proc/self/cgroup`` to find this process's group, then ``cpu.max`` (v2) or
    ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (v1) in that group and its parents.

    Args:
        root: Filesystem root to read ``proc/self/cgroup`` and ``sys/fs/cgroup`` under
            (a test points it at a fake tree).

    Example:
        >>> limit = cgroup_cpu_limit()
        >>> limit is None or limit > 0
        True
    """
    membership = _read(root / "proc" / "self" / "cgroup") or ""
    cgroup = root / "sys" / "fs" / "cgroup"
    limits: list[float] = []
    for line in membership.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, relative = rest.partition(":")
        if hierarchy == "0" and not controllers:  # the v2 unified hierarchy
            limits += [
                q for d in _ancestors(cgroup, relative) if (q := _quota_v2(_read(d / "cpu.max")))
            ]
        elif "cpu" in controllers.split(","):
            for name in (controllers, "cpu", "cpu,cpuacct"):
                limits += [q for d in _ancestors(cgroup / name, relative) if (q := _quota_v1(d))]
    if not limits:  # a container often sees only its own group, mounted at the root
        limits += [q for q in (_quota_v2(_read(cgroup / "cpu.max")),) if q]
    return min(limits) if limits else None


def local_world_size() -> tuple[int, str]:
    """How many ranks share this node, and where that figure came from.

    Launcher variables first (torchrun's ``LOCAL_WORLD_SIZE``, Open MPI's
    ``OMPI_COMM_WORLD_LOCAL_SIZE``); else, under an initialized ``torch.distributed``
    process group, its world size (every rank assumed local: the safe side); else 1.

    Example:
        >>> size, source = local_world_size()
        >>> size >= 1
        True
    """
    for name in _LOCAL_SIZE_VARS:
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) >= 1:
            return int(value), name
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        size = torch.distributed.get_world_size()
        return size, "torch.distributed world size (no LOCAL_WORLD_SIZE: all ranks assumed local)"
    return 1, "default (not distributed)"


def shm_free_bytes(path: Path = SHM_PATH) -> int | None:
    """Free bytes in ``/dev/shm``, or ``None`` where it does not exist.

    Example:
        >>> free = shm_free_bytes()
        >>> free is None or free >= 0
        True
    """
    try:
        stats = os.statvfs(path)
    except (OSError, AttributeError):
        return None
    return stats.f_bavail * stats.f_frsize


def shm_worker_limit(share: int | None, *, prefetch: int, batch_bytes: int | None) -> int | None:
    """The most workers whose batches in flight fit this rank's ``/dev/shm`` share.

    Each worker keeps up to ``prefetch`` batches of ``batch_bytes`` in shared memory, so
    ``workers * prefetch * batch_bytes`` must stay within `SHM_FRACTION` of ``share``
    (`MachineBudget.shm_share_bytes`). ``None`` when nothing limits the count: no
    ``/dev/shm``, or no batch bytes measured. Every ``/dev/shm`` check of
    `torchfit.loaders` (the tuning search, `check_shm`) asks this one function.

    Example:
        >>> shm_worker_limit(64 * 2**20, prefetch=4, batch_bytes=2**20)  # 32 MiB / 4 MiB
        8
        >>> shm_worker_limit(None, prefetch=2, batch_bytes=2**20) is None
        True
    """
    if share is None or not batch_bytes or prefetch < 1:
        return None
    return int(share * SHM_FRACTION) // (prefetch * batch_bytes)


def machine_budget() -> MachineBudget:
    """Read CPUs, cgroup quota, local world size and ``/dev/shm`` now.

    Example:
        >>> machine_budget().cpus >= 1
        True
    """
    affinity = affinity_cpus()
    quota = cgroup_cpu_limit()
    usable = affinity if quota is None else min(affinity, max(1, math.floor(quota)))
    ranks, source = local_world_size()
    return MachineBudget(
        cpus=max(1, usable // ranks),
        affinity_cpus=affinity,
        cgroup_cpus=quota,
        local_world_size=ranks,
        local_world_size_source=source,
        shm_free_bytes=shm_free_bytes(),
    )
