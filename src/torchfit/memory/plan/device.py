"""A plan's device view: the step estimated, taken to the card, and what it says of itself.

`device_estimate` is the one estimate every verdict, limit, advice and picture of a plan
compares with the card: `estimate` for the CUDA target, per rank under a strategy
(`per_rank`), then `to_device` (reserved bytes, CUDA context, cuBLAS workspace), with notes
on what its workspace bytes are and what a training plan cannot see.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any

from torchfit._core.units import format_bytes
from torchfit.memory.allocator import to_device
from torchfit.memory.batch.fit import Line, secant_guess
from torchfit.memory.estimator import estimate
from torchfit.memory.gpus import GPU
from torchfit.memory.plan.settings import Settings
from torchfit.memory.plan.sharded import per_rank
from torchfit.memory.result import MemoryEstimate

__all__ = [
    "PLAN_NOT_MODELLED",
    "device_estimate",
    "allocated_budget",
    "estimated_once",
    "holds",
    "line_guess",
    "on_card",
    "outgrows",
    "step_estimate",
    "workspace_note",
]


def step_estimate(model: Any, settings: Settings) -> MemoryEstimate:
    """The step's allocated bytes per rank, before the card's view (no replay: fast).

    Its ``total`` is a lower bound of `device_estimate`'s ``device_needed``: the device
    view only adds (a workspace, the context) and the OOM line is never below it.
    """
    memo = _ESTIMATED.get()
    key = (id(model), settings)
    try:
        if memo is not None and key in memo:
            return memo[key]
    except TypeError:  # settings holding an unhashable value (an optimizer factory)
        memo = None
    single = estimate(model, settings.step)
    if settings.strategy is not None and settings.step.training:
        single = per_rank(model, settings, single)
    if memo is not None:
        memo[key] = single
    return single


#: `step_estimate`'s estimates within `estimated_once` (None outside it).
_ESTIMATED: contextvars.ContextVar[dict[tuple[int, Settings], MemoryEstimate] | None] = (
    contextvars.ContextVar("torchfit_plan_estimates", default=None)
)


@contextlib.contextmanager
def estimated_once() -> Iterator[None]:
    """Within it, `step_estimate` estimates each step once: a plan's scope.

    A plan asks the same step more than once (its search, the quick refusal of an advice
    item, then that item's device view); a traced step costs about a second each time.
    `MemoryEstimate` is frozen, so the one estimate is shared. Outside a plan nothing is
    kept (a local config may change between two calls).

    Example:
        >>> from torchfit.memory.step import Step
        >>> at = Settings(model="gpt2", step=Step(batch_size=2, seq_len=64))
        >>> with estimated_once():
        ...     step_estimate("gpt2", at) is step_estimate("gpt2", at)
        True
        >>> step_estimate("gpt2", at) is step_estimate("gpt2", at)
        False
    """
    token = _ESTIMATED.set({})
    try:
        yield
    finally:
        _ESTIMATED.reset(token)


def outgrows(model: Any, settings: Settings, card: GPU) -> bool:
    """The step's allocated bytes alone exceed ``card``: it cannot fit (no replay: fast)."""
    return step_estimate(model, settings).total > card.total


def holds(
    model: Any, settings: Settings, card: GPU, *, single: MemoryEstimate | None = None
) -> bool:
    """``settings``' step fits ``card`` (`device_estimate`'s ``device_needed``).

    A step whose allocated bytes alone exceed the card is refused before the allocator
    replay, and one whose reserved bytes fit is taken after a single replay, before the
    search for its OOM line: what makes a search for the largest batch or sequence quick.
    ``single``: `step_estimate` of ``settings`` when the caller has it already.
    """
    single = step_estimate(model, settings) if single is None else single
    if single.total > card.total:
        return False
    if to_device(single, gpu=card, oom_line=False, **settings.device()).device_total <= card.total:
        return True  # device_needed <= device_total
    return on_card(single, settings, card).device_needed <= card.total


def allocated_budget(card: GPU, allocated: int, placed: MemoryEstimate) -> int:
    """The allocated bytes ``card`` holds if the device view keeps the ratio it has here.

    ``placed`` is `on_card` of a step whose allocated bytes are ``allocated``: its OOM line
    (what the allocator reserves beyond them, cuBLAS's workspace) is taken to grow with
    them; its CUDA context stays. A budget for `line_guess`.

    Example:
        >>> placed = MemoryEstimate(activations=1100, context=200)  # reserves 10% more
        >>> allocated_budget(GPU(name="x", memory=2**20), 1000, placed)
        953069
    """
    held = max(placed.device_needed - placed.context, 1)
    return (card.total - placed.context) * allocated // held


def line_guess(
    total_at: Callable[[int], int], first: int, budget: int, upper: int, *, refits: int = 3
) -> int | None:
    """Where the allocated bytes' line meets ``budget``: a size in ``[1, upper]``.

    The line goes through the bytes at ``first`` and twice it (half when ``first`` is
    ``upper``); ``total_at`` gives a size's allocated bytes (`step_estimate`'s ``total``:
    no replay). Small sizes can hide the slope (a CNN's peak at batch 1 and 2 is its
    optimizer step, which no batch changes), so a guess more than twice beyond the last
    size asked is asked too, and the line drawn again through the last two sizes, up to
    ``refits`` times. A guess for `largest_fitting`, which checks it with the card's view:
    None when no line rises.

    Example:
        >>> line_guess(lambda b: 1000 + 10 * b, 8, budget=2000, upper=1 << 20)
        100
        >>> asked = []
        >>> bends = lambda b: asked.append(b) or 1000 + b + max(b - 50, 0) * 10
        >>> line_guess(bends, 1, budget=2000, upper=1 << 20), asked  # 11 b = 1500 beyond 50
        (136, [1, 2, 1000, 96])
    """
    first = min(max(first, 1), upper)
    second = 2 * first if 2 * first <= upper else first // 2
    if second < 1 or second == first:
        return None
    totals = {first: total_at(first), second: total_at(second)}

    def at(size: int) -> int:
        totals[size] = total_at(size)
        return totals[size]

    def near(guess: int) -> bool:  # next to the size asked last: the check takes it from here
        last = next(reversed(totals))
        return last // 2 <= guess <= 2 * last

    return secant_guess(at, budget, totals, lower=1, upper=upper, refits=refits, done=near)


def redrawn_guess(
    total_at: Callable[[int], int],
    budget_at: Callable[[int], int],
    guess: int,
    other: int,
    upper: int,
) -> int:
    """`line_guess`'s ``guess`` redrawn with the card's view taken at the guess itself.

    `allocated_budget` keeps the ratio of the OOM line to the allocated bytes of the size
    asked first; that ratio drifts with the size (the allocator's rounding and the cuBLAS
    workspace weigh less in a larger step: a ResNet-18 plan's first guess on a 6 GB card
    was 9% short). ``budget_at`` gives the budget by the ratio at a size; the line goes
    through ``other`` (a size already estimated) and ``guess``, and meets the budget of
    the guess, which lies next to the answer: the check that follows asks one or two
    sizes instead of galloping.

    Example:
        >>> budget_at = lambda b: 10_000 - 10 * b  # 9,100 bytes at 90
        >>> redrawn_guess(lambda b: 100 * b, budget_at, 90, 45, 1 << 20)
        91
    """
    if other == guess:
        return guess
    line = Line.through((other, total_at(other)), (guess, total_at(guess)))
    if line.per_sample <= 0:
        return guess
    return min(max(line.solve(budget_at(guess)), 1), upper)


def device_estimate(model: Any, settings: Settings, card: GPU) -> MemoryEstimate:
    """The device estimate a plan judges: ``settings`` estimated, per rank, on ``card``."""
    return on_card(step_estimate(model, settings), settings, card)


def on_card(single: MemoryEstimate, settings: Settings, card: GPU) -> MemoryEstimate:
    """`step_estimate`'s ``single`` with the card's view: reserved, context, OOM line."""
    placed = to_device(single, gpu=card, **settings.device())
    # the workspace's note goes before the device notes (cuBLAS's first), after the step's own
    kept = len(single.notes) if placed.notes[: len(single.notes)] == single.notes else 0
    notes = (*placed.notes[:kept], *workspace_note(single, placed), *placed.notes[kept:])
    if settings.step.training:
        notes = (*notes, PLAN_NOT_MODELLED)
    return placed.replace(notes=notes)


#: What the step's own workspace bytes are, by the moment of its peak.
_TRANSIENTS = {
    "start of backward": "gradients that live for a moment, such as the loss's fp32 "
    "gradients of the logits",
    "optimizer step": "the optimizer update's temporaries",
}


def workspace_note(step: MemoryEstimate, placed: MemoryEstimate) -> tuple[str, ...]:
    """What the ``workspace`` bytes are: the step's transients beside cuBLAS's workspace.

    ``step`` is the estimate before `to_device`, ``placed`` after it (which adds the
    cuBLAS workspace). Nothing is said when the workspace is cuBLAS's alone: its own
    note says so.

    Example:
        >>> step = MemoryEstimate(workspace=392 * 2**20, peak_at="optimizer step")
        >>> print(*workspace_note(step, step.replace(workspace=400 * 2**20)))
        ... # doctest: +NORMALIZE_WHITESPACE
        workspace 400.00 MiB: 392.00 MiB of the step's transients at its peak (optimizer
        step: the optimizer update's temporaries) + 8.00 MiB of cuBLAS workspace
    """
    if not step.workspace:
        return ()
    what = _TRANSIENTS.get(step.peak_at)
    moment = step.peak_at or "the peak"
    moment += f": {what}" if what else ""
    cublas = placed.workspace - step.workspace
    note = (
        f"workspace {format_bytes(placed.workspace)}: {format_bytes(step.workspace)} of the "
        f"step's transients at its peak ({moment})"
    )
    return (f"{note} + {format_bytes(cublas)} of cuBLAS workspace" if cublas else note,)


#: What a training plan cannot see in the step it plans (each changes the peak).
PLAN_NOT_MODELLED = (
    "not modelled: torch.compile (it fuses ops and frees differently), activations "
    "offloaded to the CPU, fused linear cross-entropy (Liger)"
)
