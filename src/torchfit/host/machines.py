"""A machine's RAM, cores, GPU and data disk: read from this one, or one of the examples."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from torchfit._core.units import format_bytes, parse_bytes
from torchfit.host.disk import DiskSpeed
from torchfit.loaders.machine import affinity_cpus, cgroup_cpu_limit

__all__ = ["EXAMPLE_MACHINES", "Machine", "machine", "this_machine"]


@dataclasses.dataclass(frozen=True)
class Machine:
    """What a host offers a run.

    Attributes:
        name: A label.
        ram: Bytes of RAM the run may use (the cgroup limit where one is set).
        cores: CPU cores the run may use.
        gpu: The GPU's name (`torchfit.memory.gpu` resolves it), ``None`` for none.
        disk: The data disk's speed, ``None`` when not measured.

    Example:
        >>> desktop = machine("desktop-3060")
        >>> desktop.gpu, desktop.cores, format_bytes(desktop.ram)
        ('RTX 3060', 6, '14.90 GiB')
    """

    name: str
    ram: int
    cores: int
    gpu: str | None = None
    disk: DiskSpeed | None = None

    def __post_init__(self) -> None:
        """Refuse a machine without RAM or cores."""
        if isinstance(self.ram, bool) or not isinstance(self.ram, int) or self.ram <= 0:
            raise ValueError(f"ram must be a positive number of bytes; got {self.ram!r}")
        if isinstance(self.cores, bool) or not isinstance(self.cores, int) or self.cores < 1:
            raise ValueError(f"cores must be a whole number >= 1; got {self.cores!r}")

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain Python values."""
        data = dataclasses.asdict(self)
        data["disk"] = None if self.disk is None else self.disk.to_dict()
        return data

    def __str__(self) -> str:
        """One line."""
        gpu = f", {self.gpu}" if self.gpu else ", no GPU"
        return f"{self.name}: {format_bytes(self.ram)} RAM, {self.cores} cores{gpu}"


#: The design card's example machines. RAM is the marketed size (16 GB, 128 GB: decimal);
#: disks are typical NVMe drives (PCIe 3.0 x4: about 3 GB/s sequential; random 128 KiB
#: reads from the drives' spec sheets, rounded down), for the feed check.
_NVME = DiskSpeed(
    path="(typical NVMe)", sequential=3.0e9, random=0.5e9, parallel=2.0e9, block=131072,
    threads=4, method="spec sheet",
)  # fmt: skip
EXAMPLE_MACHINES: dict[str, Machine] = {
    "desktop-3060": Machine("desktop-3060", parse_bytes("16GB"), 6, "RTX 3060", _NVME),
    "workstation-a100": Machine("workstation-a100", parse_bytes("128GB"), 16, "A100", _NVME),
}


def machine(name: str) -> Machine:
    """One of `EXAMPLE_MACHINES`, by name.

    Raises:
        ValueError: an unknown name; the message lists the known ones.

    Example:
        >>> machine("workstation-a100").cores
        16
    """
    found = EXAMPLE_MACHINES.get(name.strip().lower())
    if found is None:
        raise ValueError(
            f"unknown machine {name!r}; known: {sorted(EXAMPLE_MACHINES)}, or build one with "
            "Machine(name, ram, cores, gpu) or this_machine()"
        )
    return found


def _meminfo(key: str) -> int | None:
    try:
        text = Path("/proc/meminfo").read_text(encoding="ascii")
    except OSError:
        return None
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name == key:
            return int(rest.split()[0]) * 1024
    return None


def _cgroup_memory() -> int | None:
    # cgroup v2 memory.max ("max" when unlimited; Documentation/admin-guide/cgroup-v2.rst)
    for path in (Path("/sys/fs/cgroup/memory.max"),
                 Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")):  # fmt: skip
        try:
            text = path.read_text(encoding="ascii").strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:
            return int(text)
    return None


def this_machine(*, disk: DiskSpeed | None = None) -> Machine:
    """This machine: RAM (``/proc/meminfo``, or the cgroup limit), usable cores, its GPU.

    Nothing is measured on the disk unless ``disk`` is given (see `measure_disk`). Naming
    the GPU initializes CUDA when torch sees one.

    Example:
        >>> here = this_machine()
        >>> here.ram > 0 and here.cores >= 1
        True
    """
    import torch  # noqa: PLC0415 - only to name the GPU

    total = _meminfo("MemTotal") or os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    limit = _cgroup_memory()
    ram = min(total, limit) if limit else total
    quota = cgroup_cpu_limit()
    cores = affinity_cpus() if quota is None else max(1, min(affinity_cpus(), int(quota)))
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return Machine("this machine", ram or 1, cores, gpu, disk)
