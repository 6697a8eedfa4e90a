"""Sharding a tuned DataLoader across ``torch.distributed`` ranks.

Under an initialized process group, a map-style dataset without a sampler gets a
``DistributedSampler`` (world size and rank of the default group, the caller's
``shuffle`` and ``drop_last``, seed 0), built exactly as ``DataLoader`` users build it
by hand, so each rank's epoch is the one a plain ``DataLoader`` with that sampler gives.
A sampler or batch sampler the caller passes is kept as given.

The probe never touches the returned loader's sampler: it measures on a twin built with
the same arguments. ``DistributedSampler`` draws its order from ``seed + epoch`` alone
(torch/utils/data/distributed.py, ``__iter__`` seeds a fresh ``torch.Generator``), so the
twin reads the same indices this rank will, and nothing carries over.

The worker count is tuned per rank, with no collective: each rank's samples and their
order are fixed by its sampler whatever the worker count (workers return batches in
sampler order), the CPUs are already divided among the local ranks
(`torchfit.loaders.machine.local_world_size`), and a collective would hang a program
that builds a loader on one rank only (evaluation on rank 0) and would need a device of
the process group's backend (NCCL: CUDA tensors).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch.distributed as dist
from torch.utils.data import DistributedSampler, IterableDataset

__all__ = ["Ranks", "Sharding", "check_shuffle_with_sampler", "current_ranks", "shard"]

#: DistributedSampler's own default seed (torch/utils/data/distributed.py): the same on
#: every rank, which the sampler requires ("should be identical across all processes").
SEED = 0


@dataclasses.dataclass(frozen=True)
class Ranks:
    """World size and rank of this process in the default process group.

    Example:
        >>> Ranks(world_size=4, rank=1)
        Ranks(world_size=4, rank=1)
    """

    world_size: int
    rank: int


def current_ranks() -> Ranks | None:
    """This process's place in an initialized ``torch.distributed`` group, else ``None``.

    Example:
        >>> current_ranks() is None  # no process group in a doctest
        True
    """
    if dist.is_available() and dist.is_initialized():
        return Ranks(world_size=dist.get_world_size(), rank=dist.get_rank())
    return None


def check_shuffle_with_sampler(*, shuffle: bool, kwargs: dict[str, Any]) -> None:
    """Refuse ``shuffle=True`` next to a sampler, saying which one shuffles.

    ``DataLoader`` refuses it too ("mutually exclusive"); this message names the fix.

    Example:
        >>> sampler = DistributedSampler(range(8), num_replicas=2, rank=0)
        >>> check_shuffle_with_sampler(shuffle=True, kwargs={"sampler": sampler})
        Traceback (most recent call last):
        ...
        ValueError: shuffle=True was given with sampler=DistributedSampler(...) ...
    """
    sampler = kwargs.get("sampler")
    if not shuffle or sampler is None:
        return
    name = type(sampler).__name__
    if isinstance(sampler, DistributedSampler):
        fix = (
            "a DistributedSampler shuffles by itself: build it with "
            "DistributedSampler(dataset, shuffle=True) and drop shuffle=True here"
        )
    else:
        fix = "the sampler decides the order: drop shuffle=True, or drop the sampler"
    raise ValueError(
        f"shuffle=True was given with sampler={name}(...), and DataLoader's shuffle and "
        f"sampler options are mutually exclusive; {fix}"
    )


@dataclasses.dataclass(frozen=True)
class Sharding:
    """How `tuned_loader` splits the data across ranks.

    Attributes:
        shuffle: The ``shuffle`` to give ``DataLoader`` (``False`` once a sampler shuffles).
        kwargs: The ``DataLoader`` arguments for the probe (with its own sampler, if any).
        ranks: World size and rank, ``None`` when not distributed.
        sampler_args: Arguments of the ``DistributedSampler`` torchfit built (``None``
            when it built none).
        notes: What was done, for the report's reasons.
    """

    shuffle: bool
    kwargs: dict[str, Any]
    ranks: Ranks | None = None
    sampler_args: dict[str, Any] | None = None
    notes: tuple[str, ...] = ()

    def final_kwargs(self, dataset: Any) -> dict[str, Any]:
        """``{"sampler": ...}`` for the returned loader: a sampler the probe never saw."""
        if self.sampler_args is None:
            return {}
        return {"sampler": DistributedSampler(dataset, **self.sampler_args)}


def shard(
    dataset: Any,
    *,
    shuffle: bool,
    kwargs: dict[str, Any],
    ranks: Ranks | None = None,
) -> Sharding:
    """Add a ``DistributedSampler`` when this process is one rank of several.

    Args:
        dataset: The caller's dataset.
        shuffle: The caller's ``shuffle``.
        kwargs: The caller's other ``DataLoader`` arguments (not changed).
        ranks: World size and rank; ``None`` reads the initialized process group (if any).

    Returns:
        A `Sharding`; without a process group, the arguments unchanged.

    Raises:
        ValueError: ``shuffle=True`` with a sampler.
        TypeError: A map-style dataset without ``__len__`` under ``torch.distributed``.

    Example:
        >>> plan = shard(range(10), shuffle=True, kwargs={"drop_last": True},
        ...              ranks=Ranks(world_size=4, rank=3))
        >>> plan.shuffle, plan.sampler_args
        (False, {'num_replicas': 4, 'rank': 3, 'shuffle': True, 'seed': 0, 'drop_last': True})
        >>> list(plan.kwargs["sampler"])  # a plain DistributedSampler: 2 samples per rank
        [5, 8]
    """
    check_shuffle_with_sampler(shuffle=shuffle, kwargs=kwargs)
    ranks = ranks or current_ranks()
    if ranks is None:
        return Sharding(shuffle=shuffle, kwargs=kwargs)
    where = f"torch.distributed: rank {ranks.rank} of {ranks.world_size}"
    if isinstance(dataset, IterableDataset):
        note = (
            f"{where}; an IterableDataset takes no sampler, so every rank reads what its "
            "__iter__ yields: split the stream by rank there (torch.distributed.get_rank())"
        )
        return Sharding(shuffle=shuffle, kwargs=kwargs, ranks=ranks, notes=(note,))
    given = kwargs.get("sampler") or kwargs.get("batch_sampler")
    if given is not None:
        kind = "sampler" if kwargs.get("sampler") is not None else "batch_sampler"
        note = f"{where}; the {kind} {type(given).__name__} was kept as given"
        if not isinstance(given, DistributedSampler):
            note += ": it decides which samples this rank reads (DistributedSampler splits them)"
        return Sharding(shuffle=shuffle, kwargs=kwargs, ranks=ranks, notes=(note,))
    try:
        len(dataset)
    except TypeError as exc:
        raise TypeError(
            f"{type(dataset).__name__} has no __len__, which DistributedSampler needs to "
            f"split it across {ranks.world_size} ranks; define __len__, or pass your own "
            "sampler= (or an IterableDataset that splits itself by rank)"
        ) from exc
    args: dict[str, Any] = {
        "num_replicas": ranks.world_size,
        "rank": ranks.rank,
        "shuffle": shuffle,
        "seed": SEED,
        "drop_last": bool(kwargs.get("drop_last", False)),
    }
    added = (
        f"{where}; DistributedSampler(shuffle={shuffle}, seed={SEED}, "
        f"drop_last={args['drop_last']}) added: call loader.sampler.set_epoch(epoch) "
        "before each epoch for a new shuffle; pass your own sampler for another split or seed"
    )
    notes = [added]
    if shuffle and kwargs.get("generator") is not None:
        notes.append(
            "the generator seeds the workers only: the order comes from the "
            f"DistributedSampler (seed {SEED} + epoch), the same on every rank"
        )
    probe = {**kwargs, "sampler": DistributedSampler(dataset, **args)}
    return Sharding(shuffle=False, kwargs=probe, ranks=ranks, sampler_args=args, notes=tuple(notes))
