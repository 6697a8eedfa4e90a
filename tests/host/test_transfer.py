"""Handing batches from DataLoader workers to the main process: the probe and the feed."""

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchfit.host import (
    TYPICAL_TRANSFER,
    FeedBound,
    SampleCost,
    TransferCost,
    feed_needs,
    measure_transfer,
)
from torchfit.loaders import LoaderConfig, LoaderReport
from torchfit.loaders.machine import machine_budget

MiB = 2**20
# 0.5 ms/MiB + 0.4 ms/batch in the worker, 0.125 ms/MiB + 0.3 ms/batch in the main process
COST = TransferCost(0.5e-3 / MiB, 0.4e-3, 0.125e-3 / MiB, 0.3e-3, method="test")


def test_the_probe_measures_both_sides_and_leaves_the_rngs_alone():
    torch_state, python_state = torch.get_rng_state(), random.getstate()
    cost = measure_transfer()  # 12 batches of each size; under a second
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert random.getstate() == python_state
    assert cost.method == "measured"
    # a worker faults in and fills fresh shared memory: more than 0.01 ms a MiB, and a
    # memcpy-bound machine does not take 10 ms a MiB; the main process maps and frees it
    assert 0.01e-3 / MiB < cost.worker_per_byte < 10e-3 / MiB
    assert 0.001e-3 / MiB < cost.main_per_byte < cost.worker_per_byte
    assert cost.main_per_batch > 0  # unpickling and receiving descriptors is never free


def test_per_sample_costs_share_the_batch_costs():
    assert COST.worker_seconds(MiB, batch_size=16) == pytest.approx(0.5e-3 + 0.4e-3 / 16)
    assert COST.main_seconds(MiB, batch_size=4) == pytest.approx(0.125e-3 + 0.3e-3 / 4)
    assert COST.worker_seconds(0, batch_size=16) == COST.main_seconds(0, batch_size=16) == 0
    assert "ms/MiB" in str(COST) and "worker" in str(COST)


def test_workers_pay_the_transfer_and_the_main_process_caps_the_pace():
    cost = SampleCost(wall_seconds=0.002, cpu_seconds=0.002, out_bytes=MiB)
    feed = feed_needs(cost, batch_size=16, step_seconds=1.0, cores=65, transfer=COST)
    extra = 0.5e-3 + 0.4e-3 / 16
    receive = 0.125e-3 + 0.3e-3 / 16
    assert feed.throughput(0) == pytest.approx(500)  # no hand-off without workers
    assert feed.throughput(1) == pytest.approx(1 / (0.002 + extra))
    assert feed.throughput(3) == pytest.approx(3 / (0.002 + extra))
    assert feed.throughput(16) == pytest.approx(16 / (0.002 + extra))  # 6,337/s
    assert feed.throughput(32) == pytest.approx(1 / receive)  # 6,957/s < 32 / 2.53 ms
    assert feed.throughput(64) == pytest.approx(1 / receive)
    before = feed_needs(
        SampleCost(0.002, 0.002), batch_size=16, step_seconds=1.0, cores=65
    ).throughput(32)
    assert before == pytest.approx(32 / 0.002)  # without out_bytes nothing changes


def test_the_main_process_bound_is_a_cpu_bound():
    cost = SampleCost(wall_seconds=0.002, cpu_seconds=0.002, out_bytes=4 * MiB)
    feed = feed_needs(cost, batch_size=16, step_seconds=0.001, cores=65, transfer=COST)
    receive = 4 * 0.125e-3 + 0.3e-3 / 16
    assert feed.bound is FeedBound.CPU
    assert feed.max_samples_per_s == pytest.approx(1 / receive)
    assert "main's limit" in str(feed)


def test_cheap_large_samples_load_fastest_without_workers():
    # 0.2 ms a sample in the main process; a worker would add 0.5 ms of hand-off to it
    cost = SampleCost(wall_seconds=0.0002, cpu_seconds=0.0002, out_bytes=MiB)
    feed = feed_needs(cost, batch_size=16, step_seconds=0.005, cores=3, transfer=COST)
    assert feed.samples_per_s == 3200
    assert feed.throughput(0) == pytest.approx(5000)
    assert feed.throughput(2) < feed.throughput(0)
    assert feed.workers == 0
    assert feed.main_cpu == 0
    assert feed.max_samples_per_s == pytest.approx(5000)
    assert feed.bound is FeedBound.GPU


def test_the_sample_size_comes_from_the_report_or_the_typical_machine():
    report = LoaderReport(
        chosen=LoaderConfig(), trials=(), baseline_samples_per_s=500.0,
        chosen_samples_per_s=None, tuning_seconds=1.0, time_budget=2.0,
        machine=machine_budget(), batch_bytes=16 * MiB, cpu_load=1.0, max_workers=2,
    )  # fmt: skip
    assert SampleCost.from_report(report, batch_size=16).out_bytes == MiB
    assert SampleCost.from_report(report).out_bytes == 0  # no batch size: left out
    assert SampleCost.from_report(report, out_bytes=10.0, batch_size=16).out_bytes == 10.0
    feed = feed_needs(report, batch_size=16, step_seconds=0.1, cores=4)
    assert feed.cost.out_bytes == MiB
    assert feed.transfer is TYPICAL_TRANSFER
    assert (feed.workers, feed.main_cpu) == (0, 0)  # 160/s: the main process keeps up alone
    fast = feed_needs(report, batch_size=16, step_seconds=0.02, cores=4)  # 800/s
    receive = TYPICAL_TRANSFER.main_seconds(MiB, batch_size=16)
    assert fast.workers == 3  # 2 ms + the hand-off a sample: 2 workers give < 800/s
    assert fast.main_cpu == pytest.approx(800 * receive)
    # a report that knows its loader's batch (tuned_loader_and_report's) uses it, not the step's
    own = LoaderReport(**{**report.__dict__, "batch_size": 8})
    assert SampleCost.from_report(own, batch_size=16).out_bytes == 2 * MiB


def test_a_tuned_loaders_report_carries_its_batch_size():
    from torchfit.loaders import tuned_loader_and_report

    data = torch.utils.data.TensorDataset(torch.zeros(64, 32))
    _, report = tuned_loader_and_report(data, batch_size=8, time_budget=0.5, num_workers=0)
    assert report.batch_size == 8
    assert report.batch_bytes == 8 * 32 * 4


@settings(max_examples=50, deadline=None)
@given(
    wall=st.floats(1e-5, 0.05),
    size=st.floats(0, 64 * MiB),
    batch=st.integers(1, 256),
    step=st.floats(1e-3, 2.0),
    cores=st.integers(1, 64),
)
def test_no_worker_count_beats_the_machines_limit(wall, size, batch, step, cores):
    cost = SampleCost(wall, wall, out_bytes=size)
    feed = feed_needs(cost, batch_size=batch, step_seconds=step, cores=cores, transfer=COST)
    rates = [feed.throughput(w) for w in (0, 1, 2, 4, 16, 256)]
    assert max(rates) <= feed.max_samples_per_s * (1 + 1e-9)
    if feed.bound is FeedBound.GPU:
        assert feed.throughput(feed.workers) >= feed.samples_per_s * (1 - 1e-9)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"sample_bytes": 100}, "sample_bytes must be >= 4096"),
        ({"batches": 1}, "batches >= 2"),
        ({"rounds": 0}, "rounds >= 1"),
    ],
)
def test_the_probe_refuses_bad_arguments(options, match):
    with pytest.raises(ValueError, match=match):
        measure_transfer(**options)


def test_bad_costs_are_refused():
    with pytest.raises(ValueError, match="main_per_byte must be a finite number >= 0"):
        TransferCost(1e-10, 1e-4, -1e-10, 1e-4)
    with pytest.raises(ValueError, match="out_bytes must be >= 0"):
        SampleCost.from_rate(100.0, out_bytes=-1)
