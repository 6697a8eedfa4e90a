"""Argument checks and helpers of `torchfit.loaders` (kept apart to keep it short).

Errors name the value, what was expected, and the fix.
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from torchfit.loaders.probe import WorkerSeeder, batch_len, close_iterator, cuda_initialized

__all__ = [
    "check_dataset",
    "check_int",
    "check_loader",
    "check_loader_kwargs",
    "check_loader_options",
    "kwargs_of",
    "time_steps",
]

#: Keyword arguments of DataLoader that tuned_loader passes through (or tunes).
LOADER_PARAMS = frozenset(inspect.signature(DataLoader.__init__).parameters) - {
    "self",
    "dataset",
    "batch_size",
    "shuffle",
}


def check_int(name: str, value: object, *, low: int, fix: str) -> None:
    """Refuse ``value`` unless it is an int >= ``low``; the message ends with ``fix``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        wrong_type = isinstance(value, bool) or not isinstance(value, int)
        raise (TypeError if wrong_type else ValueError)(
            f"{name} must be an int >= {low}; got {value!r}. {fix}"
        )


def check_dataset(dataset: object) -> None:
    """Refuse anything that is neither a map-style nor an iterable dataset."""
    mapstyle = hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")
    text = isinstance(dataset, str | bytes | bytearray)  # one sample's worth, not a dataset
    if text or (not isinstance(dataset, Dataset | IterableDataset) and not mapstyle):
        raise TypeError(
            f"dataset must be a torch.utils.data.Dataset (or a sequence with __getitem__ and "
            f"__len__) or an IterableDataset; got {type(dataset).__name__}. Wrap your data "
            "in a Dataset class (an IterableDataset whose __iter__ starts a fresh stream)"
        )


def check_loader(loader: object) -> None:
    """Refuse a ``loader`` that does not yield batches (a string or bytes yields characters)."""
    if isinstance(loader, str | bytes | bytearray) or not hasattr(loader, "__iter__"):
        raise TypeError(
            f"loader must be a DataLoader or another iterable of batches; got "
            f"{type(loader).__name__} {loader!r:.60}"
        )


def check_loader_options(*, batch_size: object, shuffle: object, time_budget: object) -> None:
    """Check the arguments every loader call takes: batch size, shuffle, time budget."""
    if batch_size is not None:
        check_int("batch_size", batch_size, low=1, fix="Use None only with a batch_sampler.")
    if not isinstance(shuffle, bool):
        raise TypeError(f"shuffle must be True or False; got {shuffle!r}")
    if (
        isinstance(time_budget, bool)
        or not isinstance(time_budget, int | float)
        or not math.isfinite(time_budget)
        or time_budget <= 0
    ):
        raise ValueError(f"time_budget must be a number of seconds > 0; got {time_budget!r}")


def check_loader_kwargs(kwargs: dict[str, Any], *, batch_size: object) -> None:
    """Refuse unknown DataLoader arguments and badly typed tunable ones."""
    unknown = sorted(set(kwargs) - LOADER_PARAMS)
    if unknown:
        raise TypeError(
            f"unknown DataLoader argument(s) {', '.join(unknown)}; expected some of "
            f"{', '.join(sorted(LOADER_PARAMS))}"
        )
    if batch_size is not None and kwargs.get("batch_sampler") is not None:
        raise ValueError(
            f"batch_size={batch_size} was given with a batch_sampler, which decides the batch "
            "size; pass batch_size=None"
        )
    if "num_workers" in kwargs:
        fix = "Omit it to let torchfit tune it."
        check_int("num_workers", kwargs["num_workers"], low=0, fix=fix)
    if kwargs.get("prefetch_factor") is not None:
        check_int("prefetch_factor", kwargs["prefetch_factor"], low=1, fix="Omit it to tune it.")
    for name in ("pin_memory", "persistent_workers"):
        if name in kwargs and not isinstance(kwargs[name], bool):
            raise TypeError(f"{name} must be True or False; got {kwargs[name]!r}")


def kwargs_of(loader: DataLoader[Any]) -> dict[str, Any]:
    """The arguments that rebuild ``loader``, without the knobs torchfit tunes."""
    kwargs: dict[str, Any] = {
        "collate_fn": loader.collate_fn,
        "generator": loader.generator,
        "timeout": loader.timeout,
        "multiprocessing_context": loader.multiprocessing_context,
    }
    init = loader.worker_init_fn
    kwargs["worker_init_fn"] = init.user_fn if isinstance(init, WorkerSeeder) else init
    if isinstance(loader.dataset, IterableDataset):
        kwargs.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
    elif loader.batch_size is None and loader.batch_sampler is not None:
        kwargs.update(batch_size=None, batch_sampler=loader.batch_sampler)
    else:
        kwargs.update(batch_size=loader.batch_size, sampler=loader.sampler)
        kwargs["drop_last"] = loader.drop_last
    if not getattr(loader, "in_order", True):
        kwargs["in_order"] = False
    return kwargs


def time_steps(
    loader: Iterable[Any], step_fn: Callable[[Any], object], *, steps: int, warmup: int
) -> tuple[list[float], list[float], list[int], float]:
    """Per measured step: seconds waiting, seconds computing, samples; and the first wait."""
    sync = torch.cuda.is_available() and cuda_initialized()
    waits: list[float] = []
    computes: list[float] = []
    sizes: list[int] = []
    startup = 0.0
    it = iter(loader)
    try:
        for index in range(warmup + steps):
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            t1 = time.perf_counter()
            step_fn(batch)
            if sync:
                torch.cuda.synchronize()
            t2 = time.perf_counter()
            startup = startup if index else t1 - t0
            if index >= warmup:
                waits.append(t1 - t0)
                computes.append(t2 - t1)
                sizes.append(batch_len(batch, 1))
    finally:
        # A persistent pool belongs to the loader (it reuses it next epoch): leave it be.
        if not getattr(loader, "persistent_workers", False):
            close_iterator(it)
    if not waits:
        raise ValueError(
            f"the loader ran out before a measured step ({warmup} warm-up steps asked); "
            "lower warmup or give a longer loader"
        )
    return waits, computes, sizes, startup
