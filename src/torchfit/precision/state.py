"""The checkpoint format of `MixedPrecision`: what its state dict holds and what must match."""

from __future__ import annotations

from typing import Any

__all__ = ["STATE_FORMAT", "check_state"]

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
