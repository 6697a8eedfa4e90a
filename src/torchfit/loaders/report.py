"""Result types of `torchfit.loaders`.

A loader configuration, the probe's trials, the tuning report, and the input-bound
diagnosis.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from torchfit._core import checks
from torchfit._core.units import format_bytes
from torchfit.loaders.machine import MachineBudget

__all__ = [
    "Bound",
    "Diagnosis",
    "LoaderConfig",
    "LoaderReport",
    "LoaderTrial",
    "Outcome",
    "Setup",
    "plural",
]

#: The knobs `tuned_loader` chooses; passing one of them fixes it.
TUNED_KNOBS = ("num_workers", "prefetch_factor", "pin_memory", "persistent_workers")


@dataclasses.dataclass(frozen=True)
class LoaderConfig:
    """The DataLoader settings torchfit tunes.

    Attributes:
        num_workers: Worker processes (0: load in the main process).
        prefetch_factor: Batches each worker loads ahead; ``None`` when ``num_workers`` is 0.
        pin_memory: Copy batches into page-locked memory (only for a CUDA destination).
        persistent_workers: Keep the workers alive between epochs.

    Example:
        >>> LoaderConfig(num_workers=2, prefetch_factor=4).kwargs()["prefetch_factor"]
        4
        >>> LoaderConfig(num_workers=-1)
        Traceback (most recent call last):
        ...
        ValueError: LoaderConfig.num_workers must be a whole number >= 0; got -1
    """

    num_workers: int = 0
    prefetch_factor: int | None = None
    pin_memory: bool = False
    persistent_workers: bool = False

    def __post_init__(self) -> None:
        """Refuse knob values a DataLoader would refuse, with the value in the message."""
        checks.fields(self, prefetch_factor=checks.whole(at_least=1))  # all fields
        if isinstance(self.num_workers, bool) or not isinstance(self.num_workers, int):
            raise TypeError(f"num_workers must be an int >= 0; got {self.num_workers!r}")
        if self.num_workers < 0:
            raise ValueError(f"num_workers must be an int >= 0; got {self.num_workers}")
        if self.num_workers == 0 and self.prefetch_factor is not None:
            raise ValueError(
                f"prefetch_factor={self.prefetch_factor} needs num_workers > 0; use None"
            )
        if self.num_workers == 0 and self.persistent_workers:
            raise ValueError("persistent_workers=True needs num_workers > 0")

    def kwargs(self) -> dict[str, Any]:
        """The settings as ``DataLoader`` keyword arguments."""
        return dataclasses.asdict(self)

    def label(self) -> str:
        """A short description: ``"2 workers, prefetch 2, pin no, persistent yes"``."""
        if self.num_workers == 0:
            text = "0 workers (main process)"
        else:
            text = f"{plural(self.num_workers, 'worker')}, prefetch {self.prefetch_factor}"
            text += f", persistent {'yes' if self.persistent_workers else 'no'}"
        return f"{text}, pin {'yes' if self.pin_memory else 'no'}"


@dataclasses.dataclass(frozen=True)
class LoaderTrial:
    """One configuration the probe measured.

    Attributes:
        config: What was run (``persistent_workers`` is decided afterwards).
        samples_per_s: Steady-state samples per second after the warm-up batches; 0.0
            when the trial failed.
        startup_s: Seconds from ``iter(loader)`` to the first batch (worker start-up).
        batches: Batches timed for `samples_per_s`.
        seconds: Wall time of the whole trial, start-up and shutdown included.
        why: Why the search tried this configuration.
        error: Why the trial failed (``""`` when it did not).
    """

    config: LoaderConfig
    samples_per_s: float
    startup_s: float
    batches: int
    seconds: float
    why: str
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain Python values."""
        return dataclasses.asdict(self)


def plural(count: int, noun: str) -> str:
    """``"1 worker"``, ``"2 workers"``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _times(factor: float) -> str:
    return "more than 100x" if factor > 100 else f"{factor:.1f}x"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


@dataclasses.dataclass(frozen=True)
class LoaderReport:
    """What `tuned_loader_and_report` tried, what it chose and why.

    Attributes:
        chosen: The configuration of the returned DataLoader.
        trials: Every configuration measured, in the order tried.
        baseline_samples_per_s: Samples/s of ``DataLoader(num_workers=0)`` (the default),
            ``None`` when the user fixed the worker count.
        chosen_samples_per_s: Samples/s measured for the chosen configuration.
        tuning_seconds: Wall time of the whole tuning, probe and checks included.
        time_budget: The budget it was given, in seconds.
        machine: CPUs, local ranks and ``/dev/shm`` the search respected.
        batch_bytes: Tensor bytes in one batch (what each batch in flight holds in shm).
        cpu_load: CPUs one loading process needs: CPU time over wall time in the
            main-process baseline, less the time it waited for a CPU other programs held
            (Linux), at most 1.0 (a worker runs one thread). 1.0 is compute-bound; near 0
            waits on I/O and gains from more workers than CPUs.
        max_workers: The most workers the search allowed (`reasons` say what capped it).
        fixed: The knobs the caller set, which were not tuned.
        reasons: Why the chosen configuration won, in words.
        warnings: Problems found (shm, Python objects copied into workers, duplicates).
        batch_size: The loader's samples per batch (None with a ``batch_sampler``): with
            ``batch_bytes``, the bytes of one sample.
    """

    chosen: LoaderConfig
    trials: tuple[LoaderTrial, ...]
    baseline_samples_per_s: float | None
    chosen_samples_per_s: float | None
    tuning_seconds: float
    time_budget: float
    machine: MachineBudget
    batch_bytes: int | None
    cpu_load: float | None
    max_workers: int
    fixed: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    batch_size: int | None = None

    @property
    def speedup(self) -> float | None:
        """Chosen over baseline samples/s, when both were measured."""
        if not self.baseline_samples_per_s or self.chosen_samples_per_s is None:
            return None
        return self.chosen_samples_per_s / self.baseline_samples_per_s

    def to_dict(self) -> dict[str, Any]:
        """Every field, plus ``speedup``, as plain Python values."""
        data = dataclasses.asdict(self)
        data["trials"] = [trial.to_dict() for trial in self.trials]
        data["fixed"], data["reasons"] = list(self.fixed), list(self.reasons)
        data["warnings"] = list(self.warnings)
        data["speedup"] = self.speedup
        return data

    def __str__(self) -> str:
        """The choice, the trials as a table (samples/s per configuration), the reasons."""
        lines = [f"tuned DataLoader: {self.chosen.label()}"]
        if self.chosen_samples_per_s is not None:
            line = f"  {_rate(self.chosen_samples_per_s)} samples/s"
            if self.speedup is not None:
                line += (
                    f" = {self.speedup:.2f}x the default DataLoader(num_workers=0) at "
                    f"{_rate(self.baseline_samples_per_s)} samples/s"
                )
            lines.append(line)
        lines.append(
            f"  tuning took {self.tuning_seconds:.2f} s of a {self.time_budget:g} s budget "
            f"({len(self.trials)} trials)"
        )
        lines.append(f"  machine: {self.machine.describe()}")
        facts = [f"search up to {self.max_workers} workers"]
        if self.batch_bytes is not None:
            facts.append(f"batch {format_bytes(self.batch_bytes)}")
        if self.cpu_load is not None:
            facts.append(f"a loading process needs {self.cpu_load:.2f} CPU")
        if self.fixed:
            facts.append("fixed by caller: " + ", ".join(self.fixed))
        lines.append("  " + "; ".join(facts))
        lines += self._trial_table()
        lines += [f"  why: {reason}" for reason in self.reasons]
        lines += [f"  warning: {warning}" for warning in self.warnings]
        return "\n".join(lines)

    def _trial_table(self) -> list[str]:
        if not self.trials:
            return []
        best = max(trial.samples_per_s for trial in self.trials) or 1.0
        header = (
            f"  {'workers':>7}  {'prefetch':>8}  {'pin':>3}  {'samples/s':>10}  "
            f"{'vs best':>7}  {'start-up':>8}  {'batches':>7}  tried because"
        )
        rows = [header]
        for trial in self.trials:
            cfg = trial.config
            prefetch = "-" if cfg.prefetch_factor is None else str(cfg.prefetch_factor)
            why = f"{trial.why} [failed: {trial.error}]" if trial.error else trial.why
            rows.append(
                f"  {cfg.num_workers:>7}  {prefetch:>8}  {'yes' if cfg.pin_memory else 'no':>3}  "
                f"{_rate(trial.samples_per_s):>10}  {trial.samples_per_s / best:>7.0%}  "
                f"{trial.startup_s:>6.2f} s  {trial.batches:>7}  {why}"
            )
        return rows


@dataclasses.dataclass(frozen=True)
class Setup:
    """What the search gets: the dataset, the caller's arguments, and the limits."""

    dataset: Any
    loader_kwargs: dict[str, Any]  # for DataLoader, tuned knobs and context removed
    context: Any  # the caller's multiprocessing_context (used with workers only)
    fixed: dict[str, Any]  # tuned knobs the caller set
    pin: bool  # pin_memory when not fixed
    time_budget: float
    max_workers: int | None
    machine: MachineBudget


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What the search found."""

    config: LoaderConfig
    trials: tuple[LoaderTrial, ...]
    baseline_samples_per_s: float | None
    chosen_samples_per_s: float | None
    batch_bytes: int | None
    cpu_load: float | None
    max_workers: int
    reasons: tuple[str, ...]
    warnings: tuple[str, ...]


class Bound(enum.StrEnum):
    """What limits a training loop, from `diagnose`."""

    INPUT = "input-bound"
    PARTLY_INPUT = "partly input-bound"
    COMPUTE = "compute-bound"


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """Where the time of a training step goes: waiting for data, or computing.

    Attributes:
        steps: Steps measured (after `warmup`).
        warmup: Steps run first and not counted (worker start-up, lazy init).
        wait_s: Mean seconds per step spent in ``next(iterator)``.
        compute_s: Mean seconds per step spent in the step function.
        startup_s: Seconds until the first batch arrived.
        batch_size: Samples in the measured batches, per step (mean).
        bound: The verdict.
        tuned_speedup: Estimated step-rate gain with the tuned loader, from a tuning run
            (``None`` unless ``diagnose(..., tune=True)``).
        report: That tuning run's report.
    """

    steps: int
    warmup: int
    wait_s: float
    compute_s: float
    startup_s: float
    batch_size: float
    bound: Bound
    tuned_speedup: float | None = None
    report: LoaderReport | None = None

    @property
    def wait_fraction(self) -> float:
        """Share of each step spent waiting for data."""
        total = self.wait_s + self.compute_s
        return self.wait_s / total if total > 0 else 0.0

    @property
    def max_speedup(self) -> float:
        """The step-rate gain if waiting for data vanished: ``1 / (1 - wait_fraction)``."""
        return (self.wait_s + self.compute_s) / self.compute_s if self.compute_s > 0 else 1.0

    @property
    def advice(self) -> str:
        """One sentence: the verdict, the share of waiting, and what to do."""
        share = f"{self.wait_fraction:.0%} of each step waits for data"
        if self.bound is Bound.COMPUTE:
            return f"{self.bound}: only {share}; a faster loader would not help"
        gain = (
            f"tuned_loader would give {self.tuned_speedup:.1f}x"
            if self.tuned_speedup is not None
            else f"removing the wait would give up to {_times(self.max_speedup)}; "
            "try torchfit.loaders.tuned_loader (diagnose(..., tune=True) estimates its gain)"
        )
        return f"{self.bound}: {share}; {gain}"

    def to_dict(self) -> dict[str, Any]:
        """Every field, plus the derived figures and the advice, as plain Python values."""
        data = dataclasses.asdict(self)
        data["bound"] = str(self.bound)
        data["report"] = None if self.report is None else self.report.to_dict()
        data["wait_fraction"] = self.wait_fraction
        data["max_speedup"] = self.max_speedup
        data["advice"] = self.advice
        return data

    def __str__(self) -> str:
        """A small table of the per-step times and the advice."""
        step = self.wait_s + self.compute_s
        computing = 1 - self.wait_fraction
        lines = [
            f"Diagnosis ({self.steps} steps after {self.warmup} warm-up)",
            f"  wait for data  {self.wait_s * 1e3:>10.2f} ms/step  {self.wait_fraction:>5.0%}",
            f"  compute        {self.compute_s * 1e3:>10.2f} ms/step  {computing:>5.0%}",
            f"  step           {step * 1e3:>10.2f} ms/step",
            f"  first batch    {self.startup_s * 1e3:>10.2f} ms",
            f"  {self.advice}",
        ]
        return "\n".join(lines)
