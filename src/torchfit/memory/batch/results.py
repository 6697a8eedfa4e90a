"""What `find_batch_size` returns, and the one test of "was that an out-of-memory error"."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import torch

from torchfit._core import checks
from torchfit._core.units import format_bytes

__all__ = ["BatchSizeResult", "BatchTrial", "TrialOutcome", "is_oom"]

# Messages of out-of-memory errors that arrive as plain RuntimeErrors. Every one that
# accelerate 1.x's should_reduce_batch_size backs off on is here (tests/memory/batch/
# test_oom_messages.py checks each against it), plus cuBLAS's and cuDNN's own.
_OOM_MESSAGES = (
    "out of memory",  # CUDA / HIP / XPU ("CUDA out of memory."), MPS ("MPS backend out of memory")
    "DefaultCPUAllocator: can't allocate memory",  # c10 CPU allocator
    "PT_DEVMEM Allocation failed",  # Intel Gaudi (HPU): "FATAL ERROR :: MODULE:PT_DEVMEM ..."
    "CUBLAS_STATUS_ALLOC_FAILED",  # cuBLAS could not get its workspace / handle
    "CUDNN_STATUS_ALLOC_FAILED",  # cuDNN could not get its workspace
    # cuDNN's "not supported" at large batches is an OOM in disguise; accelerate's
    # should_reduce_batch_size and Lightning's is_oom_error (is_cudnn_snafu) both back off.
    "CUDNN_STATUS_NOT_SUPPORTED",
)


@checks.arguments()
def is_oom(exc: BaseException) -> bool:
    """True when ``exc`` (or the error it was raised from) means memory ran out.

    ``torch.OutOfMemoryError`` (also what `simulate_gpu` raises) and Python's
    ``MemoryError`` always count; a ``RuntimeError`` counts when its message is one of
    the out-of-memory messages of CUDA, HIP, XPU, MPS, HPU (``PT_DEVMEM Allocation
    failed``), cuBLAS, cuDNN (``CUDNN_STATUS_NOT_SUPPORTED`` too) or the CPU allocator.
    An error raised ``from`` an OOM (``raise X from oom``) counts too.

    Example:
        >>> is_oom(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
        True
        >>> is_oom(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried ..."))
        True
        >>> is_oom(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
        False
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, torch.OutOfMemoryError | MemoryError):
            return True
        if isinstance(current, RuntimeError) and any(
            text in str(current) for text in _OOM_MESSAGES
        ):
            return True
        current = current.__cause__
    return False


class TrialOutcome(enum.StrEnum):
    """How one real step of a batch-size probe ended."""

    OK = "ok"
    OOM = "oom"


@dataclasses.dataclass(frozen=True)
class BatchTrial:
    """One real step run by `find_batch_size`.

    Attributes:
        batch_size: The (micro-)batch the step ran with.
        accumulation_steps: Gradient-accumulation steps passed to the step (1 without).
        outcome: `TrialOutcome.OK` or `TrialOutcome.OOM`.
        reason: Why this size was tried: ``"warm-up"``, ``"predicted"``, ``"start"``,
            ``"back-off"`` (after an OOM), ``"refine"`` (closing the gap below a size
            that failed, by the measured line), ``"bisect"`` (between a size that ran
            and one that failed, when the line did not foresee the failure) or
            ``"probe"`` (upward, with ``probe_upward``).
        peak: Peak allocated bytes of the step when measurable (a simulated card or
            CUDA); after an OOM, the bytes held plus the refused request (a lower bound).
        resident: Bytes allocated when the step started, when measurable.
        seconds: Wall time of the step.
        error: The first line of the OOM message (empty when it ran).
    """

    batch_size: int
    accumulation_steps: int
    outcome: TrialOutcome
    reason: str
    peak: int | None
    resident: int | None
    seconds: float
    error: str = ""


@dataclasses.dataclass(frozen=True)
class BatchSizeResult:
    """The batch size `find_batch_size` chose, and the trials that justify it.

    Attributes:
        batch_size: The (micro-)batch size to train with.
        accumulation_steps: Gradient-accumulation steps to keep the effective batch.
        effective_batch_size: ``batch_size * accumulation_steps`` when an effective batch
            was asked for, else ``None``.
        predicted: The batch the prediction gave before any step (``None`` without one).
        budget: Budget in bytes (``None`` when none was given or found).
        usable: Bytes the margin left of the budget (``None`` without a budget).
        trials: Every real step run, in order.
        returned: What the step returned in its run at the largest size that ran (the
            value accelerate's ``find_executable_batch_size`` hands back); ``batch_size``
            is below that size when the margin shrank the answer. It is kept while
            later trials run: return numbers or detached tensors, not a loss whose graph
            holds the activations.
        fitted_from: The batch sizes a callable ``predict`` was evaluated at to fit its
            line: the two smallest it accepted (a model with BatchNorm refuses 1 in
            training). Empty without a callable predictor.

    Example:
        >>> r = BatchSizeResult(
        ...     batch_size=48, accumulation_steps=1, effective_batch_size=None, predicted=48,
        ...     budget=2**30, usable=2**29,
        ...     trials=(BatchTrial(48, 1, TrialOutcome.OK, "predicted", 2**28, 2**20, 0.5),),
        ... )
        >>> r.real_steps, r.ooms
        (1, 0)
    """

    batch_size: int
    accumulation_steps: int
    effective_batch_size: int | None
    predicted: int | None
    budget: int | None
    usable: int | None
    trials: tuple[BatchTrial, ...]
    returned: Any = None
    fitted_from: tuple[int, ...] = ()

    @property
    def ooms(self) -> int:
        """How many trials ran out of memory."""
        return sum(trial.outcome is TrialOutcome.OOM for trial in self.trials)

    @property
    def real_steps(self) -> int:
        """How many real steps the search ran (each trial is one call of the step)."""
        return len(self.trials)

    @property
    def seconds(self) -> float:
        """Wall time of all trials."""
        return sum(trial.seconds for trial in self.trials)

    def to_dict(self) -> dict[str, Any]:
        """Every field, the trials as dicts, plus ``ooms`` and ``real_steps``.

        ``returned`` is left out (it may be anything); read it from the result.
        """
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        del data["returned"]
        data["fitted_from"] = list(self.fitted_from)
        data["trials"] = [
            {**dataclasses.asdict(trial), "outcome": str(trial.outcome)} for trial in self.trials
        ]
        data["ooms"] = self.ooms
        data["real_steps"] = self.real_steps
        return data

    def __str__(self) -> str:
        """The choice, then one row per trial."""
        head = f"batch size {self.batch_size}"
        if self.effective_batch_size is not None:
            head += (
                f" x {self.accumulation_steps} accumulation steps"
                f" = effective {self.effective_batch_size}"
            )
        if self.predicted is not None:
            head += f" (predicted {self.predicted})"
        lines = [f"BatchSizeResult: {head}"]
        if self.fitted_from:
            sizes = " and ".join(map(str, self.fitted_from))
            lines.append(f"  predictor fitted at batch sizes {sizes}")
        if self.budget is not None and self.usable is not None:
            lines.append(
                f"  budget {format_bytes(self.budget)}, usable {format_bytes(self.usable)}"
            )
        lines.append(
            f"  {'#':>2}  {'batch':>6}  {'accum':>5}  {'outcome':<7}  "
            f"{'peak':>12}  {'seconds':>8}  reason"
        )
        for number, trial in enumerate(self.trials, 1):
            peak = "-" if trial.peak is None else format_bytes(trial.peak)
            lines.append(
                f"  {number:>2}  {trial.batch_size:>6}  {trial.accumulation_steps:>5}  "
                f"{trial.outcome:<7}  {peak:>12}  {trial.seconds:>8.3f}  {trial.reason}"
            )
        lines.append(f"  {self.real_steps} real steps, {self.ooms} out of memory")
        if self.returned is not None:
            shown = repr(self.returned)
            lines.append(f"  the step returned {shown if len(shown) <= 60 else shown[:57] + '...'}")
        return "\n".join(lines)
