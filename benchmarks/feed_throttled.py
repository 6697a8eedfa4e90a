"""A disk-bound DataLoader on a disk held to a set rate: samples/s at 0-4 workers against
`torchfit.host.Feed.throughput`, from the loader's measured per-sample cost and
`measure_disk` of the same file under the same limit.

    sudo PYTHONPATH=src python benchmarks/feed_throttled.py [--root DIR] [--rate 100MB]

A shared virtual disk drifts by up to 2x from second to second (see ``host_memory.py
--parts feed``), more than the model's error. Linux's block throttling (cgroup v1
``blkio.throttle.read_bps_device``, Documentation/admin-guide/cgroup-v1/blkio-controller.rst)
holds reads to a set rate instead, as a cloud volume's provisioned throughput does: the
benchmark moves itself into a blkio cgroup with that limit on the data's device (root
and cgroup v1 needed), and removes it at the end. Each sample reads its own 1 MiB block
with ``O_DIRECT`` and then spends ``cpu`` milliseconds of CPU (0, 5, 15: reads alone, a
CPU cost half a read's, one longer than a read). "drive" is the prediction for a disk
that serves at its own pace (`DiskSpeed.idle_credit` = 0), "measured credit" the one
with the credit `measure_disk` found.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from host_memory import Blocks, loader_rate, print_against

from torchfit._core.units import parse_bytes
from torchfit.host import SampleCost, feed_needs, measure_disk, read_bytes_per_sample
from torchfit.loaders import tuned_loader_and_report
from torchfit.loaders.machine import affinity_cpus

MiB = 2**20
BLKIO = Path("/sys/fs/cgroup/blkio")
ROUNDS = 3


class SpinBlocks(Blocks):
    """Each sample reads its own 1 MiB block with O_DIRECT, then spins ``cpu`` seconds."""

    def __init__(self, path: Path, blocks: int, cpu: float) -> None:
        super().__init__(path, blocks)
        self.cpu = cpu

    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, index: int) -> torch.Tensor:
        sample = super().__getitem__(index)
        end = time.thread_time() + self.cpu
        while time.thread_time() < end:
            pass
        return sample


@contextlib.contextmanager
def held_to(path: Path, rate: int) -> Iterator[None]:
    """This process (and the processes it starts) read ``path``'s device at ``rate`` B/s."""
    device = path.stat().st_dev
    group = BLKIO / "torchfit-feed-bench"
    group.mkdir(exist_ok=True)
    try:
        limit = f"{os.major(device)}:{os.minor(device)} {rate}"
        (group / "blkio.throttle.read_bps_device").write_text(limit)
        (group / "cgroup.procs").write_text(str(os.getpid()))
        yield
    finally:
        (BLKIO / "cgroup.procs").write_text(str(os.getpid()))
        group.rmdir()


def run(data: Path, blocks: int, cpu_ms: float) -> None:
    dataset = SpinBlocks(data, blocks, cpu_ms / 1e3)
    _, report = tuned_loader_and_report(dataset, batch_size=4, time_budget=3.0, max_workers=0)
    cost = SampleCost.from_report(report, read_bytes=read_bytes_per_sample(dataset, samples=4))
    cores = affinity_cpus()
    rows: dict[int, dict[str, list[float]]] = {
        num: {"drive": [], "credit": [], "measured": []} for num in range(5)
    }
    given_back = []
    for round_ in range(ROUNDS):
        disk = measure_disk(file=data, block="1MiB", threads=4, batch=4, seconds=0.4, rounds=1)
        given_back.append(disk.idle_credit)
        # no training step in this loop: every core may load (cores + 1)
        plan = feed_needs(cost, batch_size=4, step_seconds=0.001, cores=cores + 1, disk=disk)
        drive = dataclasses.replace(plan, disk=dataclasses.replace(disk, idle_credit=0.0))
        for num in (*range(round_ % 5, 5), *range(round_ % 5)):
            rows[num]["drive"].append(drive.throughput(num))
            rows[num]["credit"].append(plan.throughput(num))
            rows[num]["measured"].append(loader_rate(dataset, num, 32, batch_size=4))
    print(f"\nCPU {cpu_ms:g} ms a sample ({cost}); idle time credited, per round: "
          f"{', '.join(f'{c:.2f}' for c in given_back)}")  # fmt: skip
    print_against(("drive", "credit"), rows, digits=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / "torchfit-host")
    parser.add_argument("--rate", default="100MB", help="bytes/s the disk is held to")
    parser.add_argument("--cpu-ms", default="0,5,15", help="CPU milliseconds per sample")
    args = parser.parse_args()
    if os.geteuid() != 0 or not (BLKIO / "cgroup.procs").exists():
        raise SystemExit("needs root and cgroup v1's blkio controller (/sys/fs/cgroup/blkio)")
    args.root.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    data, blocks = args.root / "throttled-blocks.bin", 1024
    if not data.exists() or data.stat().st_size != blocks * MiB:
        chunk = os.urandom(MiB)
        with data.open("wb") as handle:
            for _ in range(blocks):
                handle.write(chunk)
    rate = parse_bytes(args.rate)
    print(f"Reads of {data}'s device held to {rate / 1e6:,.0f} MB/s; "
          f"{affinity_cpus()} cores; torch {torch.__version__}")  # fmt: skip
    with held_to(data, rate):
        for cpu_ms in (float(value) for value in args.cpu_ms.split(",")):
            run(data, blocks, cpu_ms)


if __name__ == "__main__":
    main()
