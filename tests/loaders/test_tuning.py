import collections
import json
import multiprocessing
import os
import random
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    get_worker_info,
)

import torchfit.loaders.machine as machine_mod
from torchfit import loaders
from torchfit.loaders import (
    Bound,
    Diagnosis,
    LoaderConfig,
    LoaderReport,
    LoaderWarning,
    check_shm,
    diagnose,
    tuned_loader,
    tuned_loader_and_report,
)
from torchfit.loaders.hazards import fingerprint, python_objects
from torchfit.loaders.machine import (
    MachineBudget,
    cgroup_cpu_limit,
    local_world_size,
    machine_budget,
    shm_worker_limit,
)
from torchfit.loaders.probe import IndexStream, WorkerSeeder, runqueue_seconds
from torchfit.loaders.report import Setup
from torchfit.loaders.search import _Search

# --- datasets (module level: picklable under fork and spawn) -------------------------


class RangeData(Dataset):
    """Sample i is tensor([i])."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor([i])


class SleepyData(RangeData):
    """Sample i after a sleep: I/O-like."""

    def __init__(self, n, seconds):
        super().__init__(n)
        self.seconds = seconds

    def __getitem__(self, i):
        time.sleep(self.seconds)
        return torch.tensor([i])


class RandomData(RangeData):
    """Sample i with draws from random, numpy and torch (and who drew them)."""

    def __getitem__(self, i):
        info = get_worker_info()
        return {
            "index": i,
            "worker": -1 if info is None else info.id,
            "random": random.random(),  # noqa: S311 - the global stream is the point
            "numpy": float(np.random.rand()),  # noqa: NPY002 - the global stream is the point
            "torch": float(torch.rand(())),
        }


class WideData(RangeData):
    """1 KiB per sample, to size batches in /dev/shm."""

    def __getitem__(self, i):
        return torch.full((256,), float(i))


class PythonListData(Dataset):
    """Holds a big list of Python ints (copied into every worker, pytorch #13246)."""

    def __init__(self, n):
        self.items = list(range(n))

    def __len__(self):
        return 32

    def __getitem__(self, i):
        return torch.tensor([self.items[i]])


class MainProcessOnly(RangeData):
    """Breaks inside a worker process, as a dataset holding an open handle may."""

    def __getitem__(self, i):
        if get_worker_info() is not None:
            raise OSError("handle not valid in a worker")
        return torch.tensor([i])


class ShardedStream(IterableDataset):
    """Yields 0..n-1 once in all, split across workers."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(torch.tensor([i]) for i in range(start, self.n, step))


class UnshardedStream(ShardedStream):
    """Yields 0..n-1 in every worker: N workers repeat each sample N times."""

    def __iter__(self):
        return iter(torch.tensor([i]) for i in range(self.n))


def _user_init(worker_id):
    random.seed(1000 + worker_id)


def _pair(batch):
    return ("pair", batch)


def flat(batches):
    """Each batch as a list of sample ids."""
    out = []
    for batch in batches:
        if isinstance(batch, torch.Tensor):
            out.append(batch.reshape(-1).tolist())
        else:
            out.append([batch])
    return out


def children():
    """Processes whose parent is this one (Linux /proc), plus multiprocessing's view."""
    mine = {p.pid for p in multiprocessing.active_children()}
    proc = Path("/proc")
    if proc.is_dir():
        for entry in proc.iterdir():
            if entry.name.isdigit():
                try:
                    status = (entry / "status").read_text()
                except OSError:
                    continue
                if f"\nPPid:\t{os.getpid()}\n" in status:
                    mine.add(int(entry.name))
    return mine


# --- the loader is a plain DataLoader, with the report --------------------------------


def test_returns_plain_dataloader_and_a_readable_report():
    loader, report = tuned_loader_and_report(
        RangeData(64), batch_size=8, time_budget=1.5, max_workers=2
    )
    assert type(loader) is DataLoader
    assert isinstance(report, LoaderReport)
    assert loader.num_workers == report.chosen.num_workers
    assert loader.prefetch_factor == report.chosen.prefetch_factor
    assert loader.persistent_workers == report.chosen.persistent_workers
    assert loader.pin_memory is False  # no CUDA device receives the batches here
    assert report.trials[0].config.num_workers == 0  # the default is always measured
    assert len(report.trials) >= 2  # and at least one worker configuration
    text = str(report)
    assert "samples/s" in text
    assert "the default DataLoader(num_workers=0)" in text
    data = json.loads(json.dumps(report.to_dict()))
    assert data["chosen"]["num_workers"] == report.chosen.num_workers
    assert len(data["trials"]) == len(report.trials)
    assert [flat([b])[0] for b in loader] == [list(range(i, i + 8)) for i in range(0, 64, 8)]


def test_report_is_frozen():
    _, report = tuned_loader_and_report(RangeData(8), batch_size=4, time_budget=0.5, num_workers=0)
    with pytest.raises(AttributeError):
        report.chosen = LoaderConfig()


# --- same samples as a plain DataLoader ------------------------------------------------

SAMPLERS = ["none", "shuffle", "subset", "list", "batch_sampler", "distributed"]


def _loader_args(kind, n, batch_size, drop_last, seed):
    """Fresh DataLoader arguments for one sampler kind (new generators each call)."""
    gen = torch.Generator().manual_seed(seed)
    if kind == "none":
        return {"batch_size": batch_size, "drop_last": drop_last}
    if kind == "shuffle":
        return {"batch_size": batch_size, "drop_last": drop_last, "shuffle": True, "generator": gen}
    if kind == "subset":
        sampler = SubsetRandomSampler(list(range(0, n, 2)), generator=gen)
        return {"batch_size": batch_size, "drop_last": drop_last, "sampler": sampler}
    if kind == "list":
        order = random.Random(seed).choices(range(n), k=n) if n else []  # noqa: S311
        return {"batch_size": batch_size, "drop_last": drop_last, "sampler": order}
    if kind == "batch_sampler":
        inner = RandomSampler(range(n), generator=gen)
        return {"batch_size": None, "batch_sampler": BatchSampler(inner, batch_size, drop_last)}
    sampler = DistributedSampler(
        range(max(n, 1)),
        num_replicas=2,
        rank=seed % 2,
        shuffle=True,
        seed=seed,
        drop_last=drop_last,
    )
    return {"batch_size": batch_size, "drop_last": drop_last, "sampler": sampler}


def _plain(dataset, args):
    args = dict(args)
    if args.get("batch_sampler") is not None:
        args.pop("batch_size")
    return DataLoader(dataset, **args)


def _same_batches(dataset, *, kind, n, batch_size, drop_last, seed, **tune):
    """The tuned loader gives the plain loader's batches, or fails as the plain one does."""
    try:
        plain = flat(_plain(dataset, _loader_args(kind, n, batch_size, drop_last, seed)))
    except ValueError:  # e.g. RandomSampler over 0 samples: torch refuses
        with pytest.raises(ValueError):
            tuned_loader(dataset, **_loader_args(kind, n, batch_size, drop_last, seed), **tune)
        return
    tuned = tuned_loader(dataset, **_loader_args(kind, n, batch_size, drop_last, seed), **tune)
    assert flat(tuned) == plain  # same batches, same order, nothing lost or repeated


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(0, 30),
    batch_size=st.integers(1, 7),
    drop_last=st.booleans(),
    kind=st.sampled_from(SAMPLERS),
    workers=st.integers(0, 2),
    seed=st.integers(0, 2**16),
)
def test_fixed_workers_yield_the_plain_loaders_batches(
    *, n, batch_size, drop_last, kind, workers, seed
):
    if kind == "distributed" and n == 0:
        n = 1
    _same_batches(
        RangeData(n),
        kind=kind,
        n=n,
        batch_size=batch_size,
        drop_last=drop_last,
        seed=seed,
        time_budget=0.3,
        num_workers=workers,
    )


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(0, 40),
    batch_size=st.integers(1, 6),
    drop_last=st.booleans(),
    kind=st.sampled_from([*SAMPLERS, "iterable"]),
    seed=st.integers(0, 2**16),
)
def test_tuned_loader_yields_the_plain_loaders_samples(n, batch_size, drop_last, kind, seed):
    if kind == "iterable":
        dataset = ShardedStream(n)
        args = {"batch_size": batch_size, "drop_last": drop_last}
        tuned = tuned_loader(dataset, time_budget=0.6, max_workers=2, **args)
        plain = DataLoader(dataset, **args)
        got = collections.Counter(i for batch in flat(tuned) for i in batch)
        want = collections.Counter(i for batch in flat(plain) for i in batch)
        assert got == want  # the same multiset: workers interleave batches
        assert tuned.num_workers <= 1 or not drop_last  # drop_last: one worker at most
        return
    if kind == "distributed" and n == 0:
        n = 1
    _same_batches(
        RangeData(n),
        kind=kind,
        n=n,
        batch_size=batch_size,
        drop_last=drop_last,
        seed=seed,
        time_budget=0.6,
        max_workers=2,
    )


def test_shuffle_without_generator_follows_torch_manual_seed():
    dataset = RangeData(40)
    tuned = tuned_loader(dataset, batch_size=5, shuffle=True, time_budget=0.5, num_workers=1)
    plain = DataLoader(dataset, batch_size=5, shuffle=True)
    torch.manual_seed(3)
    first = flat(tuned)
    torch.manual_seed(3)
    assert first == flat(plain)


def test_user_collate_and_sampler_objects_are_kept():
    sampler = DistributedSampler(range(20), num_replicas=2, rank=1, shuffle=False)
    loader = tuned_loader(
        RangeData(20),
        batch_size=3,
        sampler=sampler,
        collate_fn=_pair,
        time_budget=0.5,
        num_workers=0,
    )
    assert loader.sampler is sampler  # handled, not replaced
    batches = list(loader)
    assert all(batch[0] == "pair" for batch in batches)
    assert [t.item() for batch in batches for t in batch[1]] == list(range(1, 20, 2))


def test_fixed_knobs_are_honoured_and_not_tuned():
    loader, report = tuned_loader_and_report(
        RangeData(32),
        batch_size=4,
        time_budget=0.5,
        num_workers=1,
        prefetch_factor=3,
        persistent_workers=False,
        pin_memory=False,
    )
    assert (loader.num_workers, loader.prefetch_factor) == (1, 3)
    assert loader.persistent_workers is False
    assert report.fixed == ("num_workers", "persistent_workers", "pin_memory", "prefetch_factor")
    assert [t.config for t in report.trials] == [LoaderConfig(1, 3)]
    assert report.baseline_samples_per_s is None


# --- worker seeding --------------------------------------------------------------------


def _draws(seed, **kwargs):
    loader = tuned_loader(
        RandomData(8),
        batch_size=None,
        num_workers=2,
        generator=torch.Generator().manual_seed(seed),
        time_budget=0.5,
        **kwargs,
    )
    return list(loader)


def test_workers_are_seeded_distinctly_and_reproducibly():
    first, again, other = _draws(7), _draws(7), _draws(8)
    assert first == again  # the same generator seed: the same draws
    for source in ("random", "numpy", "torch"):
        by_worker = {w: [s[source] for s in first if s["worker"] == w] for w in (0, 1)}
        assert by_worker[0] != by_worker[1], source  # workers draw different streams
        assert [s[source] for s in first] != [s[source] for s in other], source


def test_user_worker_init_fn_runs_after_torchfit_seeding():
    samples = _draws(7, worker_init_fn=_user_init)
    for worker in (0, 1):
        firsts = [s["random"] for s in samples if s["worker"] == worker][:1]
        assert firsts == [random.Random(1000 + worker).random()]  # noqa: S311


def test_spawned_workers_get_the_same_batches():
    # spawn pickles the dataset and the worker_init_fn into each worker: both must travel.
    dataset = RangeData(12)
    loader = tuned_loader(
        dataset,
        batch_size=4,
        num_workers=1,
        multiprocessing_context="spawn",
        worker_init_fn=_user_init,
        time_budget=0.5,
    )
    assert isinstance(loader.worker_init_fn, WorkerSeeder)
    assert flat(loader) == flat(DataLoader(dataset, batch_size=4))


def test_a_multiprocessing_context_is_kept_off_a_main_process_loader():
    # DataLoader refuses multiprocessing_context with num_workers=0.
    loader = tuned_loader(
        RangeData(8), batch_size=4, multiprocessing_context="fork", time_budget=0.5, max_workers=0
    )
    assert loader.num_workers == 0
    assert flat(loader) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_worker_seeder_unwraps_instead_of_nesting():
    assert WorkerSeeder(WorkerSeeder(_user_init)).user_fn is _user_init


# --- the probe consumes nothing the user will miss ---------------------------------------


def test_no_worker_process_is_left_behind():
    before = children()
    loader, report = tuned_loader_and_report(
        SleepyData(64, 0.002), batch_size=4, time_budget=1.5, max_workers=2
    )
    assert any(t.config.num_workers > 0 for t in report.trials)  # workers were started
    assert children() - before == set()
    assert loader.num_workers == 0 or loader._iterator is None  # no pool until iterated
    diagnose(DataLoader(RangeData(40), batch_size=4, num_workers=2), lambda b: None, steps=3)
    assert children() - before == set()


def test_probe_leaves_rng_sampler_and_dataset_state_as_found():
    dataset = RandomData(48)
    user_gen = torch.Generator().manual_seed(11)
    random.seed(1)
    np.random.seed(2)  # noqa: NPY002
    torch.manual_seed(3)
    states = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())  # noqa: NPY002
    gen_state = user_gen.get_state()
    attributes = dict(vars(dataset))
    tuned_loader_and_report(
        dataset, batch_size=4, shuffle=True, generator=user_gen, time_budget=1.0, max_workers=2
    )
    assert random.getstate() == states[0]
    assert np.array_equal(np.random.get_state()[1], states[1])  # noqa: NPY002
    assert torch.equal(torch.get_rng_state(), states[2])
    assert torch.equal(user_gen.get_state(), gen_state)
    assert vars(dataset) == attributes


def test_time_budget_is_honoured():
    start = time.perf_counter()
    _, report = tuned_loader_and_report(SleepyData(10_000, 0.01), batch_size=4, time_budget=1.5)
    wall = time.perf_counter() - start
    assert report.tuning_seconds <= 2.5
    assert wall <= 2.5
    assert report.time_budget == 1.5


def test_a_failing_worker_configuration_is_reported_not_raised():
    with pytest.warns(
        LoaderWarning,
        match=r"workers? failed: OSError: handle not valid in a worker \(in a worker\)",
    ):
        loader, report = tuned_loader_and_report(
            MainProcessOnly(64), batch_size=4, time_budget=1.5, max_workers=2
        )
    assert loader.num_workers == 0
    assert any("[failed: OSError" in line for line in str(report).splitlines())
    assert flat(loader)[0] == [0, 1, 2, 3]


# --- IterableDataset checks --------------------------------------------------------------


def test_unsharded_iterable_dataset_is_detected_and_kept_to_one_worker():
    with pytest.warns(LoaderWarning, match="does not shard itself across workers"):
        loader, report = tuned_loader_and_report(
            UnshardedStream(24), batch_size=4, time_budget=2.0, max_workers=4
        )
    assert report.chosen.num_workers <= 1
    assert sorted(i for batch in flat(loader) for i in batch) == list(range(24))


def test_sharded_iterable_dataset_raises_no_warning():
    _, report = tuned_loader_and_report(
        ShardedStream(64), batch_size=4, time_budget=1.0, max_workers=2
    )
    assert report.warnings == ()


def test_iterable_with_drop_last_uses_at_most_one_worker():
    loader, report = tuned_loader_and_report(
        ShardedStream(30), batch_size=4, drop_last=True, time_budget=1.0, max_workers=4
    )
    assert loader.num_workers <= 1
    assert any("drop_last=True" in reason for reason in report.reasons)


# --- machine limits --------------------------------------------------------------------


def _fake_cgroup(root, membership, files):
    (root / "proc" / "self").mkdir(parents=True)
    (root / "proc" / "self" / "cgroup").write_text(membership)
    for relative, text in files.items():
        path = root / "sys" / "fs" / "cgroup" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_cgroup_v2_quota_takes_the_tightest_ancestor(tmp_path):
    _fake_cgroup(
        tmp_path,
        "0::/job/step\n",
        {
            "job/cpu.max": "300000 100000\n",
            "job/step/cpu.max": "150000 100000\n",
            "cpu.max": "max 100000",
        },
    )
    assert cgroup_cpu_limit(tmp_path) == 1.5


def test_cgroup_v1_quota(tmp_path):
    _fake_cgroup(
        tmp_path,
        "5:memory:/docker/a\n4:cpu,cpuacct:/docker/a\n",
        {
            "cpu,cpuacct/docker/a/cpu.cfs_quota_us": "200000",
            "cpu,cpuacct/docker/a/cpu.cfs_period_us": "100000",
        },
    )
    assert cgroup_cpu_limit(tmp_path) == 2.0


@pytest.mark.parametrize(
    ("membership", "files"),
    [
        ("0::/\n", {"cpu.max": "max 100000"}),
        ("4:cpu:/\n", {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}),
        ("", {}),
    ],
)
def test_cgroup_without_quota(tmp_path, membership, files):
    _fake_cgroup(tmp_path, membership, files)
    assert cgroup_cpu_limit(tmp_path) is None


def test_cpu_budget_divides_affinity_and_quota_among_local_ranks(monkeypatch):
    monkeypatch.setattr(machine_mod, "affinity_cpus", lambda: 16)
    monkeypatch.setattr(machine_mod, "cgroup_cpu_limit", lambda: 12.5)
    monkeypatch.setattr(machine_mod, "shm_free_bytes", lambda: 8 * 2**30)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    budget = machine_budget()
    assert budget.cpus == 3  # min(16, 12) // 4
    assert budget.local_world_size == 4
    assert budget.shm_share_bytes == 2 * 2**30
    assert "LOCAL_WORLD_SIZE" in budget.describe()


def test_local_world_size_from_an_initialized_process_group(tmp_path, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("OMPI_COMM_WORLD_LOCAL_SIZE", raising=False)
    assert local_world_size() == (1, "default (not distributed)")
    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        size, source = local_world_size()
    finally:
        torch.distributed.destroy_process_group()
    assert size == 1
    assert source.startswith("torch.distributed")


def test_too_small_shm_is_reported_and_workers_avoided(monkeypatch):
    monkeypatch.setattr(machine_mod, "shm_free_bytes", lambda: 12 * 2**10)
    with pytest.warns(LoaderWarning, match="/dev/shm is too small"):  # noqa: S108
        loader, report = tuned_loader_and_report(
            WideData(64), batch_size=4, time_budget=1.0, max_workers=4
        )
    assert loader.num_workers == 0  # 4 KiB batches x prefetch 2 do not fit in 6 KiB
    assert report.batch_bytes == 4 * 1024
    assert all(t.config.num_workers == 0 for t in report.trials)


def test_too_small_shm_is_reported_for_a_fixed_worker_count(monkeypatch):
    monkeypatch.setattr(machine_mod, "shm_free_bytes", lambda: 12 * 2**10)
    with pytest.warns(LoaderWarning, match=r"2 workers x prefetch 2 x 4.00 KiB"):
        loader = tuned_loader(WideData(16), batch_size=4, time_budget=0.5, num_workers=2)
    assert loader.num_workers == 2  # the caller's choice stands; the warning came first


def test_check_shm():
    budget = MachineBudget(1, 1, None, 1, "test", shm_free_bytes=64 * 2**20)
    assert check_shm(num_workers=2, prefetch_factor=2, batch_bytes=2**20, machine=budget) is None
    assert check_shm(num_workers=8, prefetch_factor=4, batch_bytes=2**20, machine=budget) is None
    message = check_shm(num_workers=9, prefetch_factor=4, batch_bytes=2**20, machine=budget)
    assert message is not None
    assert "36.00 MiB in flight" in message
    assert "at most 8 workers" in message


@given(
    share=st.integers(0, 2**40) | st.none(),
    workers=st.integers(0, 64),
    prefetch=st.integers(1, 8),
    batch=st.integers(0, 2**30),
)
def test_check_shm_is_the_worker_limit(share, workers, prefetch, batch):
    budget = MachineBudget(1, 1, None, 1, "test", shm_free_bytes=share)
    limit = shm_worker_limit(share, prefetch=prefetch, batch_bytes=batch)
    message = check_shm(
        num_workers=workers, prefetch_factor=prefetch, batch_bytes=batch, machine=budget
    )
    in_flight_fits = share is None or workers * prefetch * batch <= share / 2
    assert (message is None) is in_flight_fits
    assert (limit is None or workers <= limit) is in_flight_fits
    if message is not None:
        assert f"at most {limit} workers" in message or "no worker fits" in message


@pytest.mark.parametrize("spare", [-1, 0, 1])
def test_the_search_warns_exactly_when_check_shm_does(monkeypatch, spare):
    """The tuning's /dev/shm limit and check_shm are one rule: same verdict, same words."""
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("OMPI_COMM_WORLD_LOCAL_SIZE", raising=False)
    batch = 4 * 1024  # 4 samples of WideData
    free = 2 * (2 * 2 * batch) + spare  # 2 workers x prefetch 2 take half of it, give or take
    monkeypatch.setattr(machine_mod, "shm_free_bytes", lambda: free)
    expected = check_shm(
        num_workers=2, prefetch_factor=2, batch_bytes=batch, machine=machine_budget()
    )
    assert (expected is None) is (spare >= 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, report = tuned_loader_and_report(
            WideData(16), batch_size=4, time_budget=0.5, num_workers=2
        )
    assert report.batch_bytes == batch
    shm = [str(w.message) for w in caught if "/dev/shm" in str(w.message)]  # noqa: S108
    assert shm == ([] if expected is None else [expected])


def test_python_objects_finds_nested_dicts_and_sets():
    class Holder:
        pass

    inner = PythonListData(10)
    inner.lookup = {i: str(i) for i in range(2000)}
    inner.seen = set(range(3000))
    holder = Holder()
    holder.dataset = inner
    found = {where: items for where, items, _ in python_objects(holder)}
    assert found == {"dataset.dataset.lookup": 2000, "dataset.dataset.seen": 3000}


def test_python_objects_copied_into_workers_are_warned_about():
    dataset = PythonListData(1_000_000)
    assert python_objects(dataset)[0][:2] == ("dataset.items", 1_000_000)
    with pytest.warns(LoaderWarning, match=r"dataset.items holds 1,000,000 Python objects"):
        tuned_loader(dataset, batch_size=4, time_budget=0.5, num_workers=1)
    tuned_loader(dataset, batch_size=4, time_budget=0.5, num_workers=0)  # no copy, no warning


def test_cuda_device_without_cuda_does_not_pin():
    _, report = tuned_loader_and_report(
        RangeData(8), batch_size=4, device="cuda", time_budget=0.5, num_workers=0
    )
    if torch.cuda.is_available():
        assert report.chosen.pin_memory
    else:
        assert not report.chosen.pin_memory
        assert any("CUDA is not available" in reason for reason in report.reasons)


# --- the search ------------------------------------------------------------------------


def _search_with(rate_of, cap, cpu_load):
    setup = Setup(
        dataset=RangeData(10_000),
        loader_kwargs={"batch_size": 4, "shuffle": False},
        context=None,
        fixed={},
        pin=False,
        time_budget=60.0,
        max_workers=None,
        machine=MachineBudget(2, 2, None, 1, "test", shm_free_bytes=None),
    )
    search = _Search(setup, start=time.perf_counter())
    search.cap, search.cpu_load = cap, cpu_load
    tried = []

    def fake_try(workers, prefetch, why):
        tried.append(workers)
        search.trials.append(
            loaders.LoaderTrial(
                LoaderConfig(workers, prefetch), rate_of(workers), 0.0, 10, 1.0, why
            )
        )
        return rate_of(workers)

    search._try = fake_try
    search._climb()
    return tried, search._pick().config.num_workers, search


@pytest.mark.parametrize(
    ("peak", "cap", "cpu_load"),
    [(2, 8, 1.0), (3, 8, 1.0), (12, 64, 0.05), (24, 64, 0.02), (1, 8, 0.9), (6, 8, 0.4)],
)
def test_climb_finds_the_peak_without_a_grid(peak, cap, cpu_load):
    tried, chosen, _ = _search_with(lambda w: 100.0 * min(w, peak) - 0.5 * w, cap, cpu_load)
    assert chosen == peak
    assert len(tried) <= 6  # a handful of trials, not every worker count
    assert len(tried) == len(set(tried))  # nothing measured twice


@pytest.mark.parametrize(
    ("epoch_batches", "startup", "persistent"), [(10_000, 0.05, False), (50, 0.5, True)]
)
def test_persistent_workers_when_start_up_is_a_noticeable_share_of_an_epoch(
    epoch_batches, startup, persistent
):
    search = _search_with(lambda w: 100.0, 8, 1.0)[2]
    search.epoch_batches = epoch_batches
    trial = loaders.LoaderTrial(LoaderConfig(2, 2), 400.0, startup, 10, 1.0, "test")
    # 4 samples per batch at 400 samples/s: 10,000 batches take 100 s, 50 take 0.5 s.
    assert search._persistence(LoaderConfig(2, 2), trial).persistent_workers is persistent


def test_runqueue_seconds_is_a_clock():
    assert runqueue_seconds() >= 0.0


def test_index_stream_continues_across_epochs_and_stops_when_empty():
    stream = IndexStream([1, 2, 3])
    assert [next(stream) for _ in range(7)] == [1, 2, 3, 1, 2, 3, 1]
    with pytest.raises(StopIteration):
        next(IndexStream([]))


def test_fingerprint_tells_content_apart():
    assert fingerprint({"a": torch.ones(2)}) == fingerprint({"a": torch.ones(2)})
    assert fingerprint(torch.ones(2)) != fingerprint(torch.ones(3))
    assert fingerprint(torch.ones(2, dtype=torch.bfloat16)) != fingerprint(torch.ones(2))


def test_empty_dataset_yields_nothing_and_says_so():
    loader, report = tuned_loader_and_report(RangeData(0), batch_size=4, time_budget=0.5)
    assert list(loader) == []
    assert report.chosen.num_workers == 0
    assert any("no batch" in reason for reason in report.reasons)


# --- bad arguments ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dataset", "kwargs", "error", "match"),
    [
        (
            RangeData(4),
            {"batch_size": 0},
            ValueError,
            r"batch_size must be a whole number >= 1; got 0",
        ),
        (
            RangeData(4),
            {"batch_size": -3},
            ValueError,
            r"batch_size must be a whole number >= 1; got -3",
        ),
        (RangeData(4), {"batch_size": 2.5}, TypeError, r"batch_size must be a whole number"),
        (RangeData(4), {"batch_size": True}, TypeError, r"batch_size must be a whole number"),
        (RangeData(4), {"batch_size": 2, "num_workers": -1}, ValueError, r"num_workers must be"),
        (42, {"batch_size": 2}, TypeError, r"dataset must be a torch.utils.data.Dataset"),
        (iter([1, 2]), {"batch_size": 2}, TypeError, r"got list_iterator"),
        (RangeData(4), {"batch_size": 2, "time_budget": 0}, ValueError, r"time_budget must be"),
        (
            RangeData(4),
            {"batch_size": 2, "num_worker": 2},
            TypeError,
            r"unknown DataLoader argument",
        ),
        (RangeData(4), {"batch_size": 2, "shuffle": "yes"}, TypeError, r"shuffle must be"),
        (RangeData(4), {"batch_size": 2, "pin_memory": 1}, TypeError, r"pin_memory must be"),
        (RangeData(4), {"batch_size": 2, "max_workers": -2}, ValueError, r"max_workers must be"),
        (RangeData(4), {"batch_size": 2, "device": "gpu0"}, ValueError, r"device must be"),
        (
            RangeData(4),
            {"batch_size": 2, "batch_sampler": BatchSampler(SequentialSampler(range(4)), 2, False)},
            ValueError,
            r"pass batch_size=None",
        ),
        (
            RangeData(4),
            {"batch_size": 2, "shuffle": True, "sampler": SequentialSampler(range(4))},
            ValueError,
            r"mutually exclusive",
        ),
    ],
)
def test_bad_arguments_get_clear_errors(dataset, kwargs, error, match):
    with pytest.raises(error, match=match):
        tuned_loader(dataset, **kwargs)


@pytest.mark.parametrize(
    ("loader", "step_fn", "kwargs", "error", "match"),
    [
        ([1, 2], lambda b: None, {"steps": 0}, ValueError, r"steps must be a whole number >= 1"),
        ([1, 2], lambda b: None, {"warmup": -1}, ValueError, r"warmup must be a whole number >= 0"),
        ([1, 2], None, {}, TypeError, r"step_fn must be a callable"),
        ([1, 2], lambda b: None, {"tune": True}, TypeError, r"needs a torch DataLoader"),
        ([1], lambda b: None, {"warmup": 2}, ValueError, r"ran out before a measured step"),
    ],
)
def test_diagnose_bad_arguments(loader, step_fn, kwargs, error, match):
    with pytest.raises(error, match=match):
        diagnose(loader, step_fn, **kwargs)


# --- diagnose ----------------------------------------------------------------------------


def test_diagnose_input_bound_and_tuned_gain():
    loader = DataLoader(SleepyData(400, 0.004), batch_size=4)
    result = diagnose(loader, lambda batch: time.sleep(0.002), steps=6, tune=True, time_budget=2.0)
    assert isinstance(result, Diagnosis)
    assert result.bound is Bound.INPUT
    assert result.wait_fraction > 0.5
    assert result.max_speedup > 2
    assert result.report is not None
    assert result.tuned_speedup is not None
    assert result.tuned_speedup > 1.5
    assert "tuned_loader would give" in result.advice
    assert "input-bound" in str(result)
    assert json.loads(json.dumps(result.to_dict()))["bound"] == "input-bound"


def test_diagnose_compute_bound():
    loader = DataLoader(RangeData(40), batch_size=4)
    result = diagnose(loader, lambda batch: time.sleep(0.02), steps=4, warmup=1)
    assert result.bound is Bound.COMPUTE
    assert result.steps == 4
    assert result.batch_size == 4
    assert result.tuned_speedup is None
    assert "would not help" in result.advice
