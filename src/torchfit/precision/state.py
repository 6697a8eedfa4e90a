"""The checkpoint format of `MixedPrecision`: what its state dict holds and what must match."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["STATE_FORMAT", "ScaleLog", "check_state"]

#: Version of `MixedPrecision.state_dict`'s layout.
STATE_FORMAT = 1


def check_state(state: dict[str, Any], *, precision: str, accumulate: int) -> None:
    """Refuse a state dict that is not ours, or was saved with another precision or window.

    Example:
        >>> check_state({"format": 1, "precision": "fp16", "accumulate": 4},
        ...             precision="bf16", accumulate=4)
        Traceback (most recent call last):
        ...
        ValueError: the checkpoint was saved with dtype='fp16' but this MixedPrecision has ...
    """
    if state.get("format") != STATE_FORMAT:
        raise ValueError(
            f"not a MixedPrecision state dict (format {state.get('format')!r}, expected "
            f"{STATE_FORMAT}); pass what MixedPrecision.state_dict() returned"
        )
    # (state dict key, MixedPrecision argument, this object's value)
    for key, arg, mine in (
        ("precision", "dtype", precision),
        ("accumulate", "accumulate", accumulate),
    ):
        if state[key] != mine:
            raise ValueError(
                f"the checkpoint was saved with {arg}={state[key]!r} but this "
                f"MixedPrecision has {arg}={mine!r}; build it with "
                f"MixedPrecision({arg}={state[key]!r}, ...) to resume exactly"
            )


class ScaleLog:
    """The loss scale of a run, kept on the host: read without a device sync.

    ``events`` holds ``(update index, scale)`` at the start and after every change; the
    clean-step counter mirrors ``torch._amp_update_scale_``, so the scale is read from
    the scaler only on an update that changed it.

    Example:
        >>> log = ScaleLog(64.0)
        >>> scaler = torch.amp.GradScaler("cpu", init_scale=64.0, growth_interval=2)
        >>> log.record(scaler, 1, skipped=False)
        >>> log.events
        [(0, 64.0)]
    """

    def __init__(self, init_scale: float | None) -> None:
        """Start at ``init_scale`` (``None``: no scaler, nothing is recorded)."""
        self.events: list[tuple[int, float]] = [] if init_scale is None else [(0, init_scale)]
        self.tracker = 0  # host mirror of the scaler's clean-step counter

    def record(self, scaler: torch.amp.GradScaler, index: int, *, skipped: bool) -> None:
        """After ``scaler.update()`` of update ``index``: note the scale if it changed."""
        if skipped:
            self.tracker = 0
        else:
            self.tracker += 1
            if self.tracker < scaler.get_growth_interval():
                return
            self.tracker = 0
        self.events.append((index, scaler.get_scale()))

    def load(self, events: list[list[float]], scaler_state: dict[str, Any]) -> None:
        """Restore what a state dict saved (``scale_history`` and the scaler's state)."""
        self.events = [(int(i), float(s)) for i, s in events]
        if scaler_state:
            self.tracker = int(scaler_state["_growth_tracker"])
