"""Cores and disk to keep the card fed; the disk probe."""

import os

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
    speed = measure_disk(tmp_path, size="16MiB", block="64KiB", threads=2, seconds=0.2)
    assert speed.sequential > 0 and speed.random > 0 and speed.parallel > 0
    assert speed.method in ("O_DIRECT", "fadvise")
    assert list(tmp_path.iterdir()) == []
    assert "random" in str(speed)


@pytest.mark.parametrize(
    ("size", "block", "match"),
    [("4MiB", "64KiB", "at least 8 MiB"), ("16MiB", "1000", "multiple of 4 KiB")],
)
def test_measure_disk_refuses_bad_sizes(tmp_path, size, block, match):
    with pytest.raises(ValueError, match=match):
        measure_disk(tmp_path, size=size, block=block)


def test_random_reads_scale_with_readers_up_to_the_parallel_speed():
    assert DISK.random_at(1) == 2e8
    assert DISK.random_at(3) == 6e8
    assert DISK.random_at(16) == 8e8
