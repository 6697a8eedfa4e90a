"""`tuned_loader`, `tuned_loader_and_report`, `check_shm`, `diagnose`: the public side."""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils.data import DataLoader

from torchfit._core import checks
from torchfit._core.hardware import parse_device
from torchfit.loaders.args import (
    check_dataset,
    check_int,
    check_loader,
    check_loader_kwargs,
    check_loader_options,
    kwargs_of,
    time_steps,
)
from torchfit.loaders.dist import shard
from torchfit.loaders.hazards import shm_message
from torchfit.loaders.machine import MachineBudget, machine_budget, shm_worker_limit
from torchfit.loaders.probe import (
    WorkerSeeder,
    find_generators,
    preserved_state,
    quiet_worker_count,
)
from torchfit.loaders.report import (
    TUNED_KNOBS,
    Bound,
    Diagnosis,
    LoaderReport,
    Setup,
)
from torchfit.loaders.search import search

__all__ = ["LoaderWarning", "check_shm", "diagnose", "tuned_loader_and_report", "tuned_loader"]

_log = logging.getLogger("torchfit.loaders")

#: Wait shares that split the `diagnose` verdicts.
_INPUT_BOUND, _PARTLY_INPUT_BOUND = 0.25, 0.05


class LoaderWarning(UserWarning):
    """A DataLoader problem torchfit found.

    ``/dev/shm`` too small for the batches in flight, Python objects copied into every
    worker, an IterableDataset that repeats its samples in every worker.
    """


def _tune(
    dataset: Any,
    *,
    batch_size: int | None,
    shuffle: bool,
    time_budget: float,
    device: torch.device | str | None,
    max_workers: int | None,
    dataloader_kwargs: dict[str, Any],
) -> tuple[DataLoader[Any], LoaderReport]:
    start = time.perf_counter()
    check_dataset(dataset)
    check_loader_options(batch_size=batch_size, shuffle=shuffle, time_budget=time_budget)
    if max_workers is not None:
        check_int("max_workers", max_workers, low=0, fix="Pass None to let torchfit decide.")
    check_loader_kwargs(dataloader_kwargs, batch_size=batch_size)
    sharding = shard(dataset, shuffle=shuffle, kwargs=dataloader_kwargs)
    shuffle, dataloader_kwargs = sharding.shuffle, sharding.kwargs
    # prefetch_factor=None is DataLoader's default ("2 with workers"), not a choice.
    fixed = {
        k: v
        for k, v in dataloader_kwargs.items()
        if k in TUNED_KNOBS and not (k == "prefetch_factor" and v is None)
    }
    user = {k: v for k, v in dataloader_kwargs.items() if k not in TUNED_KNOBS}
    # DataLoader refuses a multiprocessing_context without workers: pass it only with some.
    context = user.pop("multiprocessing_context", None)
    # DataLoader wants its default batch_size=1 next to a batch_sampler.
    by_sampler = batch_size is None and user.get("batch_sampler") is not None
    loader_kwargs: dict[str, Any] = {"batch_size": 1 if by_sampler else batch_size}
    loader_kwargs.update(shuffle=shuffle, **user)
    check = dict(fixed)
    if "num_workers" not in check and (
        check.get("prefetch_factor") or check.get("persistent_workers")
    ):
        check["num_workers"] = 1  # those knobs need workers; the search will provide them
    if context is not None:
        check.setdefault("num_workers", 1)
        check["multiprocessing_context"] = context
    with quiet_worker_count():
        DataLoader(dataset, **loader_kwargs, **check)  # torch's own checks of the combination
    # a CUDA device torch does not see is not an error here: the batches are not pinned
    target = parse_device(device)
    pin = target.type == "cuda" and torch.cuda.is_available()
    machine = machine_budget()
    setup = Setup(
        dataset=dataset,
        loader_kwargs=loader_kwargs,
        context=context,
        fixed=fixed,
        pin=pin,
        time_budget=float(time_budget),
        max_workers=max_workers,
        machine=machine,
    )
    gens = find_generators(user.get("generator"), user.get("sampler"), user.get("batch_sampler"))
    with preserved_state(gens):
        outcome = search(setup, start=start)
    config = outcome.config
    final = {**loader_kwargs, "worker_init_fn": WorkerSeeder(user.get("worker_init_fn"))}
    final.update(sharding.final_kwargs(dataset))  # a sampler the probe never iterated
    if config.num_workers and context is not None:
        final["multiprocessing_context"] = context
    with quiet_worker_count():  # the report explains a count above the CPUs
        loader: DataLoader[Any] = DataLoader(dataset, **final, **config.kwargs())
    notes = [*outcome.reasons, *sharding.notes]
    if target.type == "cuda" and not torch.cuda.is_available():
        notes.append(f"device {target} was named but CUDA is not available: no pinning")
    report = LoaderReport(
        chosen=config,
        trials=outcome.trials,
        baseline_samples_per_s=outcome.baseline_samples_per_s,
        chosen_samples_per_s=outcome.chosen_samples_per_s,
        tuning_seconds=time.perf_counter() - start,
        time_budget=float(time_budget),
        machine=machine,
        batch_bytes=outcome.batch_bytes,
        cpu_load=outcome.cpu_load,
        max_workers=outcome.max_workers,
        fixed=tuple(sorted(fixed)),
        reasons=tuple(notes),
        warnings=outcome.warnings,
        batch_size=None if by_sampler else batch_size,
    )
    _log.info("%s", report)
    return loader, report


@checks.arguments(batch_size=checks.whole(at_least=1), time_budget=checks.number(above=0))
def tuned_loader_and_report(
    dataset: Any,
    *,
    batch_size: int | None,
    shuffle: bool = False,
    time_budget: float = 10.0,
    device: torch.device | str | None = None,
    max_workers: int | None = None,
    **dataloader_kwargs: Any,
) -> tuple[DataLoader[Any], LoaderReport]:
    """Choose DataLoader settings by measurement; return the loader and a report.

    The probe times the default ``DataLoader(num_workers=0)`` in the main process, which
    also measures the CPU a loading process needs (time spent waiting for a CPU other
    programs hold does not count), and predicts the worker count that fills this rank's
    CPUs: 2 for a compute-bound dataset on 2 CPUs, many more for one that waits on I/O.
    It measures that count (at most 4 per CPU at first), doubles it while each doubling
    gains more than 3% (else halves it), then tries once between the best and each
    measured neighbour, and finally ``prefetch_factor=4``: a handful of trials, not a
    grid. The fewest workers (then the smallest prefetch) within 2% of the best measured
    samples/s win. ``persistent_workers`` is set when worker start-up costs 1% of an
    epoch or more (persistent workers keep their copy of the dataset, so changes made to
    it between epochs are not seen: pass ``persistent_workers=False`` if you make any),
    ``pin_memory`` when a CUDA device receives the batches. Each trial measures steady
    state: the batches in flight at start-up are not counted.

    Limits come from the machine: the CPUs of this process (affinity mask and cgroup
    quota, not ``os.cpu_count()``), divided among the ranks of this node
    (``LOCAL_WORLD_SIZE`` or the ``torch.distributed`` world size), and the free space
    of ``/dev/shm`` against workers x prefetch x batch bytes.

    Under an initialized ``torch.distributed`` group, a map-style dataset without a
    sampler gets ``DistributedSampler(dataset, shuffle=shuffle, seed=0,
    drop_last=drop_last)`` over the default group: each rank reads exactly what a plain
    ``DataLoader`` with that sampler yields. Call ``loader.sampler.set_epoch(epoch)``
    before each epoch, as in PyTorch. A sampler or batch sampler you pass is kept (an
    ``IterableDataset`` must split itself by rank). Workers are tuned per rank, in its
    share of the node's CPUs, with no collective call.

    Args:
        dataset: A map-style ``Dataset`` (or a sequence) or an ``IterableDataset``.
        batch_size: Samples per batch; ``None`` with a ``batch_sampler`` (or for
            unbatched samples, as in ``DataLoader``).
        shuffle: Reshuffle every epoch (map-style datasets only). Under
            ``torch.distributed`` the ``DistributedSampler`` shuffles (seed 0 + epoch).
        time_budget: Seconds the tuning may take, all trials and checks included. A
            trial stops between batches, so a single batch slower than the budget
            overruns it.
        device: Where the batches go; ``None`` means CUDA when available, else CPU.
        max_workers: The most worker processes to consider (``None``: from the CPUs and
            how much of one a loading process uses).
        **dataloader_kwargs: Any other ``DataLoader`` argument (``sampler``,
            ``collate_fn``, ``drop_last``, ``generator``, ``worker_init_fn``, ...), all
            honoured. Passing ``num_workers``, ``prefetch_factor``, ``pin_memory`` or
            ``persistent_workers`` fixes that knob. A ``worker_init_fn`` runs after
            torchfit seeds ``random``, ``numpy`` and ``torch`` in the worker.

    Returns:
        ``(loader, report)``: a plain ``DataLoader`` and the `LoaderReport`.

    Raises:
        TypeError: ``dataset`` is not a dataset, or an argument has the wrong type or is
            not a ``DataLoader`` argument.
        ValueError: ``batch_size`` < 1, negative ``num_workers``, a non-positive budget,
            ``shuffle=True`` with a ``sampler``, or a combination ``DataLoader`` refuses.

    Warns:
        LoaderWarning: ``/dev/shm`` too small for the batches in flight; large
            containers of Python objects that every worker copies; an
            ``IterableDataset`` that repeats its samples in every worker.

    Example:
        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> data = TensorDataset(torch.arange(64.0).reshape(32, 2))
        >>> loader, report = tuned_loader_and_report(
        ...     data, batch_size=8, time_budget=0.5, num_workers=0
        ... )
        >>> report.chosen.num_workers, len(loader)
        (0, 4)
        >>> print(str(report).splitlines()[0])
        tuned DataLoader: 0 workers (main process), pin no
    """
    loader, report = _tune(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle,
        time_budget=time_budget,
        device=device,
        max_workers=max_workers,
        dataloader_kwargs=dataloader_kwargs,
    )
    for message in report.warnings:
        warnings.warn(message, LoaderWarning, stacklevel=2)
    return loader, report


@checks.arguments(batch_size=checks.whole(at_least=1), time_budget=checks.number(above=0))
def tuned_loader(
    dataset: Any,
    *,
    batch_size: int | None,
    shuffle: bool = False,
    time_budget: float = 10.0,
    device: torch.device | str | None = None,
    max_workers: int | None = None,
    **dataloader_kwargs: Any,
) -> DataLoader[Any]:
    """A ``DataLoader`` with measured ``num_workers``, ``prefetch_factor``, pinning, persistence.

    `tuned_loader_and_report` takes the same arguments and also returns the `LoaderReport`
    (here it is only logged, at INFO level on the ``torchfit.loaders`` logger).

    Example:
        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> data = TensorDataset(torch.arange(10.0))
        >>> loader = tuned_loader(data, batch_size=4, time_budget=0.5, num_workers=0)
        >>> [batch[0].tolist() for batch in loader]
        [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0], [8.0, 9.0]]
    """
    loader, report = _tune(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle,
        time_budget=time_budget,
        device=device,
        max_workers=max_workers,
        dataloader_kwargs=dataloader_kwargs,
    )
    for message in report.warnings:
        warnings.warn(message, LoaderWarning, stacklevel=2)
    return loader


@checks.arguments(prefetch_factor=checks.whole(at_least=1))
def check_shm(
    *,
    num_workers: int,
    prefetch_factor: int,
    batch_bytes: int,
    machine: MachineBudget | None = None,
) -> str | None:
    """The ``/dev/shm`` warning for a configuration, or ``None`` when its batches fit.

    The rule is `torchfit.loaders.machine.shm_worker_limit`, the one the tuning uses.

    Example:
        >>> budget = MachineBudget(1, 1, None, 1, "test", shm_free_bytes=64 * 2**20)
        >>> check_shm(num_workers=4, prefetch_factor=2, batch_bytes=2**20, machine=budget) is None
        True
        >>> print(check_shm(num_workers=16, prefetch_factor=4, batch_bytes=2**20, machine=budget))
        ... # doctest: +ELLIPSIS
        /dev/shm is too small: 16 workers x prefetch 4 x 1.00 MiB per batch = 64.00 MiB ...
    """
    machine = machine or machine_budget()
    share = machine.shm_share_bytes
    allowed = shm_worker_limit(share, prefetch=prefetch_factor, batch_bytes=batch_bytes)
    if share is None or allowed is None or num_workers <= allowed:
        return None
    return shm_message(num_workers, prefetch_factor, batch_bytes, share, allowed)


@checks.arguments(steps=checks.whole(at_least=1), time_budget=checks.number(above=0))
def diagnose(
    loader: Iterable[Any],
    step_fn: Callable[[Any], object],
    *,
    steps: int = 20,
    warmup: int = 2,
    tune: bool = False,
    time_budget: float = 10.0,
) -> Diagnosis:
    """Run real training steps and measure how much of each waits for data.

    Each step is timed in two parts: ``next(iterator)`` (waiting for data) and
    ``step_fn(batch)`` (computing; CUDA is synchronized after it when in use, so queued
    kernels count as compute). Waiting 25% of a step or more is input-bound, 5-25%
    partly input-bound.

    Args:
        loader: Any iterable of batches (a ``DataLoader`` for ``tune=True``).
        step_fn: One training step on a batch (forward, backward, optimizer step).
        steps: Steps to measure after the warm-up.
        warmup: Steps to run first without counting (worker start-up, lazy init).
        tune: Also tune a loader on the same dataset (`tuned_loader_and_report`) and estimate the
            step-rate gain it gives, assuming loading overlaps compute in workers.
        time_budget: Seconds for that tuning.

    Returns:
        A `Diagnosis`; ``str()`` gives the table and the advice.

    Raises:
        ValueError: ``steps`` < 1, ``warmup`` < 0, or the loader ran out before one
            measured step.
        TypeError: ``step_fn`` is not callable, or ``tune=True`` without a DataLoader.

    Example:
        >>> import time
        >>> slow = (time.sleep(0.002) or [0.0] for _ in range(8))
        >>> result = diagnose(slow, lambda batch: None, steps=5, warmup=1)
        >>> result.bound
        <Bound.INPUT: 'input-bound'>
    """
    check_loader(loader)
    check_int("steps", steps, low=1, fix="Measure at least one step.")
    check_int("warmup", warmup, low=0, fix="Use 0 for no warm-up.")
    if not callable(step_fn):
        raise TypeError(f"step_fn must be a callable taking a batch; got {step_fn!r}")
    if tune and not isinstance(loader, DataLoader):
        raise TypeError(
            f"diagnose(..., tune=True) needs a torch DataLoader; got {type(loader).__name__}"
        )
    waits, computes, sizes, startup = time_steps(loader, step_fn, steps=steps, warmup=warmup)
    wait, compute = sum(waits) / len(waits), sum(computes) / len(computes)
    share = wait / (wait + compute) if wait + compute > 0 else 0.0
    bound = (
        Bound.INPUT
        if share >= _INPUT_BOUND
        else Bound.PARTLY_INPUT
        if share >= _PARTLY_INPUT_BOUND
        else Bound.COMPUTE
    )
    report = speedup = None
    if tune and isinstance(loader, DataLoader):
        _, report = tuned_loader_and_report(
            loader.dataset, time_budget=time_budget, **kwargs_of(loader)
        )
        if report.chosen_samples_per_s:
            fetch = (sum(sizes) / len(sizes)) / report.chosen_samples_per_s
            step = max(compute, fetch) if report.chosen.num_workers else compute + fetch
            speedup = (wait + compute) / step
    return Diagnosis(
        steps=len(waits),
        warmup=warmup,
        wait_s=wait,
        compute_s=compute,
        startup_s=startup,
        batch_size=sum(sizes) / len(sizes),
        bound=bound,
        tuned_speedup=speedup,
        report=report,
    )
