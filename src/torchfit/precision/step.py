"""The optimizer step at the end of an accumulation window, in the one correct order.

unscale_ each optimizer once (fp16) -> one inf/nan decision -> clip -> step every
optimizer (or none) -> one ``GradScaler.update`` -> step the schedulers (not after a
skip). `MixedPrecision.step` keeps the counters around it.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

from torchfit._core import checks
from torchfit.precision import pitfalls

__all__ = [
    "NO_SHARE",
    "NonFiniteCheck",
    "StepOutcome",
    "as_list",
    "boundary",
    "check_step_options",
    "parse_check",
    "unscaled_grads",
]


class NonFiniteCheck(enum.StrEnum):
    """What decides that a bf16/fp32 step is non-finite and must be skipped (fp16: the scaler).

    LOSS: the loss of every micro-batch in the window (free: a scalar), and when clipping
    also the clipping norm (free: clipping computes it). Catches the usual divergence, a
    loss that went inf/nan; misses a gradient that is inf/nan under a finite loss (a
    ``sqrt`` at 0, say) unless clipping.
    GRADS: every gradient, one read pass over all of them (the clipping norm when
    clipping), plus the loss: catches everything, at the price of that pass (about 2% of
    a small MLP's step on a CPU, benchmarks/precision.py).
    NEVER: no check; inf/nan gradients reach the optimizer, as with plain ``torch.amp``.
    """

    LOSS = "loss"
    GRADS = "grads"
    NEVER = "never"


def parse_check(value: str | NonFiniteCheck) -> NonFiniteCheck:
    """``"loss"``, ``"grads"`` or ``"never"`` as a `NonFiniteCheck`.

    Example:
        >>> parse_check("grads")
        <NonFiniteCheck.GRADS: 'grads'>
    """
    try:
        return NonFiniteCheck(value)
    except ValueError:
        choices = ", ".join(repr(str(c)) for c in NonFiniteCheck)
        raise ValueError(
            f"skip_nonfinite={value!r} is not a check torchfit knows; expected one of "
            f"{choices} (bf16/fp32 only: fp16's GradScaler always checks the gradients)"
        ) from None


class StepOutcome(enum.StrEnum):
    """What `MixedPrecision.step` did."""

    ACCUMULATED = "accumulated"  # inside an accumulation window: gradients kept, no step
    STEPPED = "stepped"  # every optimizer stepped, the schedulers advanced
    SKIPPED = "skipped"  # inf/nan gradients: no optimizer stepped, schedulers unchanged


def as_list(value: Any, name: str = "optimizers") -> list[Any]:
    """One optimizer/scheduler, a list or tuple of them, or None, as a list.

    Raises:
        TypeError: anything else (a single other object, a string), naming ``name``.

    Example:
        >>> as_list(None), as_list([1, 2])
        ([], [1, 2])
        >>> as_list(3, "scheduler")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        TypeError: scheduler must be a torch optimizer or scheduler, or a list of them; got 3
    """
    if value is None:
        return []
    if isinstance(value, torch.optim.Optimizer | torch.optim.lr_scheduler.LRScheduler):
        return [value]
    if not isinstance(value, list | tuple):
        raise checks.fail(
            name, "a torch optimizer or scheduler, or a list of them", value, kind=TypeError
        )
    return list(value)


_CLIP = checks.number(above=0, fix="clip_grad_norm=None does not clip")
#: The fix shown with a refused ``backward(weight=...)``.
NO_SHARE = "a micro-batch with no share of the window needs no backward"


def check_step_options(
    optimizers: object, clip_grad_norm: object, flush: object, before_step: object
) -> None:
    """Refuse no optimizer, a bad clipping norm, a non-bool ``flush``, an uncallable hook.

    A step without an optimizer moves nothing, so it is an error, not a reported step. A
    NaN norm turns every weight NaN, a negative one steps against the gradient and 0
    erases it: each is an error, not a step.

    Example:
        >>> check_step_options([object()], float("nan"), False, None)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ValueError: clip_grad_norm must be a finite number > 0; got nan; ...
        >>> check_step_options(None, None, False, None)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ValueError: optimizers must be one optimizer or a list of them; got None; ...
    """
    if optimizers is None or (isinstance(optimizers, list | tuple) and not optimizers):
        raise checks.fail(
            "optimizers",
            "one optimizer or a list of them",
            optimizers,
            fix="pass the optimizer(s) whose parameters the backward gave gradients, "
            "e.g. mp.step(optimizer)",
        )
    if clip_grad_norm is not None:
        _CLIP("clip_grad_norm", clip_grad_norm)
    if not isinstance(flush, bool):
        raise checks.fail("flush", "True or False", flush, kind=TypeError)
    if before_step is not None and not callable(before_step):
        raise checks.fail(
            "before_step",
            "a function called with no arguments, or None",
            before_step,
            kind=TypeError,
        )


def boundary(
    opts: list[torch.optim.Optimizer],
    scheds: list[torch.optim.lr_scheduler.LRScheduler],
    *,
    scaler: torch.amp.GradScaler | None,
    clip: float | None,
    rescale: float,
    check: NonFiniteCheck,
    loss_finite: bool,
    before_step: Callable[[], object] | None = None,
) -> tuple[bool, torch.Tensor | None]:
    """Step ``opts`` and ``scheds`` once, or skip them all; return (skipped, clip norm).

    ``rescale`` multiplies the unscaled gradients first (a short accumulation window).
    Without a scaler, ``check`` decides what makes the step skip; ``loss_finite`` says
    whether every loss of the window was finite. ``before_step`` runs on the unscaled
    gradients, before clipping, unless the step is already known to be skipped.
    """
    if scaler is not None:
        skipped = pitfalls.unscale_found_inf(scaler, opts)
    else:
        skipped = check is not NonFiniteCheck.NEVER and not loss_finite
    if rescale != 1.0:
        torch._foreach_mul_(pitfalls.grads_of(opts), rescale)
    if before_step is not None and not skipped:
        before_step()
    norm: torch.Tensor | None = None
    if clip is not None and not skipped:
        # A 2-norm is also non-finite when finite gradients overflow it (beyond ~3.4e38
        # in fp32); clipping would scale them to zero, so skipping that step loses nothing.
        params = [p for o in opts for group in o.param_groups for p in group["params"]]
        norm = torch.nn.utils.clip_grad_norm_(params, clip)
    if scaler is None and not skipped:
        skipped = not _grads_finite(opts, norm, check)
    _step_all(opts, scheds, scaler, skipped=skipped)
    return skipped, norm


def _step_all(
    opts: list[torch.optim.Optimizer],
    scheds: list[torch.optim.lr_scheduler.LRScheduler],
    scaler: torch.amp.GradScaler | None,
    *,
    skipped: bool,
) -> None:
    """Step every optimizer (unless skipped), update the scale once, then the schedulers."""
    if not skipped:
        for optimizer in opts:
            _ = scaler.step(optimizer) if scaler is not None else optimizer.step()
    if scaler is not None:
        scaler.update()
    if not skipped:
        for sched in scheds:
            sched.step()


def _grads_finite(
    opts: list[torch.optim.Optimizer], norm: torch.Tensor | None, check: NonFiniteCheck
) -> bool:
    """bf16/fp32: whether the gradients pass ``check`` (the clipping norm answers for free)."""
    if check is NonFiniteCheck.NEVER:
        return True
    if norm is not None:
        return math.isfinite(norm.item())  # 0.2 us on CPU; bool(norm.isfinite()) takes 5
    if check is NonFiniteCheck.GRADS:
        return pitfalls.all_finite(pitfalls.grads_of(opts))
    return True


def unscaled_grads(
    scaler: torch.amp.GradScaler | None,
    loss: torch.Tensor,
    inputs: Iterable[torch.Tensor],
    *,
    create_graph: bool,
) -> tuple[torch.Tensor, ...]:
    """``torch.autograd.grad`` of the scaled loss, each result times ``1 / scale``."""
    tensors = tuple(inputs) if isinstance(inputs, Iterable) else ()
    if not tensors or not all(isinstance(t, torch.Tensor) for t in tensors):
        raise checks.fail(
            "inputs", "tensors to differentiate by, e.g. list(model.parameters())",
            inputs, kind=TypeError,
        )  # fmt: skip
    if scaler is None:
        return torch.autograd.grad(loss, tensors, create_graph=create_graph)
    scaled = torch.autograd.grad(scaler.scale(loss), tensors, create_graph=create_graph)
    inverse = 1.0 / scaler.get_scale()
    return tuple(g * inverse for g in scaled)
