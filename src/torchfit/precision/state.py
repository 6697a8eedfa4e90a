"""The checkpoint format of `MixedPrecision`: what its state dict holds and what must match."""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["STATE_FORMAT", "ScaleLog", "check_state", "make_state"]

#: Version of `MixedPrecision.state_dict`'s layout.
STATE_FORMAT = 1

_KEYS = (
    "format", "precision", "accumulate", "optimizer_steps", "skipped_steps",
    "scale_history", "scaler",
)  # fmt: skip
_GRAD_SCALER_KEYS = frozenset({"scale", "growth_factor", "backoff_factor", "growth_interval"})
_FIX = "pass the dict MixedPrecision.state_dict() returned"


def make_state(
    *,
    precision: str,
    accumulate: int,
    counters: tuple[int, int],
    scale_log: ScaleLog,
    scaler: torch.amp.GradScaler | None,
) -> dict[str, Any]:
    """The state dict: its layout, which `check_state` checks key by key on loading.

    ``counters`` are the optimizer steps and the skipped steps.
    """
    return {
        "format": STATE_FORMAT,
        "precision": precision,
        "accumulate": accumulate,
        "optimizer_steps": counters[0],
        "skipped_steps": counters[1],
        "scale_history": [list(event) for event in scale_log.events],
        "scaler": scaler.state_dict() if scaler is not None else {},
    }


def check_state(
    state: object, *, precision: str, accumulate: int, scaler: bool
) -> Mapping[str, Any]:
    """``state`` if it is a whole `MixedPrecision` state dict that this object can load.

    Checked before anything is loaded, so a refused state changes nothing: the type
    (``None`` is what a checkpoint saved without this object gives), GradScaler's own
    state dict passed by mistake, every key, the precision and accumulation it was saved
    with, the counters, the scale history, and the scaler's state (``scaler``: this
    object has a GradScaler).

    Example:
        >>> check_state(None, precision="bf16", accumulate=1, scaler=False)
        Traceback (most recent call last):
        ...
        TypeError: MixedPrecision.load_state_dict got None: a checkpoint saved without ...
    """
    if state is None:
        raise TypeError(
            "MixedPrecision.load_state_dict got None: a checkpoint saved without "
            f"MixedPrecision's state has nothing to restore; {_FIX}, or skip the call when "
            "there is none (if state is not None: mp.load_state_dict(state))"
        )
    if not isinstance(state, Mapping):
        raise TypeError(
            f"MixedPrecision.load_state_dict got a {type(state).__name__}, expected a dict; "
            f"{_FIX} (as saved in the checkpoint)"
        )
    if "format" not in state and state.keys() >= _GRAD_SCALER_KEYS:
        raise ValueError(
            "MixedPrecision.load_state_dict got a GradScaler state dict; "
            f"{_FIX} (a GradScaler's own state goes to mp.scaler.load_state_dict)"
        )
    if state.get("format") != STATE_FORMAT:
        raise ValueError(
            f"not a MixedPrecision state dict (format {state.get('format')!r}, expected "
            f"{STATE_FORMAT}); {_FIX}"
        )
    missing = [key for key in _KEYS if key not in state]
    if missing:
        raise ValueError(
            f"the MixedPrecision state dict lacks {', '.join(map(repr, missing))}: it was "
            f"cut short or edited; {_FIX}, whole"
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
    for key in ("optimizer_steps", "skipped_steps"):
        _count(key, state[key])
    _history(state["scale_history"])
    saved = state["scaler"]
    if not isinstance(saved, Mapping) or bool(saved) is not scaler:
        wanted = "GradScaler.state_dict()" if scaler else "{} (bf16 and fp32 have no scaler)"
        raise ValueError(
            f"the MixedPrecision state dict's 'scaler' is {saved!r:.80}, expected {wanted}; {_FIX}"
        )
    return state


def _count(key: str, value: object) -> None:
    try:
        count = operator.index(value)  # type: ignore[arg-type]  # checked right here
    except TypeError:
        count = -1
    if isinstance(value, bool) or count < 0:
        raise ValueError(
            f"the MixedPrecision state dict's {key!r} is {value!r}, expected a whole "
            f"number >= 0; {_FIX}"
        )


def _history(events: object) -> None:
    def is_event(event: object) -> bool:
        return (
            isinstance(event, list | tuple)
            and len(event) == 2
            and all(isinstance(x, int | float) and not isinstance(x, bool) for x in event)
        )

    if not isinstance(events, list | tuple) or not all(map(is_event, events)):
        raise ValueError(
            f"the MixedPrecision state dict's 'scale_history' is {events!r:.80}, expected "
            f"a list of [update index, scale] pairs; {_FIX}"
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

    def load(self, events: list[list[float]], scaler_state: Mapping[str, Any]) -> None:
        """Restore what a state dict saved (``scale_history`` and the scaler's state)."""
        self.events = [(int(i), float(s)) for i, s in events]
        if scaler_state:
            self.tracker = int(scaler_state["_growth_tracker"])
