"""A `Step`'s field values as plain Python (``to_dict``) and as its short repr shows them."""

from __future__ import annotations

from typing import Any

from torchfit._core.units import DType

__all__ = ["plain", "short_repr"]

#: The ``peft.LoraConfig`` fields a repr and ``to_dict`` show: those that decide memory.
_LORA_FIELDS = ("r", "target_modules", "lora_dropout", "modules_to_save")


def plain(value: Any) -> Any:
    """A field's value as JSON takes it.

    A ``peft.LoraConfig`` by the fields that decide memory, an optimizer factory by its
    repr.

    Example:
        >>> plain(("q_proj", "v_proj")), plain(DType.BF16)
        (['q_proj', 'v_proj'], 'bf16')
    """
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, DType):
        return value.value
    if type(value).__name__ == "LoraConfig":
        return {name: _listed(getattr(value, name, None)) for name in _LORA_FIELDS}
    if value is not None and not isinstance(value, (str, int, float, bool)):
        return repr(value)
    return value


def short_repr(value: Any) -> str:
    """A field's value for the repr: a ``peft.LoraConfig`` by what decides memory only."""
    if type(value).__name__ == "LoraConfig":
        inner = ", ".join(f"{name}={getattr(value, name, None)!r}" for name in _LORA_FIELDS)
        return f"LoraConfig({inner}, ...)"
    return repr(value)


def _listed(value: Any) -> Any:
    """A set of module names as a sorted list (PEFT keeps ``target_modules`` as a set)."""
    return sorted(value) if isinstance(value, (set, frozenset)) else value
