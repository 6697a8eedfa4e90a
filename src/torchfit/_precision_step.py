"""The optimizer step at the end of an accumulation window, in the one correct order.

unscale_ each optimizer once (fp16) -> one inf/nan decision -> clip -> step every
optimizer (or none) -> one ``GradScaler.update`` -> step the schedulers (not after a
skip). `MixedPrecision.step` keeps the counters around it.
"""

from __future__ import annotations

import enum
import math
from typing import Any

import torch

from torchfit import _precision_checks as _checks

__all__ = ["StepOutcome", "as_list", "boundary"]


class StepOutcome(enum.StrEnum):
    """What `MixedPrecision.step` did."""

    ACCUMULATED = "accumulated"  # inside an accumulation window: gradients kept, no step
    STEPPED = "stepped"  # every optimizer stepped, the schedulers advanced
    SKIPPED = "skipped"  # inf/nan gradients: no optimizer stepped, schedulers unchanged


def as_list(value: Any) -> list[Any]:
    """One optimizer/scheduler, a sequence of them, or None, as a list.

    Example:
        >>> as_list(None), as_list([1, 2])
        ([], [1, 2])
    """
    if value is None:
        return []
    if isinstance(value, torch.optim.Optimizer | torch.optim.lr_scheduler.LRScheduler):
        return [value]
    return list(value)


def boundary(
    opts: list[torch.optim.Optimizer],
    scheds: list[torch.optim.lr_scheduler.LRScheduler],
    *,
    scaler: torch.amp.GradScaler | None,
    clip: float | None,
    rescale: float,
    check_finite: bool,
) -> tuple[bool, torch.Tensor | None]:
    """Step ``opts`` and ``scheds`` once, or skip them all; return (skipped, clip norm).

    ``rescale`` multiplies the unscaled gradients first (a short accumulation window).
    Without a scaler, ``check_finite`` decides whether inf/nan gradients skip the step.
    """
    skipped = scaler is not None and _checks.unscale_found_inf(scaler, opts)
    if rescale != 1.0:
        torch._foreach_mul_(_checks.grads_of(opts), rescale)
    norm: torch.Tensor | None = None
    if clip is not None and not skipped:
        params = [p for o in opts for group in o.param_groups for p in group["params"]]
        norm = torch.nn.utils.clip_grad_norm_(params, clip)
    if scaler is None and check_finite:
        skipped = not _finite(opts, norm)
    if not skipped:
        for optimizer in opts:
            _ = scaler.step(optimizer) if scaler is not None else optimizer.step()
    if scaler is not None:
        scaler.update()
    if not skipped:
        for sched in scheds:
            sched.step()
    return skipped, norm


def _finite(opts: list[torch.optim.Optimizer], norm: torch.Tensor | None) -> bool:
    """bf16/fp32: are all gradients finite? The clipping norm answers for free when there is one.

    A 2-norm is also non-finite when finite gradients overflow it (beyond ~3.4e38 in
    fp32); clipping would then scale them to zero, so skipping that step loses nothing.
    """
    if norm is not None:
        return math.isfinite(norm.item())  # 0.2 us on CPU; bool(norm.isfinite()) takes 5
    return _checks.all_finite(_checks.grads_of(opts))
