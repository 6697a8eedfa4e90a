"""`tuned_loader` under torch.distributed: each rank reads its share, nothing lost or repeated.

Real ranks: 2 and 4 processes with gloo on CPU (loopback), each building tuned loaders
and saving the indices it saw; the parent checks them against DistributedSampler's
documented rule (torch/utils/data/distributed.py): the order is ``randperm(N)`` from a
generator seeded with ``seed + epoch`` (or ``range(N)`` without shuffling); with
``drop_last=False`` it is padded with its own first ``total - N`` indices up to
``total = W * ceil(N / W)``, with ``drop_last=True`` cut to ``W * (N // W)``; rank ``r``
takes every W-th index from ``r``. The DataLoader's own ``drop_last`` then drops each
rank's partial batch. In-process tests cover the rest, faking the rank where that is all
the logic needs.
"""

import collections
import math
import multiprocessing
import os
from unittest import mock

import pytest
import torch
import torch.distributed as dist
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
)

from gloo_ranks import free_port, init_gloo, read_ranks, save_and_leave, start_ranks
from torchfit.loaders import dist as _loaders_dist
from torchfit.loaders import tuned_loader, tuned_loader_and_report
from torchfit.loaders.dist import Ranks, check_shuffle_with_sampler, current_ranks, shard

N = 23  # divisible by neither world size
BATCH = 4
SEED = 0  # DistributedSampler's default, which torchfit uses
USER_SEED = 7
BUDGET = 0.25
CASES = [(shuffle, drop_last) for shuffle in (False, True) for drop_last in (False, True)]


class RangeData(Dataset):
    """Sample i is tensor([i])."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor([i])


class Stream(IterableDataset):
    def __iter__(self):
        return iter(torch.tensor([i]) for i in range(8))


class NoLen(Dataset):
    def __getitem__(self, i):
        return i


def indices(loader):
    return [i for batch in loader for i in batch.reshape(-1).tolist()]


def batch_count(loader):
    return sum(1 for _ in loader)


def order(n, *, shuffle, seed, epoch):
    """The global order DistributedSampler starts from (its documented rule)."""
    if not shuffle:
        return list(range(n))
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()


def expected_rank(n, world, rank, *, shuffle, drop_last, batch, seed=SEED, epoch=0):
    """Indices rank ``rank`` sees in one epoch, derived from the rule (not from torch)."""
    full = order(n, shuffle=shuffle, seed=seed, epoch=epoch)
    if drop_last:
        full = full[: world * (n // world)]
        share = full[rank::world]
        return share[: len(share) // batch * batch]  # DataLoader drops the partial batch
    total = world * math.ceil(n / world)
    while len(full) < total:
        full += full[: total - len(full)]
    return full[rank::world]


# --- the ranks -----------------------------------------------------------------------


def _sampler_args(sampler):
    return {
        "type": type(sampler).__name__,
        "num_replicas": sampler.num_replicas,
        "rank": sampler.rank,
        "shuffle": sampler.shuffle,
        "seed": sampler.seed,
        "drop_last": sampler.drop_last,
        "epoch": sampler.epoch,
    }


def _two_epochs(loader, sampler):
    """Epoch 0 as returned (no set_epoch call first), then set_epoch(1) and epoch 1."""
    first = indices(loader)
    sampler.set_epoch(1)
    return [first, indices(loader)]


def _rank_results(world, rank):
    dataset = RangeData(N)
    out = {}
    for shuffle, drop_last in CASES:
        loader, report = tuned_loader_and_report(
            dataset,
            batch_size=BATCH,
            shuffle=shuffle,
            drop_last=drop_last,
            time_budget=BUDGET,
            max_workers=1,
        )
        plain_sampler = DistributedSampler(dataset, shuffle=shuffle, drop_last=drop_last)
        plain = DataLoader(dataset, batch_size=BATCH, sampler=plain_sampler, drop_last=drop_last)
        out[f"{shuffle}-{drop_last}"] = {
            "epochs": _two_epochs(loader, loader.sampler),
            "plain": _two_epochs(plain, plain_sampler),
            "batches": batch_count(loader),
            "sampler": _sampler_args(loader.sampler),
            "shuffle_option": loader.batch_sampler.sampler is loader.sampler,
            "local_world_size": report.machine.local_world_size,
            "reasons": list(report.reasons),
        }
    # Worker processes that persist across epochs still follow set_epoch.
    loader = tuned_loader(
        dataset,
        batch_size=BATCH,
        shuffle=True,
        time_budget=BUDGET,
        num_workers=1,
        persistent_workers=True,
    )
    plain_sampler = DistributedSampler(dataset, shuffle=True)
    plain = DataLoader(dataset, batch_size=BATCH, sampler=plain_sampler)
    out["workers"] = {
        "epochs": _two_epochs(loader, loader.sampler),
        "plain": _two_epochs(plain, plain_sampler),
        "num_workers": loader.num_workers,
    }
    # The caller's own DistributedSampler is used as given.
    user = DistributedSampler(dataset, shuffle=True, seed=USER_SEED)
    loader = tuned_loader(dataset, batch_size=BATCH, sampler=user, time_budget=BUDGET)
    plain_sampler = DistributedSampler(dataset, shuffle=True, seed=USER_SEED)
    plain = DataLoader(dataset, batch_size=BATCH, sampler=plain_sampler)
    out["user"] = {
        "same_object": loader.sampler is user,
        "epochs": _two_epochs(loader, user),
        "plain": _two_epochs(plain, plain_sampler),
    }
    _, report = tuned_loader_and_report(Stream(), batch_size=4, time_budget=BUDGET, num_workers=0)
    out["iterable_reasons"] = list(report.reasons)
    return out


def _rank(rank, world, port, out_dir):
    # A rank started by multiprocessing inherits its parent's start method (the child's
    # preparation sets it), so its DataLoader workers would not fork and would each
    # re-import torch (5 s apiece measured under spawn on a busy 2-core machine). torchrun
    # starts ranks as fresh programs, whose workers fork on Linux: do the same.
    multiprocessing.set_start_method("fork", force=True)
    # The CPU split must come from the process group here, not from a launcher variable.
    for name in ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        os.environ.pop(name, None)
    torch.set_num_threads(1)
    init_gloo(rank, world, port)
    try:
        results = _rank_results(world, rank)
    finally:
        dist.destroy_process_group()
    save_and_leave(out_dir, rank, results)


@pytest.fixture(scope="module", params=[2, 4], ids=lambda w: f"world{w}")
def ranks(request, tmp_path_factory):
    world = request.param
    out_dir = tmp_path_factory.mktemp(f"world{world}")
    start_ranks(_rank, (world, free_port(), out_dir), world)
    return world, read_ranks(out_dir, world)


@pytest.mark.parametrize(("shuffle", "drop_last"), CASES)
def test_each_rank_reads_its_share_and_nothing_is_lost_or_repeated(ranks, shuffle, drop_last):
    world, results = ranks
    seen = [rank[f"{shuffle}-{drop_last}"]["epochs"][0] for rank in results]
    for r, got in enumerate(seen):
        want = expected_rank(N, world, r, shuffle=shuffle, drop_last=drop_last, batch=BATCH)
        assert got == want, f"rank {r}"
    counts = collections.Counter(i for got in seen for i in got)
    full = order(N, shuffle=shuffle, seed=SEED, epoch=0)
    if drop_last:
        assert max(counts.values()) == 1  # no duplicates
        kept = (N // world) // BATCH * BATCH
        assert sum(counts.values()) == world * kept
        dropped = set(range(N)) - set(counts)
        assert set(full[world * (N // world) :]) <= dropped  # the uneven tail is dropped
        assert len(dropped) == N - world * kept
    else:
        assert set(counts) == set(range(N))  # every index present
        padding = world * math.ceil(N / world) - N
        assert padding > 0
        assert {i for i, c in counts.items() if c > 1} == set(full[:padding])
        assert max(counts.values()) == 2
        assert sum(counts.values()) == N + padding
    # DDP needs every rank to take the same number of steps.
    assert len({rank[f"{shuffle}-{drop_last}"]["batches"] for rank in results}) == 1


@pytest.mark.parametrize(("shuffle", "drop_last"), CASES)
def test_each_rank_matches_a_plain_loader_with_the_same_sampler(ranks, shuffle, drop_last):
    world, results = ranks
    for r, rank in enumerate(results):
        case = rank[f"{shuffle}-{drop_last}"]
        assert case["epochs"] == case["plain"], f"rank {r}"
        assert case["sampler"] == {
            "type": "DistributedSampler",
            "num_replicas": world,
            "rank": r,
            "shuffle": shuffle,
            "seed": SEED,
            "drop_last": drop_last,
            "epoch": 1,  # set_epoch(1) reached the loader's sampler
        }
        assert case["shuffle_option"]  # the sampler orders the batches, no RandomSampler
        assert case["local_world_size"] == world  # workers tuned for this rank's CPU share
        assert any("DistributedSampler(shuffle=" in reason for reason in case["reasons"])


@pytest.mark.parametrize("shuffle", [False, True])
def test_set_epoch_reshuffles(ranks, shuffle):
    world, results = ranks
    for r, rank in enumerate(results):
        first, second = rank[f"{shuffle}-False"]["epochs"]
        assert second == expected_rank(
            N, world, r, shuffle=shuffle, drop_last=False, batch=BATCH, epoch=1
        )
        if shuffle:
            assert first != second, f"rank {r}"
        else:
            assert first == second, f"rank {r}"


def test_persistent_workers_follow_set_epoch(ranks):
    world, results = ranks
    for r, rank in enumerate(results):
        case = rank["workers"]
        assert case["num_workers"] == 1
        assert case["epochs"] == case["plain"]
        assert case["epochs"][0] != case["epochs"][1]
        assert case["epochs"][0] == expected_rank(
            N, world, r, shuffle=True, drop_last=False, batch=BATCH
        )


def test_the_users_distributed_sampler_is_respected(ranks):
    world, results = ranks
    for r, rank in enumerate(results):
        case = rank["user"]
        assert case["same_object"]
        assert case["epochs"] == case["plain"]
        want = expected_rank(
            N, world, r, shuffle=True, drop_last=False, batch=BATCH, seed=USER_SEED
        )
        assert case["epochs"][0] == want


def test_an_iterable_dataset_is_left_to_split_itself(ranks):
    _, results = ranks
    for rank in results:
        assert any("IterableDataset takes no sampler" in r for r in rank["iterable_reasons"])


# --- every rank simulated in this process (the rank is all the logic reads) -------------


def _as_rank(world, rank):
    return mock.patch.object(_loaders_dist, "current_ranks", return_value=Ranks(world, rank))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 30),
    world=st.integers(1, 5),
    batch=st.integers(1, 5),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
)
def test_simulated_ranks_follow_the_rule(n, world, batch, shuffle, drop_last):
    if drop_last and n < world:
        n = world  # DistributedSampler(drop_last=True) needs a sample per rank
    per_rank = []
    for r in range(world):
        with _as_rank(world, r):
            loader = tuned_loader(
                RangeData(n),
                batch_size=batch,
                shuffle=shuffle,
                drop_last=drop_last,
                time_budget=0.1,
                num_workers=0,
            )
        per_rank.append(indices(loader))
        want = expected_rank(n, world, r, shuffle=shuffle, drop_last=drop_last, batch=batch)
        assert per_rank[-1] == want
    counts = collections.Counter(i for got in per_rank for i in got)
    if drop_last:
        assert max(counts.values(), default=1) == 1
    else:
        assert set(counts) == set(range(n))


def test_probe_measures_on_its_own_sampler():
    with _as_rank(2, 1):
        plan = shard(RangeData(N), shuffle=True, kwargs={"drop_last": False})
    probe = plan.kwargs["sampler"]
    final = plan.final_kwargs(RangeData(N))["sampler"]
    assert final is not probe
    assert (
        list(final)
        == list(probe)
        == expected_rank(N, 2, 1, shuffle=True, drop_last=False, batch=BATCH)
    )


def test_not_distributed_is_unchanged():
    assert current_ranks() is None
    kwargs = {"drop_last": True, "generator": torch.Generator()}
    plan = shard(RangeData(N), shuffle=True, kwargs=kwargs)
    assert plan.kwargs is kwargs
    assert (plan.shuffle, plan.ranks, plan.sampler_args, plan.notes) == (True, None, None, ())
    loader, report = tuned_loader_and_report(
        RangeData(N), batch_size=BATCH, shuffle=True, time_budget=BUDGET, num_workers=0
    )
    assert type(loader.sampler) is RandomSampler
    assert not any("torch.distributed" in reason for reason in report.reasons)
    torch.manual_seed(5)
    got = indices(loader)
    torch.manual_seed(5)
    assert got == indices(DataLoader(RangeData(N), batch_size=BATCH, shuffle=True))


@pytest.mark.parametrize(
    ("sampler", "match"),
    [
        (
            DistributedSampler(range(N), num_replicas=2, rank=0),
            (
                r"sampler=DistributedSampler\(\.\.\.\).*mutually exclusive.*"
                r"DistributedSampler\(dataset, shuffle=True\) and drop shuffle=True"
            ),
        ),
        (SequentialSampler(range(N)), r"sampler=SequentialSampler.*drop shuffle=True"),
    ],
)
def test_shuffle_with_a_sampler_is_a_clear_error(sampler, match):
    with pytest.raises(ValueError, match=match):
        tuned_loader(RangeData(N), batch_size=BATCH, shuffle=True, sampler=sampler)
    check_shuffle_with_sampler(shuffle=False, kwargs={"sampler": sampler})  # no error


def test_given_samplers_are_kept_and_noted():
    sequential = SequentialSampler(range(N))
    with _as_rank(2, 0):
        loader, report = tuned_loader_and_report(
            RangeData(N), batch_size=BATCH, sampler=sequential, time_budget=BUDGET, num_workers=0
        )
        batches = BatchSampler(SequentialSampler(range(N)), BATCH, drop_last=False)
        by_batch = tuned_loader(
            RangeData(N), batch_size=None, batch_sampler=batches, time_budget=BUDGET, num_workers=0
        )
    assert loader.sampler is sequential
    assert indices(loader) == list(range(N))  # every rank reads all: the caller's choice
    assert any("SequentialSampler was kept as given" in r for r in report.reasons)
    assert by_batch.batch_sampler is batches


def test_generator_seeds_workers_only_under_distributed():
    with _as_rank(2, 0):
        plan = shard(RangeData(N), shuffle=True, kwargs={"generator": torch.Generator()})
    assert any("seeds the workers only" in note for note in plan.notes)
    assert plan.sampler_args["seed"] == SEED


def test_a_dataset_without_len_gets_a_clear_error():
    with _as_rank(2, 0), pytest.raises(TypeError, match=r"NoLen has no __len__.*sampler="):
        shard(NoLen(), shuffle=False, kwargs={})
