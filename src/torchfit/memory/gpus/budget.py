"""Budgets: a byte count, a size string, a `GPU` or a card name, resolved to bytes."""

from __future__ import annotations

from torchfit._core.units import format_bytes, parse_bytes
from torchfit.memory.gpus.card import GPU
from torchfit.memory.gpus.lookup import gpu

__all__ = ["budget_of"]


def budget_of(value: int | str | GPU) -> tuple[int, str]:
    """Bytes and a display name for a budget: a byte count, a size string, a `GPU` or a name.

    Example:
        >>> budget_of("12GB")
        (12000000000, '12GB')
    """
    if isinstance(value, GPU):
        return int(value.memory), value.name
    if isinstance(value, str):
        try:
            return parse_bytes(value), value.strip()
        except ValueError as size_error:
            try:
                card = gpu(value)
            except (KeyError, ValueError):
                raise ValueError(
                    f"cannot read {value!r} as a memory budget: it is neither a size such as "
                    "'12GB' nor a GPU name torchfit knows; pass bytes, a size string or a "
                    "torchfit.memory.GPU"
                ) from size_error
            return int(card.memory), card.name
    return parse_bytes(value), format_bytes(parse_bytes(value))
