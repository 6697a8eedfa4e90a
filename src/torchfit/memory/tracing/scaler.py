"""The AMP loop's `GradScaler` under a trace: its found-inf read is taken as "no inf".

``GradScaler.step`` decides whether to step the optimizer by reading the found-inf flags
back to the host (``_maybe_opt_step``: ``sum(v.item() for v in found_inf_per_device)``,
torch/amp/grad_scaler.py). Fake tensors hold no values, so that read stops a trace of
the loop PyTorch's AMP recipe teaches. While a trace runs, the read is replaced by "no
inf or NaN was found": the optimizer steps, as it does on every step whose gradients are
finite, which is the step whose memory matters (a skipped step allocates less). The
scaler's own tensors (the scale, the growth tracker, one found-inf flag per device) are
a few bytes and are traced as they are.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["SCALER_NOTE", "scaler_assumes_finite"]

#: The note a traced estimate carries when the step stepped a GradScaler.
SCALER_NOTE = (
    "GradScaler: traced as a step with finite gradients (the optimizer steps; its "
    "found-inf flags cannot be read from fake tensors)"
)


@contextlib.contextmanager
def scaler_assumes_finite() -> Iterator[list[bool]]:
    """Within the block every ``GradScaler.step`` steps its optimizer without reading flags.

    Yields a list that gets one ``True`` per scaler step taken (to note it in the
    estimate). `GradScaler` is restored in ``finally``.

    Example:
        >>> with scaler_assumes_finite() as stepped:
        ...     pass
        >>> stepped
        []
    """
    scaler = torch.amp.GradScaler
    original = scaler._maybe_opt_step  # noqa: SLF001 - the one method that reads values
    stepped: list[bool] = []

    def step_as_finite(
        self: torch.amp.GradScaler,
        optimizer: torch.optim.Optimizer,
        optimizer_state: dict[str, Any],
        *args: Any,
        **kwargs: Any,
    ) -> float | None:
        del self, optimizer_state  # the flags are fake: nothing to read
        stepped.append(True)
        return optimizer.step(*args, **kwargs)  # type: ignore[no-any-return]

    scaler._maybe_opt_step = step_as_finite  # type: ignore[method-assign]  # noqa: SLF001
    try:
        yield stepped
    finally:
        scaler._maybe_opt_step = original  # type: ignore[method-assign]  # noqa: SLF001
