"""Predicted batch sizes: invert ``fixed + batch * per_sample`` within a budget and a margin.

The pure half of `torchfit.memory.batch` (no step is run here).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from torchfit._core import checks
from torchfit._core.bisection import last_true
from torchfit._core.units import format_bytes, parse_bytes
from torchfit.memory.allocator.context import cuda_context_bytes
from torchfit.memory.batch.fit import Line, evaluate, solve_callable
from torchfit.memory.batch.simulate import SimulatedGPU, active_simulator
from torchfit.memory.gpus import GPU
from torchfit.memory.gpus.budget import read_budget
from torchfit.memory.result import AffineEstimate, MemoryEstimate

__all__ = [
    "Budget",
    "BudgetKind",
    "FoundBudget",
    "Line",
    "Margin",
    "Predictor",
    "default_budget",
    "describe_budget",
    "find_budget",
    "max_batch_size",
    "resolve_margin",
    "solve_batch_size",
    "solve_predictor",
]

# Default share of the budget kept free on a real card: what an estimate's allocated peak
# can miss, plus what the caching allocator cannot give back when the card is full.
# Measured on an NVIDIA H200 (torch 2.11; benchmarks/gpu_runs, benchmarks/gpu_report.py):
# the analytic estimate's allocated peak was within -1.9%..+0.3% of max_memory_allocated on
# 24 steps. Under a per-process cap the allocator empties its cache before it fails
# (c10/cuda/CUDACachingAllocator.cpp, release_cached_blocks), but space trapped in
# segments that still hold live blocks stays; the OOM-line check below (the replayed
# step's) covers most of it, not all: a Qwen2.5-0.5B step under a 24 GiB cap ran out at
# batch 5, where the replay's line was 2.3% under the cap. On the nine capped H200 cases a
# 5% margin picked 95-100% of the true largest batch and none past it (4% picked that
# batch 5; the 7% of before left a ResNet-50 at 88 of 94). A step that is not what the
# estimate says (a longer sequence in the data, another process on the card) needs its
# own margin: users report OOMs after tuning without one (Lightning #8028, #9625).
_FRACTION_CARD = 0.05
_FRACTION_SIMULATED = 0.02
# Share of a budget kept free above the allocator's OOM line (`MemoryEstimate.device_needed`)
# as well. The line of a closed form's replayed step schedule follows the allocated peak
# when the allocator reuses the step's logits-sized segments, but can be off by a whole
# segment where a few small blocks land in one (a CPU comparison with the traced step's
# own events: benchmarks/reserved_grid.py): the 5% on the allocated peak covers the
# under-estimates, this check the steps whose replay already says they do not fit (a BERT
# MLM fp16 step under a 10 GiB cap: allocated 9.17 GiB, 91.7%, but an OOM line of 10.63 GiB;
# it ran out of memory on the H200).
_FRACTION_OOM_LINE = 0.02


class BudgetKind(enum.StrEnum):
    """Where a budget came from; it decides the default `Margin`."""

    BYTES = "bytes"  # allocatable bytes the user stated
    GPU = "gpu"  # a card's total memory (the CUDA context comes out of it)
    SIMULATED = "simulated"  # an active simulate_gpu card
    CUDA = "cuda"  # this process's CUDA device: free + reserved bytes


@dataclasses.dataclass(frozen=True)
class Margin:
    """What is kept free of a budget: a share for allocator slack, plus reserved bytes.

    ``usable = budget * (1 - fraction) - reserve``. The default ``fraction`` is 5% on a
    real card (the estimate's measured error and what the caching allocator cannot free
    when the card is full) and 2% on a `simulate_gpu` card (no allocator). ``reserve``
    holds back the CUDA context when the budget is a card's total memory: the
    estimate's own ``context`` if it has one, else
    `torchfit.memory.allocator.cuda_context_bytes` for that card (which honours
    ``TORCHFIT_CUDA_CONTEXT_BYTES``), the figure `to_device` adds to an estimate.

    Example:
        >>> Margin(0.1, reserve=100).usable(1000)
        800
    """

    fraction: float = _FRACTION_CARD
    reserve: int = 0

    @property
    def oom_line_fraction(self) -> float:
        """Share kept free above an estimate's OOM line: 2%, or ``fraction`` if smaller."""
        return min(self.fraction, _FRACTION_OOM_LINE)

    def __post_init__(self) -> None:
        """Refuse a fraction outside [0, 1) and a negative reserve."""
        checks.fields(self)
        if not 0 <= self.fraction < 1:
            raise ValueError(f"Margin.fraction must be in [0, 1); got {self.fraction!r}")
        if self.reserve < 0:
            raise ValueError(f"Margin.reserve must be >= 0 bytes; got {self.reserve!r}")

    @checks.arguments()
    def usable(self, budget_bytes: int) -> int:
        """Bytes of ``budget_bytes`` a step may use."""
        return math.floor(budget_bytes * (1 - self.fraction)) - self.reserve


Budget = int | str | GPU | SimulatedGPU


class FoundBudget(NamedTuple):
    """A budget read: its bytes, where they came from, and the card (a `GPU` budget)."""

    bytes: int
    kind: BudgetKind
    card: GPU | None = None


def find_budget(budget: Budget) -> FoundBudget:
    """Bytes, kind and card of a budget: bytes, a size string, a card, a `SimulatedGPU`.

    Cards and sizes are told apart by `torchfit.memory.gpus.budget.read_budget`, the
    rule every budget in torchfit follows.

    Example:
        >>> find_budget("12GiB").kind, find_budget("T4").kind
        (<BudgetKind.BYTES: 'bytes'>, <BudgetKind.GPU: 'gpu'>)
    """
    if isinstance(budget, SimulatedGPU):
        return FoundBudget(budget.capacity, BudgetKind.SIMULATED)
    found = read_budget(budget)
    if isinstance(found, GPU):
        return FoundBudget(int(found.total), BudgetKind.GPU, found)
    if found <= 0:
        raise ValueError(
            f"budget must be more than 0 bytes; got {budget!r}: no batch fits in nothing. Pass "
            "the memory the step may use, e.g. budget='8GiB' or a card name"
        )
    return FoundBudget(found, BudgetKind.BYTES)


def resolve_margin(
    margin: float | Margin | None, kind: BudgetKind, context: int, card: GPU | None = None
) -> Margin:
    """The `Margin` to apply: as given, or the default for this kind of budget.

    The default for a `GPU` budget reserves the CUDA context: ``context`` (the
    estimate's own) when non-zero, else `cuda_context_bytes` of ``card``.
    """
    if isinstance(margin, Margin):
        return margin
    fraction = _FRACTION_SIMULATED if kind is BudgetKind.SIMULATED else _FRACTION_CARD
    if margin is not None:
        if isinstance(margin, bool) or not isinstance(margin, int | float):
            raise TypeError(
                f"margin must be a fraction such as 0.1, a Margin, or None; got {margin!r}"
            )
        fraction = float(margin)
    reserve = (context or cuda_context_bytes(card)) if kind is BudgetKind.GPU else 0
    return Margin(fraction, reserve=reserve)


@checks.arguments(
    budget_bytes=checks.parsed(parse_bytes, kinds=(str, int, float)),
    margin=checks.number(at_least=0, below=1),
)
def solve_batch_size(
    line: AffineEstimate, budget_bytes: int | str, *, margin: float | Margin = _FRACTION_CARD
) -> int:
    """The largest batch whose predicted peak stays within a budget minus a margin.

    Inverts ``line.fixed.total + batch * line.per_sample.total <= usable``, where
    ``usable = budget * (1 - fraction) - reserve`` (see `Margin`).

    Args:
        line: Memory as a function of batch size.
        budget_bytes: Allocatable bytes (a number or a size string).
        margin: A fraction of the budget to keep free, or a `Margin`.

    Returns:
        The batch size; 0 when even the fixed part does not fit.

    Raises:
        ValueError: The line does not grow with the batch (any batch would fit).

    Example:
        >>> line = AffineEstimate(MemoryEstimate(weights=1000), MemoryEstimate(activations=10))
        >>> solve_batch_size(line, 2000)  # usable floor(2000 * 0.95) = 1900
        90
        >>> solve_batch_size(line, 2000, margin=0.0)
        100
    """
    chosen = margin if isinstance(margin, Margin) else Margin(float(margin))
    usable = chosen.usable(parse_bytes(budget_bytes))
    return max(line.batch_within(usable), 0) if usable >= 0 else 0


Predictor = AffineEstimate | Callable[[int], MemoryEstimate]


def solve_predictor(
    predict: Predictor, usable: int, *, batch_sizes: Sequence[int] | None = None
) -> tuple[int, Line]:
    """Largest batch within ``usable`` bytes, and the line (or local secant) used.

    An `AffineEstimate` is inverted directly. A callable is fitted from the two
    smallest sizes it accepts (`fit_sizes`), the solution is checked with the callable
    itself (it must fit and one more must not), and when that check fails (memory not
    affine) the answer comes from a bisection over the callable. Sizes below the first
    one accepted are never the answer.
    """
    sizes = sorted(set(batch_sizes)) if batch_sizes is not None else None
    if sizes is not None and (not sizes or sizes[0] < 1):
        raise ValueError(f"batch_sizes must be positive integers; got {batch_sizes!r}")
    if isinstance(predict, AffineEstimate):
        line = Line(float(predict.fixed.total), float(predict.per_sample.total))
        best = line.solve(usable)
        if sizes is not None:
            best = max((b for b in sizes if b <= best), default=0)
        return best, line
    if not callable(predict):
        raise TypeError(
            f"predict must be an AffineEstimate or a callable batch_size -> MemoryEstimate; "
            f"got {type(predict).__name__}"
        )
    return solve_callable(predict, usable, sizes)


@checks.arguments(
    margin=checks.number(at_least=0, below=1), batch_sizes=checks.each(checks.whole(at_least=1))
)
def max_batch_size(
    predict: Predictor,
    budget: Budget,
    *,
    margin: float | Margin | None = None,
    batch_sizes: Sequence[int] | None = None,
) -> int:
    """The largest batch a prediction says fits, without running a step.

    Args:
        predict: Memory as a function of the batch: an `AffineEstimate`, or a callable
            ``batch_size -> MemoryEstimate`` (e.g. an estimator). A callable is fitted
            from two evaluations and checked with more; memory that is not affine in the
            batch falls back to a bisection over the callable.
        budget: Bytes, a size string (``"12GB"``), a `GPU` (its total memory: the CUDA
            context is held back), or a `SimulatedGPU`.
        margin: A fraction of the budget to keep free, a `Margin`, or ``None`` for the
            default: 5% (2% on a simulated card), and for a `GPU` budget its CUDA
            context (the estimate's own ``context``, else `cuda_context_bytes`). The
            margin applies to the allocated peak (``total``); a callable's estimates must
            also keep their OOM line (``device_needed``) 2% under the budget (or the
            margin, if smaller).
        batch_sizes: Allowed sizes (e.g. multiples of 8); the answer is the largest of
            them that fits. Any positive integer when ``None``.

    Returns:
        The batch size; 0 when not even one sample fits.

    Raises:
        ValueError: The prediction does not grow with the batch, or a bad budget/margin.
        TypeError: ``predict`` is neither an `AffineEstimate` nor a callable of estimates.

    Example:
        >>> line = AffineEstimate(
        ...     MemoryEstimate(weights=2 * 2**30), MemoryEstimate(activations=50 * 2**20)
        ... )
        >>> max_batch_size(line, "12GiB")  # 5% kept free
        192
        >>> max_batch_size(line, "12GiB", margin=0.0, batch_sizes=range(8, 1025, 8))
        200
        >>> quadratic = lambda b: line.at(b) + MemoryEstimate(workspace=b * b * 2**20)
        >>> max_batch_size(quadratic, "12GiB")  # not affine: bisected over the callable
        76
    """
    found = find_budget(budget)
    context = predict.fixed.context if isinstance(predict, AffineEstimate) else 0
    if not isinstance(predict, AffineEstimate) and callable(predict):
        predict = functools.cache(predict)  # a traced step costs about a second a size
        if found.kind is BudgetKind.GPU:
            context = evaluate(predict, 1).context
    kept = resolve_margin(margin, found.kind, context, found.card)
    best = solve_predictor(predict, kept.usable(found.bytes), batch_sizes=batch_sizes)[0]
    if isinstance(predict, AffineEstimate) or best == 0:
        return best
    # the allocator's OOM line (what the replayed step must reserve) must fit too; a card's
    # total holds the CUDA context as well, allocatable bytes do not. It grows with the
    # batch, so the largest size under it is bisected below `best`
    line = math.floor(found.bytes * (1 - kept.oom_line_fraction))
    allowed = sorted({b for b in batch_sizes or () if b <= best}) or list(range(1, best + 1))

    def under_line(index: int) -> bool:
        found_at = evaluate(predict, allowed[index])
        context = 0 if found.kind is BudgetKind.GPU else found_at.context
        return found_at.device_needed - context <= line

    if under_line(len(allowed) - 1):
        return best
    index = last_true(under_line, -1, len(allowed) - 1)
    return allowed[index] if index >= 0 else 0


def describe_budget(budget_bytes: int, margin: Margin) -> str:
    """One line: the budget and what the margin keeps free."""
    text = f"{format_bytes(budget_bytes)} budget, {margin.fraction:.0%} kept free"
    if margin.reserve:
        text += f" + {format_bytes(margin.reserve)} reserved"
    return text


def _cuda_budget() -> int:  # pragma: no cover - needs a GPU
    free, _total_bytes = torch.cuda.mem_get_info()
    return int(free + torch.cuda.memory_reserved())


def default_budget() -> FoundBudget | None:
    """The innermost simulated card, else this process's CUDA device, else ``None``."""
    card = active_simulator()
    if card is not None:
        return FoundBudget(card.capacity, BudgetKind.SIMULATED)
    if torch.cuda.is_available():  # pragma: no cover - needs a GPU
        return FoundBudget(_cuda_budget(), BudgetKind.CUDA)
    return None
