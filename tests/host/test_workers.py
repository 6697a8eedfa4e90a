"""DataLoader workers' host memory: predicted against the workers' USS read from /proc."""

import gc
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, Dataset, TensorDataset

from torchfit.host import measure_workers, worker_memory
from torchfit.host.objects import PAGE_BYTES, copied_objects, cow_bytes, size_classes
from torchfit.host.workers import WORKER_BASE_BYTES, touched_fraction

MiB = 2**20


class Records(Dataset):
    """Python objects per item, every field read by ``__getitem__`` (as real datasets do)."""

    def __init__(self, count, kind):
        if kind is None:  # no objects: a worker's own pages, the same batches made
            self.items = range(count)
        elif kind == "paths":
            self.items = [f"images/train/{i:09d}/frame.jpg" for i in range(count)]
        elif kind == "pairs":
            self.items = [(f"img/{i}.png", float(i)) for i in range(count)]
        else:
            self.items = [{"id": i + 1000, "path": f"img/{i}.png"} for i in range(count)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        _read(self.items[index])
        return torch.zeros(4)

    def __getitems__(self, indices):
        """A batch at once (the DataLoader calls this when defined): the same objects read,
        and a number per item, which collates into one tensor, in place of a tensor each."""
        for index in indices:
            _read(self.items[index])
        return [0] * len(indices)


def _read(item):
    """Every field of an item read, which writes each object's reference count."""
    if isinstance(item, dict):
        return list(item.values())
    return list(item) if isinstance(item, tuple) else item


def _measure(loader, **kwargs):
    """`measure_workers` after a full collection, with every survivor frozen.

    A worker's collector writes to the header of every object it traverses, copying the
    page: freezing keeps the garbage of earlier tests out of both measurements.
    """
    gc.collect()
    gc.freeze()
    return measure_workers(loader, **kwargs)


def _base_uss(workers, length, batch_size):
    """Each worker's own pages in this process: a loader over a dataset with no objects."""
    empty = Records(length, None)
    return _measure(DataLoader(empty, batch_size=batch_size, num_workers=workers)).uss


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "workers", "shuffle"),
    [("paths", 1, False), ("paths", 2, False), ("pairs", 2, True), ("dicts", 2, False)],
)
def test_predicted_worker_memory_matches_their_uss(kind, workers, shuffle):
    """The copied objects, above each worker's own pages measured in this process.

    The own pages depend on what the parent imported and froze before the fork (see
    `WORKER_BASE_BYTES`), which differs between this file run alone, in the suite and in a
    pytest-xdist worker; the copies above them do not.
    """
    # 400k items: 37-123 MiB copied, within 1% of the prediction as at 1M (measured);
    # a worker's own pages vary by about 1 MiB
    dataset = Records(400_000, kind)
    loader = DataLoader(dataset, batch_size=1024, num_workers=workers, shuffle=shuffle)
    predicted = worker_memory(dataset, num_workers=workers, batch_size=1024, shuffle=shuffle)
    measured = _measure(loader)
    assert len(measured.uss) == workers
    base = _base_uss(workers, len(dataset), 1024)
    copied = measured.copies - sum(base)
    predicted_copied = predicted.copies - workers * predicted.base
    assert abs(predicted_copied - copied) <= 0.15 * copied, (predicted, measured, base)


@pytest.mark.slow
def test_a_workers_own_pages_are_near_the_stated_base():
    """`WORKER_BASE_BYTES` from fresh scripts, a parent that imported ``numpy.random`` and
    one that did not (the pytest process's own heap varies). Its written pages are the
    part that does not depend on which other processes map the same libraries."""
    script = Path(__file__).with_name("worker_base.py")
    runs = [
        subprocess.Popen([sys.executable, script, *args], stdout=subprocess.PIPE, text=True)
        for args in (["numpy"], [])
    ]
    imported, seeded = (json.loads(run.communicate(timeout=120)[0]) for run in runs)
    # measured: 10.5 and 13.3 MiB written; 0-3 MiB of library pages on top
    assert 0.7 * WORKER_BASE_BYTES <= imported["dirty"] < seeded["dirty"] <= WORKER_BASE_BYTES
    assert 2 * MiB <= seeded["dirty"] - imported["dirty"] <= 5 * MiB  # numpy.random's import
    for run in (imported, seeded):
        assert 0 <= run["uss"] - run["dirty"] <= 4 * MiB, run


@pytest.mark.slow
def test_batches_in_flight_sit_in_shared_memory():
    batch = 16 * 256 * 1024  # 16 samples of 256 KiB: 4 MiB per batch
    dataset = TensorDataset(torch.zeros(16 * 8, 64 * 1024))
    loader = DataLoader(dataset, batch_size=16, num_workers=2, prefetch_factor=2)
    predicted = worker_memory(dataset, num_workers=2, batch_size=16, batch_bytes=batch)
    # only the loader's own /dev/shm files are read: other processes' (a loader in a test
    # on another pytest-xdist worker) neither add to nor take from it
    peak = measure_workers(loader, batches=2, hold_seconds=0.5).shm_peak
    # prefetch_factor * workers batches made ahead, plus the one the step holds
    assert predicted.in_flight == 5 * batch
    assert predicted.in_flight - batch <= peak <= predicted.in_flight + batch


def test_no_workers_add_nothing():
    memory = worker_memory(Records(2000, "paths"), num_workers=0, batch_size=8)
    assert memory.total == 0
    assert memory.copies == 0


def test_sequential_workers_copy_their_runs_and_shuffled_ones_everything():
    dataset = Records(50_000, "paths")
    sequential = worker_memory(dataset, num_workers=4, batch_size=256)
    shuffled = worker_memory(dataset, num_workers=4, batch_size=256, shuffle=True)
    assert 0.25 < sequential.fraction < 0.3
    assert shuffled.fraction == 1.0
    assert shuffled.per_worker > sequential.per_worker > WORKER_BASE_BYTES


def test_pinned_batches_round_each_tensor_up_to_a_power_of_two():
    memory = worker_memory(
        Records(2000, "paths"), num_workers=2, batch_size=8, batch_bytes=3 * MiB,
        batch_tensor_bytes=(3 * MiB - 100, 100), pin_memory=True,
    )  # fmt: skip
    assert memory.pinned == 5 * (4 * MiB + 128)
    assert worker_memory(Records(2000, "paths"), num_workers=2, batch_size=8).pinned == 0


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ("x" * 10_000, PAGE_BYTES),  # a large object copies its header page
        (np.zeros(10**6), None),  # a buffer is never written
        (7, 0.0),  # a cached small int is shared by everyone
        (None, 0.0),
    ],
)
def test_cow_bytes_by_kind(obj, expected):
    size = cow_bytes(obj)
    if expected is None:
        assert size < 256
    else:
        assert size == expected


def test_cow_bytes_counts_a_dict_header_not_its_table():
    small, big = {"a": 1000.5}, {f"k{i}": i + 1000.5 for i in range(100)}
    assert cow_bytes(big) - cow_bytes(small) == pytest.approx(99 * cow_bytes(1000.5), rel=0.01)
    assert cow_bytes(big) < sys.getsizeof(big)


def test_python_objects_finds_containers_in_wrapped_datasets():
    class Wrapper(Dataset):
        def __init__(self):
            self.inner = [Records(5000, "paths"), Records(3000, "pairs")]
            self.small = list(range(10))  # too small to matter

    found = copied_objects(Wrapper())
    assert [(where, items) for where, items, _ in found.found] == [
        ("dataset.inner[1].items", 3000),
        ("dataset.inner[0].items", 5000),
    ]
    assert found.classes == 2  # a pair: its tuple and str in one class, its float in another


def test_size_classes_of_one_item():
    assert size_classes("path") == 1
    assert size_classes(("images/0001.jpg", 3.5)) == 2


@settings(max_examples=40, deadline=None)
@given(
    workers=st.integers(1, 16),
    item=st.floats(16, 10_000),
    batch=st.integers(1, 512),
    shuffle=st.booleans(),
    persistent=st.booleans(),
)
def test_touched_fraction_is_a_share(workers, item, batch, shuffle, persistent):
    share = touched_fraction(
        workers, item_bytes=item, batch_size=batch, shuffle=shuffle, persistent=persistent
    )
    assert 1 / workers - 1e-3 <= share <= 1.0
    if not shuffle:  # each worker reads its runs and one page at each edge
        run = batch * item
        assert share == pytest.approx(min(1.0, (run + PAGE_BYTES) / (workers * run)), abs=1e-3)


def test_bad_worker_arguments():
    with pytest.raises(ValueError, match="num_workers"):
        worker_memory(Records(10, "paths"), num_workers=-1, batch_size=4)
    with pytest.raises(ValueError, match="batch_size"):
        worker_memory(Records(10, "paths"), num_workers=1, batch_size=0)
