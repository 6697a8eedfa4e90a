"""The search behind `find_batch_size`: trials, observations, and the next size to try."""

from __future__ import annotations

import dataclasses
import gc
import math
import time
import traceback
from collections.abc import Callable

import torch

from torchfit.memory.batch.bracket import Bracket
from torchfit.memory.batch.predict import (
    Budget,
    BudgetKind,
    Line,
    Margin,
    Predictor,
    default_budget,
    find_budget,
    resolve_margin,
    solve_predictor,
)
from torchfit.memory.batch.probe import Meter, Snapshot, agree_min, cuda_ready
from torchfit.memory.batch.results import BatchSizeResult, BatchTrial, TrialOutcome, is_oom
from torchfit.memory.batch.simulate import paused
from torchfit.memory.result import AffineEstimate

__all__ = ["DEFAULT_START", "Options", "Search", "split_effective"]

#: First size tried when there is neither a prediction nor ``start`` (accelerate's default).
DEFAULT_START = 128


@dataclasses.dataclass(frozen=True)
class Options:
    """The settings of one `find_batch_size` search, checked on creation."""

    start: int | None
    predict: Predictor | None
    budget: Budget | None
    batch_limit: int | None
    probe_upward: bool
    effective: int | None
    margin: float | Margin | None
    restore: tuple[object, ...]
    warmup: bool | None
    max_trials: int

    def __post_init__(self) -> None:
        """Refuse sizes that are not whole numbers."""
        for name in ("start", "batch_limit", "effective"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError(f"{_LABELS[name]} must be a whole number; got {value!r}")
            if value is not None and value < 1:
                raise ValueError(f"{_LABELS[name]} must be >= 1; got {value}")
        if self.max_trials < 1:
            raise ValueError(f"max_trials must be >= 1; got {self.max_trials}")
        if self.start is not None and self.predict is not None:
            raise ValueError(
                "give either predict= (start at the predicted batch) or start=, not both"
            )
        if self.predict is not None and not (
            isinstance(self.predict, AffineEstimate) or callable(self.predict)
        ):
            raise TypeError(
                "predict must be an AffineEstimate or a callable batch_size -> MemoryEstimate; "
                f"got {type(self.predict).__name__}"
            )
        # A bad budget or margin fails at decoration, not mid-run.
        found = find_budget(self.budget) if self.budget is not None else None
        if self.margin is not None:
            kind = BudgetKind.BYTES if found is None else found.kind
            resolve_margin(self.margin, kind, 0, None if found is None else found.card)


_LABELS = {"start": "start", "batch_limit": "batch_limit", "effective": "effective_batch_size"}


def split_effective(effective: int, cap: int) -> tuple[int, int]:
    """Split an effective batch into (micro-batch <= cap, accumulation steps).

    Exact (``micro * steps == effective``) when a step count up to twice the minimum
    divides it; else the smallest cover above it.
    """
    steps = math.ceil(effective / cap)
    for candidate in range(steps, 2 * steps + 1):
        if effective % candidate == 0:
            return effective // candidate, candidate
    return math.ceil(effective / steps), steps


class Search:
    """One run of the search: trials, observations, and the next size to try."""

    def __init__(self, call: Callable[[int, int], object], options: Options) -> None:
        """Resolve the budget and the prediction before the first trial."""
        self.call = call
        self.opts = options
        found = find_budget(options.budget) if options.budget is not None else default_budget()
        if options.predict is not None and found is None:
            raise ValueError(
                "predict= needs a budget: pass budget= (bytes, '12GB' or a GPU), or run under "
                "simulate_gpu(...) or on a CUDA device"
            )
        self.budget = found.bytes if found else None
        self.usable: int | None = None
        self.line: Line | None = None
        self.predicted: int | None = None
        if found is not None:
            context = 0
            if isinstance(options.predict, AffineEstimate):
                context = options.predict.fixed.context
            margin = resolve_margin(options.margin, found.kind, context, found.card)
            self.usable = margin.usable(found.bytes)
            if options.predict is not None:
                with paused():  # a predictor's work (e.g. a trace) is not the step's memory
                    self.predicted, self.line = solve_predictor(options.predict, self.usable)
        caps = [c for c in (options.batch_limit, options.effective) if c is not None]
        self.next = Bracket(
            usable=self.usable,
            budget=self.budget,
            line=self.line,
            cap=min(caps) if caps else None,
            probe_upward=options.probe_upward,
        )
        self.trials: list[BatchTrial] = []
        self.returned: object = None  # what the step returned at the largest size that ran
        self.meter = Meter()

    # -- one real step --------------------------------------------------------------

    def accumulation(self, batch_size: int) -> int:
        """Micro-batches per step that keep the effective batch at ``batch_size``."""
        effective = self.opts.effective
        return 1 if effective is None else math.ceil(effective / batch_size)

    def trial(
        self,
        batch_size: int,
        reason: str,
        state: Snapshot,
        *,
        accumulation: int,
        keep: bool = False,
    ) -> bool:
        """Run the step once; on OOM free what it held; then restore ``state``.

        A success with ``keep`` (the warm-up) is not restored: its state is the new start.
        """
        resident = self.meter.start()
        started = time.perf_counter()
        error = ""
        failed = False
        value: object = None
        try:
            value = self.call(batch_size, accumulation)
        except Exception as exc:
            if not is_oom(exc):
                raise
            failed = True
            error = (str(exc).splitlines() or [type(exc).__name__])[0]
            # A caught OOM's traceback keeps every frame of the failed step, and so its
            # activations, alive; clear them before anything else is allocated.
            traceback.clear_frames(exc.__traceback__)
        seconds = time.perf_counter() - started
        ok = bool(agree_min(int(not failed)))
        held = self.meter.peak()  # after an OOM: what was held before the refused request
        peak = held if ok else self.meter.demand(error)
        if failed:
            # What the failed step held may sit in reference cycles. A full collection
            # costs ~0.25 s in a process with transformers loaded, so it is skipped only
            # when the meter shows every byte above the trial's start already freed.
            live = self.meter.live()
            if live is None or resident is None or live > resident:
                gc.collect()
            if cuda_ready():
                torch.cuda.empty_cache()
        if not (ok and keep):
            state.restore()
        outcome = TrialOutcome.OK if ok else TrialOutcome.OOM
        self.trials.append(
            BatchTrial(batch_size, accumulation, outcome, reason, peak, resident, seconds, error)
        )
        if ok and reason != "warm-up" and batch_size >= self.next.lo:
            self.returned = value  # only the largest: it stays alive through later trials
        self.next.observe(
            batch_size, ok=ok, peak=peak, held=held, resident=resident,
            fitted=reason != "warm-up",
        )  # fmt: skip
        return ok

    def bisect_trial(self, batch_size: int, state: Snapshot) -> bool | None:
        """One trial of the bisection; None when no trial is left."""
        if len(self.trials) >= self.opts.max_trials:
            return None
        return self.trial(batch_size, "bisect", state, accumulation=self.accumulation(batch_size))

    # -- the whole search ---------------------------------------------------------------

    def run(self) -> BatchSizeResult:
        """Run trials until a size is verified; return the result."""
        first = self.predicted if self.predicted is not None else self.opts.start
        reason = "predicted" if self.predicted is not None else "start"
        size = agree_min(self.next.capped(DEFAULT_START if first is None else max(first, 1)))
        original = Snapshot(self.opts.restore)
        try:
            state = original
            warm = self.opts.warmup
            warm = original.has_fresh_optimizer if warm is None else warm
            if agree_min(int(warm)):
                # The first step creates optimizer state lazily, after the activations are
                # gone; later steps hold it throughout. Probe from the warmed-up state.
                small = min(size, 2)
                if self.trial(small, "warm-up", original, accumulation=1, keep=True):
                    state = Snapshot(self.opts.restore)
                else:
                    self.next.hi, size, reason = small, small - 1, "back-off"
            while size > 0 and len(self.trials) < self.opts.max_trials:
                if self.trial(size, reason, state, accumulation=self.accumulation(size)):
                    size = self.next.after_ok(size)
                    reason = "probe" if self.opts.probe_upward else "refine"
                else:
                    size, reason = self.next.after_oom(size), "back-off"
                size = agree_min(size)
                if self.next.bisecting:
                    self.next.bisect(lambda size: self.bisect_trial(size, state))
            if self.next.lo == 0:
                raise torch.OutOfMemoryError(self._no_fit())
            best = agree_min(self.next.chosen())
        finally:
            original.restore()
        micro, steps = (
            (best, 1) if self.opts.effective is None else split_effective(self.opts.effective, best)
        )
        return BatchSizeResult(
            batch_size=micro,
            accumulation_steps=steps,
            effective_batch_size=None if self.opts.effective is None else micro * steps,
            predicted=self.predicted,
            budget=self.budget,
            usable=self.usable,
            trials=tuple(self.trials),
            returned=self.returned,
            fitted_from=() if self.line is None else self.line.fitted_from,
        )

    def _no_fit(self) -> str:
        tried = ", ".join(f"{t.batch_size} ({t.outcome})" for t in self.trials)
        return (
            "CUDA out of memory. find_batch_size found no batch size that fits "
            f"(tried {tried}); reduce the model's memory (mixed precision, gradient "
            "checkpointing, a smaller optimizer state) or use a larger device"
        )
