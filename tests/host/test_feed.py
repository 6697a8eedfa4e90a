"""Cores and disk to keep the card fed; the disk probe."""

import dataclasses
import os
import random
import threading
import time
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import Dataset

from torchfit.host import (
    DiskSpeed,
    FeedBound,
    SampleCost,
    feed_needs,
    measure_disk,
    read_bytes_per_sample,
)
from torchfit.host.disk import ReadOrder, idle_credit
from torchfit.loaders import LoaderConfig, LoaderReport
from torchfit.loaders.machine import machine_budget

DISK = DiskSpeed(path="/data", sequential=2e9, random=2e8, parallel=8e8, block=131072,
                 threads=4, method="test")  # fmt: skip


def test_a_fast_loader_leaves_the_gpu_as_the_bound():
    feed = feed_needs(SampleCost(0.004, 0.004), batch_size=64, step_seconds=0.1, cores=6)
    assert feed.samples_per_s == 640
    assert feed.workers == 3  # 640 samples/s at 250 per worker
    assert feed.cores == pytest.approx(2.56)
    assert feed.bound is FeedBound.GPU


def test_cpu_bound_when_the_cores_cannot_compute_the_samples():
    feed = feed_needs(SampleCost(0.004, 0.004), batch_size=64, step_seconds=0.02, cores=6)
    assert feed.bound is FeedBound.CPU
    assert feed.max_samples_per_s == pytest.approx(5 / 0.004)  # one core goes to training


def test_disk_bound_when_reads_are_the_slowest():
    cost = SampleCost(0.004, 0.0005, read_bytes=4e6)  # 4 MB per sample, little CPU
    feed = feed_needs(cost, batch_size=64, step_seconds=0.05, cores=16, disk=DISK)
    assert feed.bound is FeedBound.DISK
    assert feed.read_bytes_per_s == pytest.approx(1280 * 4e6)
    assert feed.max_samples_per_s == pytest.approx(8e8 / 4e6)


def test_throughput_grows_with_workers_until_cores_or_disk_stop_it():
    feed = feed_needs(SampleCost(0.01, 0.01), batch_size=32, step_seconds=0.1, cores=3)
    rates = [feed.throughput(w) for w in range(6)]
    assert rates[0] == pytest.approx(100)
    assert rates[1] == pytest.approx(100)
    assert rates[2] == pytest.approx(200)
    assert rates[3] == rates[5] == pytest.approx(200)  # two cores for loading


def test_the_cost_comes_from_a_loader_report():
    report = LoaderReport(
        chosen=LoaderConfig(), trials=(), baseline_samples_per_s=500.0,
        chosen_samples_per_s=None, tuning_seconds=1.0, time_budget=2.0,
        machine=machine_budget(), batch_bytes=None, cpu_load=0.5, max_workers=2,
    )  # fmt: skip
    cost = SampleCost.from_report(report, read_bytes=1000)
    assert cost.wall_seconds == pytest.approx(0.002)
    assert cost.cpu_seconds == pytest.approx(0.001)
    fixed = LoaderReport(**{**report.__dict__, "baseline_samples_per_s": None})
    with pytest.raises(ValueError, match="no main-process baseline"):
        SampleCost.from_report(fixed)


@settings(max_examples=50, deadline=None)
@given(
    wall=st.floats(1e-4, 0.1),
    cpu_share=st.floats(0.05, 1.0),
    read=st.floats(0, 1e7),
    batch=st.integers(1, 512),
    step=st.floats(1e-3, 2.0),
    cores=st.integers(1, 64),
)
def test_the_bound_is_the_smallest_supply(wall, cpu_share, read, batch, step, cores):
    cost = SampleCost(wall, wall * cpu_share, read)
    feed = feed_needs(cost, batch_size=batch, step_seconds=step, cores=cores, disk=DISK)
    if feed.bound is FeedBound.GPU:
        assert feed.max_samples_per_s >= feed.samples_per_s
    else:
        assert feed.max_samples_per_s < feed.samples_per_s
    assert feed.throughput(feed.workers + 100) <= feed.max_samples_per_s * (1 + 1e-9)


def test_bad_feed_arguments():
    with pytest.raises(ValueError, match="step_seconds"):
        feed_needs(SampleCost(0.01, 0.01), batch_size=8, step_seconds=0, cores=2)
    with pytest.raises(ValueError, match="cpu_load"):
        SampleCost.from_rate(100.0, cpu_load=1.5)


class FileSamples(Dataset):
    def __init__(self, path, size):
        self.path, self.size = path, size

    def __len__(self):
        return 16

    def __getitem__(self, index):
        with self.path.open("rb") as handle:
            handle.seek(index * self.size)
            return torch.frombuffer(bytearray(handle.read(self.size)), dtype=torch.uint8)


def test_read_bytes_per_sample_counts_what_the_dataset_reads(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(os.urandom(16 * 100_000))
    measured = read_bytes_per_sample(FileSamples(path, 100_000), samples=8)
    assert 100_000 <= measured <= 100_000 + 8192  # at most one buffer of read-ahead


def test_measure_disk_reads_a_file_it_removes(tmp_path):
    speed = measure_disk(tmp_path, size="16MiB", block="64KiB", threads=2, seconds=0.1)
    assert speed.sequential > 0 and speed.random > 0 and speed.parallel > 0
    assert speed.method in ("O_DIRECT", "fadvise")
    assert list(tmp_path.iterdir()) == []
    assert "random" in str(speed)
    assert len(speed.curve) == 2  # one measured point per reader count
    assert (speed.random, speed.parallel) == speed.curve
    assert speed.spread >= 0
    assert 0 <= speed.idle_credit <= 1


class PacedReads:
    """`os.preadv` of a disk that reads at ``rate`` bytes/s: a drive that serves one read
    after another, or a set rate (a token bucket one read deep) that lets a read through
    at once when the reader idled as long as a read takes."""

    def __init__(self, rate, *, set_rate):
        self.rate, self.set_rate, self.free_at = rate, set_rate, 0.0
        self.lock = threading.Lock()

    def __call__(self, fd, buffers, offset):
        size = len(buffers[0])
        with self.lock:
            now = time.perf_counter()
            if self.set_rate:
                done = max(now, self.free_at)
                self.free_at = done + size / self.rate
            else:
                done = self.free_at = max(now, self.free_at) + size / self.rate
        time.sleep(max(done - time.perf_counter(), 0))
        return size


@pytest.mark.parametrize(("set_rate", "low", "high"), [(True, 0.7, 1.0), (False, 0.0, 0.3)])
def test_measure_disk_tells_a_set_rate_from_a_drive(tmp_path, monkeypatch, set_rate, low, high):
    monkeypatch.setattr(os, "preadv", PacedReads(64e6, set_rate=set_rate))  # 4 ms a read
    speed = measure_disk(tmp_path, size="8MiB", block="256KiB", threads=1, seconds=0.1, rounds=1)
    assert speed.random == pytest.approx(64e6, rel=0.2)
    assert low <= speed.idle_credit <= high


def test_measure_disk_reads_the_data_file_without_changing_it(tmp_path):
    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(8 << 20))
    content, mtime = data.read_bytes(), data.stat().st_mtime_ns
    os.utime(data, ns=(1_000_000_000, mtime))  # an access time the reads must not move
    state = random.getstate()
    speed = measure_disk(file=data, block="1MiB", threads=3, order="sequential", batch=4,
                         seconds=0.1, rounds=2)  # fmt: skip
    assert random.getstate() == state  # the global RNG is the user's
    after = data.stat()
    if speed.method == "O_DIRECT" and after.st_uid == os.geteuid():
        assert after.st_atime_ns == 1_000_000_000  # O_NOATIME
    assert (after.st_mtime_ns, data.read_bytes()) == (mtime, content)
    assert list(tmp_path.iterdir()) == [data]
    assert speed.path == str(data) and speed.order == "sequential" and len(speed.curve) == 3


def test_measure_disk_refuses_a_data_file_the_cache_would_serve(tmp_path, monkeypatch):
    data = tmp_path / "data.bin"
    data.write_bytes(bytes(8 << 20))
    monkeypatch.setattr(os, "O_DIRECT", 0, raising=False)  # as on a file system without it
    with pytest.raises(ValueError, match="cannot be opened with O_DIRECT"):
        measure_disk(file=data, seconds=0.05, rounds=1)
    speed = measure_disk(tmp_path, size="8MiB", threads=1, seconds=0.05, rounds=1)
    assert speed.method == "fadvise"  # a file the probe wrote may have its pages dropped


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"size": "4MiB"}, "at least 8 MiB"),
        ({"block": "1000"}, "multiple of 4 KiB"),
        ({"threads": 0}, "threads, batch and rounds"),
        ({"order": "backwards"}, "backwards"),
    ],
)
def test_measure_disk_refuses_bad_arguments(tmp_path, options, match):
    with pytest.raises(ValueError, match=match):
        measure_disk(tmp_path, **{"size": "16MiB", "block": "64KiB", **options})
    assert list(tmp_path.iterdir()) == []


def test_a_measured_curve_is_used_as_measured_not_extrapolated():
    flat = dataclasses.replace(DISK, curve=(1e9, 1.1e9, 1.2e9, 1.1e9))
    assert [flat.random_at(r) for r in (0, 1, 2, 3, 4, 9)] == [1e9, 1e9, 1.1e9, 1.2e9, 1.1e9,
                                                              1.1e9]  # fmt: skip
    assert flat.best == 1.2e9
    assert ReadOrder("sequential") is ReadOrder.SEQUENTIAL


def test_disk_bound_workers_share_the_read_and_add_their_cpu():
    # 1 MiB samples, 0.1 ms of CPU each; the disk serves 1, 1.2 and 1.5 GB/s at 1-3 readers
    disk = dataclasses.replace(DISK, curve=(1e9, 1.2e9, 1.5e9))
    cost = SampleCost(wall_seconds=0.0011, cpu_seconds=0.0001, read_bytes=1e6)
    feed = feed_needs(cost, batch_size=12, step_seconds=0.01, cores=8, disk=disk)
    # asymptotic bounds: min(r / (Z + bytes / D(1)), D(r) / bytes)
    assert feed.throughput(0) == pytest.approx(1 / (1e-4 + 1e-3))
    assert feed.throughput(1) == feed.throughput(0)
    assert feed.throughput(2) == pytest.approx(1.2e9 / 1e6)  # 2 / 1.1 ms is more
    assert feed.throughput(8) == pytest.approx(1.5e9 / 1e6)  # never past what the disk serves
    assert feed.bound is FeedBound.GPU  # 1,200 samples/s needed, the disk allows 1,500
    assert feed.workers == 2
    slow = dataclasses.replace(cost, cpu_seconds=0.002)  # the CPU work now sets the pace
    slow_feed = feed_needs(slow, batch_size=12, step_seconds=0.01, cores=8, disk=disk)
    assert slow_feed.throughput(2) == pytest.approx(2 / (0.002 + 1e-3))
    assert slow_feed.workers == 4  # 3 ms a cycle: 1,000 samples/s from 3, 1,333 from 4


@pytest.mark.parametrize(
    ("cpu", "rate_limited", "drive"), [(0.0, 100, 100), (0.005, 100, 200 / 3), (0.020, 50, 100 / 3)]
)
def test_a_set_rate_disk_reads_at_once_after_the_cpu_work(cpu, rate_limited, drive):
    """One worker, 10 ms reads: a rate-limited volume (idle time credited) lets the read
    through at once once the CPU work took as long; a drive that serves at its own pace
    adds the whole read to each sample."""
    limited = dataclasses.replace(DISK, curve=(95e6,), idle_credit=1.0)
    cost = SampleCost(wall_seconds=cpu + 0.01, cpu_seconds=cpu, read_bytes=95e4)
    for disk, expected in ((limited, rate_limited), (replace(limited, idle_credit=0), drive)):
        feed = feed_needs(cost, batch_size=4, step_seconds=1, cores=4, disk=disk)
        assert feed.throughput(1) == pytest.approx(expected)


def test_idle_credit_is_the_share_of_the_idle_time_given_back():
    assert idle_credit(0.01, 0.01) == 0.0  # a drive: the read took as long after idling
    assert idle_credit(0.01, 0.0) == 1.0  # a set rate: it went through at once
    assert idle_credit(0.01, 0.004) == pytest.approx(0.6)
    assert idle_credit(0.01, 0.03) == 0.0  # slower after idling: nothing given back
    assert idle_credit(0.0, 0.0) == 0.0


def test_random_reads_scale_with_readers_up_to_the_parallel_speed():
    assert DISK.random_at(1) == 2e8
    assert DISK.random_at(3) == 6e8
    assert DISK.random_at(16) == 8e8
