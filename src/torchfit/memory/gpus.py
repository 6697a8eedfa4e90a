"""GPU catalog (stub: the full catalog replaces this file)."""

from __future__ import annotations

import dataclasses

__all__ = ["GPU", "gpu", "list_gpus"]


@dataclasses.dataclass(frozen=True)
class GPU:
    """A card: name and total memory in bytes as the driver reports it."""

    name: str
    memory: int


def gpu(name: str | GPU) -> GPU:
    """Look a card up by name."""
    if isinstance(name, GPU):
        return name
    raise ValueError(f"unknown GPU {name!r}")


def list_gpus() -> list[GPU]:
    """Every card in the catalog."""
    return []
