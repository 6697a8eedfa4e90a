"""The search behind `tuned_loader`.

Measure the default, predict a worker count from the CPU the loading uses, climb a
ladder of worker counts around it, then try a deeper prefetch: a handful of trials
instead of a grid, all inside one time budget.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from torchfit.loaders.choice import TIE, fastest_fewest, in_words, persistence
from torchfit.loaders.hazards import duplicated_across_workers, python_object_warnings, shm_message
from torchfit.loaders.machine import shm_worker_limit
from torchfit.loaders.probe import (
    IndexStream,
    StreamSampler,
    WorkerSeeder,
    quiet_worker_count,
    run_trial,
)
from torchfit.loaders.report import LoaderConfig, LoaderTrial, Outcome, Setup, plural

__all__ = ["search"]

#: The most workers the search considers without a caller's max_workers.
MAX_WORKERS = 64
#: The first worker trial uses at most this many workers per CPU, however little CPU
#: loading takes: start-up grows with the count, and the climb doubles from there.
FIRST_PER_CPU = 4
#: A step up must beat the current best by 3%: run-to-run noise of a loader on a busy
#: machine is a few percent.
GAIN = 1.03
#: Share of the budget the main-process baseline may take.
BASELINE_SHARE = 0.15
#: Below this CPU need per loading process, loading mostly waits (I/O).
IO_BOUND_LOAD = 0.75
#: Start-up per worker assumed before a worker trial has measured one (fork on Linux
#: takes tens of milliseconds per worker; spawn much longer, and is then measured).
_STARTUP_GUESS_S = 0.03


class _Search:
    def __init__(self, setup: Setup, start: float) -> None:
        self.s = setup
        self.deadline = start + setup.time_budget
        self.start = start
        self.reference: DataLoader[Any] = DataLoader(setup.dataset, **setup.loader_kwargs)
        self.iterable = isinstance(setup.dataset, IterableDataset)
        ref = self.reference
        self.stream = None
        if not self.iterable:
            self.stream = IndexStream(
                ref.sampler if ref.batch_sampler is None else ref.batch_sampler
            )
        self.epoch_batches: int | None = None
        if not self.iterable:
            try:
                self.epoch_batches = len(ref)
            except TypeError:  # a sampler without __len__
                self.epoch_batches = None
        self.default_len = ref.batch_size or 1
        # Without a batch size or a batch sampler, DataLoader yields single samples.
        self.batched = ref.batch_size is not None or ref.batch_sampler is not None
        self.trials: list[LoaderTrial] = []
        self.reasons: list[str] = []
        self.warnings: list[str] = []
        self.t_batch = 0.0
        self.cpu_load: float | None = None
        self.batch_bytes: int | None = None
        self.startup = _STARTUP_GUESS_S
        self.shutdown = 0.0  # the longest worker shutdown seen, seconds
        self.planned = 5
        self.cap = 0

    # -- trials ---------------------------------------------------------------------
    def _loader(self, cfg: LoaderConfig) -> DataLoader[Any]:
        user = self.s.loader_kwargs
        kw: dict[str, Any] = {k: user[k] for k in ("collate_fn", "in_order") if k in user}
        kw.update(cfg.kwargs(), worker_init_fn=WorkerSeeder(user.get("worker_init_fn")))
        if cfg.num_workers:
            kw["multiprocessing_context"] = self.s.context
            kw["timeout"] = max(0.5, self.deadline - time.perf_counter())
        if self.stream is None:
            kw.update(batch_size=user.get("batch_size"), drop_last=user.get("drop_last", False))
            return DataLoader(self.s.dataset, **kw)
        if self.reference.batch_sampler is not None:
            return DataLoader(self.s.dataset, batch_sampler=StreamSampler(self.stream), **kw)
        return DataLoader(self.s.dataset, batch_size=None, sampler=StreamSampler(self.stream), **kw)

    def _measure(
        self, cfg: LoaderConfig, why: str, *, window_end: float, hard_end: float
    ) -> LoaderTrial:
        with quiet_worker_count():
            loader = self._loader(cfg)
        result = run_trial(
            loader,
            window_end=window_end,
            hard_end=hard_end,
            default_len=self.default_len,
            batched=self.batched,
            # The later half of the timed batches must come after the burst of the
            # batches in flight (workers x prefetch) has drained.
            min_batches=max(4, 2 * cfg.num_workers * (cfg.prefetch_factor or 1)),
        )
        trial = LoaderTrial(
            config=cfg,
            samples_per_s=result.samples_per_s,
            startup_s=result.startup_s,
            batches=result.batches,
            seconds=result.seconds,
            why=why,
            error=result.error,
        )
        self.trials.append(trial)
        if cfg.num_workers and not result.error:
            self.startup = max(self.startup, result.startup_s / cfg.num_workers)
            self.shutdown = max(self.shutdown, result.shutdown_s)
        if self.batch_bytes is None:
            self.batch_bytes = result.batch_bytes
        if cfg.num_workers == 0 and result.cpu_load is not None:
            # Above 1 only intra-op threads of the main process; a worker runs one thread.
            self.cpu_load = min(result.cpu_load, 1.0)
        return trial

    def _load(self) -> float:
        return min(max(self.cpu_load or 1.0, 0.02), 1.0)

    def _try(self, workers: int, prefetch: int, why: str) -> float | None:
        """Measure one worker configuration if the budget allows; None: stop climbing."""
        busy = max(1.0, workers * self._load() / self.s.machine.cpus)
        # Shutdown waits for each worker's batch in progress.
        reserve = max(self.t_batch * busy, self.shutdown)
        now = time.perf_counter()
        remaining = self.deadline - now - reserve
        rate_batches = min(workers, self.s.machine.cpus / self._load()) / max(self.t_batch, 1e-6)
        need = self.startup * workers + (workers + 2 * workers * prefetch + 4) / rate_batches
        if remaining < need:
            self.reasons.append(
                f"{plural(workers, 'worker')} (prefetch {prefetch}) not tried: "
                f"{max(remaining, 0):.2f} s of budget left, a trial needs about {need:.2f} s"
            )
            return None
        window = max(need, remaining / max(2, self.planned))
        self.planned = max(2, self.planned - 1)
        pin = self.s.fixed.get("pin_memory", self.s.pin)
        cfg = LoaderConfig(num_workers=workers, prefetch_factor=prefetch, pin_memory=pin)
        trial = self._measure(
            cfg, why, window_end=now + min(window, remaining), hard_end=now + remaining
        )
        return None if trial.error else trial.samples_per_s

    # -- limits ---------------------------------------------------------------------
    def _limit_workers(self) -> int:
        cpus, load = self.s.machine.cpus, self._load()
        if self.s.max_workers is not None:
            cap = self.s.max_workers
            self.reasons.append(f"max_workers={cap} set by the caller")
        else:
            cap = min(MAX_WORKERS, max(cpus, math.ceil(1.5 * cpus / load)))
            self.reasons.append(
                f"a loading process needs {load:.2f} CPU, so {cpus} CPU(s) can feed "
                f"about {cpus / load:.1f} processes: search up to {cap} workers"
            )
        if self.epoch_batches is not None and self.epoch_batches < cap:
            cap = self.epoch_batches
            self.reasons.append(f"an epoch has only {cap} batches: at most {cap} workers")
        if self.iterable and self.s.loader_kwargs.get("drop_last") and cap > 1:
            cap = 1
            self.reasons.append(
                "IterableDataset with drop_last=True: each worker would drop its own last "
                "partial batch, losing samples a plain loader keeps; at most 1 worker "
                "(pass drop_last=False to allow more)"
            )
        if self.iterable and cap >= 2 and self._duplicates():
            cap = 1
        return min(cap, self._shm_limit(cap, prefetch=self.s.fixed.get("prefetch_factor", 2)))

    def _duplicates(self) -> bool:
        remaining = self.deadline - time.perf_counter()
        found = duplicated_across_workers(
            self.s.dataset,
            samples=3,
            timeout=max(0.5, 0.25 * remaining),
            context=self.s.context,
        )
        if found:
            self.warnings.append(
                f"{type(self.s.dataset).__name__} is an IterableDataset that does not shard "
                "itself across workers: two workers yielded the same samples, so N workers "
                "would repeat every sample N times. Split the stream in __iter__ with "
                "torch.utils.data.get_worker_info() (see the IterableDataset docs); "
                "until then torchfit uses at most 1 worker"
            )
        return found

    def _shm_limit(self, workers: int, *, prefetch: int) -> int:
        share = self.s.machine.shm_share_bytes
        allowed = shm_worker_limit(share, prefetch=prefetch, batch_bytes=self.batch_bytes)
        if allowed is None or share is None or not self.batch_bytes or workers == 0:
            return workers
        if allowed < workers:
            self.warnings.append(shm_message(workers, prefetch, self.batch_bytes, share, allowed))
        return allowed

    # -- the search -----------------------------------------------------------------
    def _climb(self) -> None:
        """Double from a predicted start while it pays, else halve; then refine once."""
        cpus, load = self.s.machine.cpus, self._load()
        prefetch = self.s.fixed.get("prefetch_factor", 2)
        rates: dict[int, float] = {}

        def measure(workers: int, why: str) -> float | None:
            rate = self._try(workers, prefetch, why)
            if rate is not None:
                rates[workers] = rate
            return rate

        predicted = cpus / load
        start = max(1, min(self.cap, FIRST_PER_CPU * cpus, 2 ** round(math.log2(predicted))))
        why = f"predicted: {cpus} CPU(s) / {load:.2f} CPU per loading process"
        if measure(start, why) is None:
            return
        best = workers = start
        while workers < self.cap:
            upper = min(2 * workers, self.cap)
            rate = measure(upper, f"double {workers}")
            if rate is None or rate <= GAIN * rates[best]:
                break
            best = workers = upper
        workers = best
        while best == start and workers > 1:
            rate = measure(workers // 2, f"halve {workers}")
            if rate is None or rate < TIE * rates[best]:
                break
            workers //= 2
            best = workers if rate > rates[best] else best
        self._refine(rates, best, measure)

    @staticmethod
    def _refine(
        rates: dict[int, float], best: int, measure: Callable[[int, str], float | None]
    ) -> None:
        """Look once between the best and each measured neighbour, faster neighbour first.

        Doubling brackets the peak within (best / 2, best * 2).
        """
        above = min((k for k in rates if k > best), default=None)
        below = max((k for k in rates if k < best), default=None)
        sides = sorted((k for k in (above, below) if k is not None), key=lambda k: -rates[k])
        for side in sides:
            middle = (best + side) // 2
            fresh = middle not in rates and middle not in {best, side}
            if (
                fresh
                and measure(middle, f"between {min(best, side)} and {max(best, side)}") is None
            ):
                break

    def _eligible(self, trial: LoaderTrial) -> bool:
        needs_workers = "prefetch_factor" in self.s.fixed or self.s.fixed.get("persistent_workers")
        ok = not trial.error and trial.samples_per_s > 0
        return ok and (trial.config.num_workers > 0 or not needs_workers)

    def run(self) -> Outcome:
        fixed = self.s.fixed
        workers = fixed.get("num_workers", 0)
        prefetch = fixed.get("prefetch_factor", 2) if workers else None
        pin = fixed.get("pin_memory", self.s.pin)
        base = LoaderConfig(num_workers=workers, prefetch_factor=prefetch, pin_memory=pin)
        why = "fixed by the caller" if workers else "the default DataLoader(num_workers=0)"
        budget = self.s.time_budget
        window, hard = (
            self.start + BASELINE_SHARE * budget,
            self.start + 2 * BASELINE_SHARE * budget,
        )
        first = self._measure(base, why, window_end=window, hard_end=hard)
        self.t_batch = self.default_len / first.samples_per_s if first.samples_per_s else 0.0
        if self.batch_bytes is None:
            self.reasons.append("the dataset yielded no batch: nothing to measure")
        elif "num_workers" in fixed:
            self.cap = workers
            self._shm_limit(workers, prefetch=prefetch or 2)
        else:
            self.cap = self._limit_workers()
            if self.cap >= 1:
                self._climb()
        return self._finish(first)

    def _finish(self, first: LoaderTrial) -> Outcome:
        self._warn_failures()
        pick = self._pick()
        if pick is None:
            return self._outcome(first, first.config, None)
        workers = pick.config.num_workers
        if workers and "prefetch_factor" not in self.s.fixed and self._fits_shm(workers, 4):
            self._try(workers, 4, f"deeper prefetch at {workers} workers")
            pick = self._pick() or pick
        top = max(trial.samples_per_s for trial in self.trials)
        cfg = pick.config
        self.reasons.insert(
            0,
            f"{in_words(cfg)} measured {pick.samples_per_s:,.0f} samples/s; the best of "
            f"{len(self.trials)} trials was {top:,.0f} (fewest workers within "
            f"{1 - TIE:.0%} of the best wins)",
        )
        return self._outcome(first, cfg, pick)

    def _warn_failures(self) -> None:
        """A worker configuration that broke (not one the budget cut short) is news."""
        broken = [
            trial
            for trial in self.trials
            if trial.error
            and not trial.error.startswith("inconclusive")
            and "timed out" not in trial.error
        ]
        if broken:
            self.warnings.append(
                f"{plural(broken[0].config.num_workers, 'worker')} failed: {broken[0].error}. "
                "A worker gets a copy of the dataset (pickled under spawn/forkserver) and runs "
                "__getitem__/__iter__ there; torchfit kept to configurations that worked"
            )

    def _pick(self) -> LoaderTrial | None:
        return fastest_fewest([trial for trial in self.trials if self._eligible(trial)])

    def _fits_shm(self, workers: int, prefetch: int) -> bool:
        share = self.s.machine.shm_share_bytes
        limit = shm_worker_limit(share, prefetch=prefetch, batch_bytes=self.batch_bytes)
        return limit is None or workers <= limit

    def _outcome(self, first: LoaderTrial, cfg: LoaderConfig, pick: LoaderTrial | None) -> Outcome:
        cfg = self._persistence(cfg, pick)
        self._explain(cfg)
        return Outcome(
            config=cfg,
            trials=tuple(self.trials),
            baseline_samples_per_s=first.samples_per_s
            if "num_workers" not in self.s.fixed
            else None,
            chosen_samples_per_s=None if pick is None else pick.samples_per_s,
            batch_bytes=self.batch_bytes,
            cpu_load=self.cpu_load,
            max_workers=self.cap,
            reasons=tuple(self.reasons),
            warnings=tuple(self.warnings),
        )

    def _persistence(self, cfg: LoaderConfig, pick: LoaderTrial | None) -> LoaderConfig:
        if "persistent_workers" in self.s.fixed:
            return dataclasses.replace(cfg, persistent_workers=self.s.fixed["persistent_workers"])
        if not cfg.num_workers or pick is None:
            return cfg
        if self.epoch_batches is None or not pick.samples_per_s:
            self.reasons.append("persistent_workers on: the epoch length is unknown")
            return dataclasses.replace(cfg, persistent_workers=True)
        epoch_s = self.epoch_batches * self.default_len / pick.samples_per_s
        keep, reason = persistence(pick.startup_s, epoch_s)
        self.reasons.append(reason)
        return dataclasses.replace(cfg, persistent_workers=keep)

    def _explain(self, cfg: LoaderConfig) -> None:
        if "pin_memory" not in self.s.fixed:
            self.reasons.append(
                "pin_memory on: batches go to a CUDA device"
                if cfg.pin_memory
                else "pin_memory off: no CUDA device receives the batches"
            )
        if cfg.num_workers > self.s.machine.affinity_cpus and self._load() >= IO_BOUND_LOAD:
            self.reasons.append(
                f"{cfg.num_workers} workers exceed the {self.s.machine.affinity_cpus} CPUs yet "
                "measured fastest (other programs share these CPUs, or the CPU figure is "
                "noisy); torch will warn that this is more workers than it suggests"
            )
        elif cfg.num_workers > self.s.machine.affinity_cpus:
            self.reasons.append(
                f"{cfg.num_workers} workers exceed the {self.s.machine.affinity_cpus} CPUs: "
                f"a loading process needs only {self._load():.2f} CPU (it waits on I/O), so "
                "more processes overlap the waits; torch will warn that this is more workers "
                "than it suggests"
            )
        if cfg.num_workers:
            self.warnings += python_object_warnings(self.s.dataset, cfg.num_workers)


def search(setup: Setup, *, start: float) -> Outcome:
    """Run the search that ``setup`` describes; ``start`` is a ``time.perf_counter()`` value."""
    return _Search(setup, start).run()
