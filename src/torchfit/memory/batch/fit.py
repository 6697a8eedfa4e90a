"""A line ``fixed + batch * per_sample`` from a callable predictor, and its answer.

A callable ``batch_size -> MemoryEstimate`` (an estimator, a trace) is evaluated at the
two smallest sizes the model accepts, the line through them is solved within the
usable bytes, and the answer is checked with the callable itself (the size and the next);
memory that is not affine refits the line through the largest size within the budget and
the smallest above it (regula falsi, up to three times), then searches out from the last
guess and bisects. Each size is evaluated once, and every evaluation leaves the global
RNGs as it found them (`evaluate`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch

from torchfit._core.bisection import largest_fitting, last_true
from torchfit._core.rng import kept_rng
from torchfit.memory.result import MemoryEstimate

__all__ = ["Line", "evaluate", "fit_sizes", "secant_guess", "solve_callable", "total"]

# A batch above this means the prediction never reaches the budget (a bug in predict).
_NEVER = 2**40
# Refits of the line across the budget before the bracket search.
_SECANTS = 3


@dataclasses.dataclass(frozen=True)
class Line:
    """``fixed + batch * per_sample`` in bytes (floats: a fit, not a category table).

    ``fitted_from`` holds the batch sizes a callable predictor was evaluated at to fit
    it (empty for an `AffineEstimate`, which is a line already).
    """

    fixed: float
    per_sample: float
    fitted_from: tuple[int, ...] = ()

    @classmethod
    def through(cls, first: tuple[int, int], second: tuple[int, int]) -> Line:
        """The line through two ``(batch_size, bytes)`` points, fitted from their sizes.

        Example:
            >>> Line.through((2, 1200), (4, 1400))
            Line(fixed=1000.0, per_sample=100.0, fitted_from=(2, 4))
        """
        (b1, t1), (b2, t2) = first, second
        per_sample = (t2 - t1) / (b2 - b1)
        return cls(float(t1 - per_sample * b1), float(per_sample), (b1, b2))

    def at(self, batch_size: int) -> float:
        """Predicted bytes at ``batch_size``."""
        return self.fixed + batch_size * self.per_sample

    def solve(self, usable: float) -> int:
        """Largest batch within ``usable`` bytes (0 if none)."""
        if self.per_sample <= 0:
            raise ValueError(
                "memory does not grow with the batch size in this prediction; check that "
                "the per-sample part (activations) was estimated"
            )
        return max(math.floor((usable - self.fixed) / self.per_sample), 0)


class _NotAnEstimateError(TypeError):
    """A predictor returned something other than a `MemoryEstimate` (never skipped)."""


def evaluate(predict: Callable[[int], MemoryEstimate], batch_size: int) -> MemoryEstimate:
    """``predict(batch_size)``, with every global RNG put back as it was (`kept_rng`).

    A predictor may draw random numbers (``torch.randint`` token ids, a sampled batch);
    a prediction is not a step, so the caller's next draw stays the one it would have
    been, even when the predictor raises, and every evaluation starts from the same
    RNG state. A result that is not a `MemoryEstimate` is an error.

    Example:
        >>> before = torch.get_rng_state()
        >>> _ = evaluate(lambda b: MemoryEstimate(activations=int(torch.rand(1) * b)), 8)
        >>> torch.equal(torch.get_rng_state(), before)
        True
    """
    with kept_rng():
        estimate = predict(batch_size)
    if not isinstance(estimate, MemoryEstimate):
        raise _NotAnEstimateError(
            f"predict({batch_size}) returned {type(estimate).__name__}; a predictor must "
            "return a torchfit MemoryEstimate (e.g. lambda b: memory.estimate(model, batch_size=b))"
        )
    return estimate


def total(predict: Callable[[int], MemoryEstimate], batch_size: int) -> int:
    """``predict(batch_size).total``, through `evaluate`."""
    return evaluate(predict, batch_size).total


#: Sizes a callable predictor is tried at, in order, until two are accepted: a model
#: may refuse some in training (BatchNorm needs 2 samples; a reshape, a multiple of 8).
_FIT_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def fit_sizes(predict: Callable[[int], MemoryEstimate]) -> tuple[tuple[int, int], Line]:
    """The totals at the two smallest sizes ``predict`` accepts, and the line through them.

    A size refused with an error that is not about memory (a ``ValueError``,
    ``RuntimeError`` or ``TypeError`` from the model, such as BatchNorm's "Expected more
    than 1 value per channel when training" at batch 1) is skipped and the next one is
    tried, from 1 up to 64. A wrongly typed result is not skipped.

    Raises:
        ValueError: fewer than two sizes up to 64 were accepted, with the first refusal.

    Example:
        >>> def needs_two(b):
        ...     if b < 2:
        ...         raise ValueError("Expected more than 1 value per channel when training")
        ...     return MemoryEstimate(weights=100, activations=10 * b)
        >>> fit_sizes(needs_two)
        ((120, 130), Line(fixed=100.0, per_sample=10.0, fitted_from=(2, 3)))
    """
    accepted: list[tuple[int, int]] = []
    refused: list[tuple[int, Exception]] = []
    for size in _FIT_SIZES:
        try:
            accepted.append((size, total(predict, size)))
        except (_NotAnEstimateError, torch.OutOfMemoryError):
            raise
        except (ValueError, RuntimeError, TypeError) as error:
            refused.append((size, error))
        if len(accepted) == 2:
            break
    if len(accepted) < 2:
        size, first_error = refused[0]
        raise ValueError(
            f"predict was refused at batch size {size} ({type(first_error).__name__}: "
            f"{first_error}) and accepted only {[b for b, _ in accepted] or 'no size'} of "
            f"{list(_FIT_SIZES)}; a line needs two: check that predict runs the model at "
            "these sizes"
        ) from first_error
    (_, t1), (_, t2) = accepted
    return (t1, t2), Line.through(*accepted)


def _straddling(totals: dict[int, int], usable: int) -> list[tuple[int, int]]:
    """The largest size within ``usable`` and the smallest above it (else the two largest)."""
    within = [(b, t) for b, t in totals.items() if t <= usable]
    above = [(b, t) for b, t in totals.items() if t > usable]
    if within and above:
        return [max(within), min(above)]
    return sorted(totals.items())[-2:]


def secant_guess(
    at: Callable[[int], int],
    budget: int,
    totals: dict[int, int],
    *,
    lower: int,
    upper: int,
    refits: int,
    done: Callable[[int], bool],
) -> int | None:
    """Where the bytes ``at`` a size meet ``budget``, by lines through the sizes asked.

    The line goes through the largest size within the budget and the smallest above it
    (regula falsi), or the two largest while none is above; its answer, kept in
    ``[lower, upper]``, is asked (``at`` adds it to ``totals``) and the line drawn again,
    up to ``refits`` times, until ``done(guess)``, a guess repeats, or it is a size
    already asked. ``None`` when the first line does not rise; the last guess when a
    later one does not.

    Example:
        >>> bends = lambda b: 1000 + b + max(b - 50, 0) * 10  # 11 bytes a size beyond 50
        >>> totals = {1: bends(1), 2: bends(2)}
        >>> def at(b):
        ...     totals[b] = bends(b)
        ...     return totals[b]
        >>> near = lambda b: (last := list(totals)[-1]) // 2 <= b <= 2 * last  # asked last
        >>> secant_guess(at, 2000, totals, lower=1, upper=1 << 20, refits=3, done=near)
        136
        >>> list(totals)
        [1, 2, 1000, 96]
    """
    guess = None
    for _ in range(refits + 1):
        line = Line.through(*_straddling(totals, budget))
        if line.per_sample <= 0:
            return guess
        found = min(max(line.solve(budget), lower), upper)
        if found == guess or found in totals or done(found):
            return found
        guess = found
        at(guess)
    return guess


def solve_callable(
    predict: Callable[[int], MemoryEstimate], usable: int, sizes: list[int] | None
) -> tuple[int, Line]:
    """The largest batch within ``usable`` bytes (of ``sizes`` if given), and the line."""
    fitted, line = fit_sizes(predict)
    first_total = fitted[0]
    first = line.fitted_from[0]
    if first_total > usable:
        return 0, line

    def fits(batch_size: int) -> bool:
        return total(predict, batch_size) <= usable

    if sizes is not None:
        sizes = [b for b in sizes if b >= first]  # smaller ones cannot run
        if not sizes:
            return 0, line
        if fits(sizes[-1]):
            return sizes[-1], line
        index = last_true(lambda i: fits(sizes[i]), -1, len(sizes) - 1)
        return (sizes[index] if index >= 0 else 0), line
    return _solve_line(predict, usable, fitted, line), line


def _solve_line(
    predict: Callable[[int], MemoryEstimate], usable: int, fitted: tuple[int, int], line: Line
) -> int:
    """The largest batch within ``usable`` from the fitted line, checked and refined."""
    first = line.fitted_from[0]
    totals: dict[int, int] = dict(zip(line.fitted_from, fitted, strict=True))

    def at(batch_size: int) -> int:
        if batch_size not in totals:
            totals[batch_size] = total(predict, batch_size)
        return totals[batch_size]

    # memory that is not affine: the line across the budget, until a size is the answer
    guess = secant_guess(
        at, usable, totals, lower=first, upper=_NEVER, refits=_SECANTS,
        done=lambda b: at(b) <= usable < at(b + 1),
    )  # fmt: skip
    # a peak set by a batch-independent phase at small batches is flat there: no slope
    guess = first + 1 if guess is None else guess
    # then from the last guess out by 1, 2, 4... and bisection (n counts from `first`)
    found = largest_fitting(lambda n: at(first - 1 + n) <= usable, _NEVER, guess=guess - first + 1)
    if found == _NEVER:
        raise ValueError("the predicted memory never exceeds the budget; check predict")
    return first - 1 + found
