"""Live bytes of the storages created under a dispatch mode, and their peak."""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from torchfit._core.ledger import Ledger

__all__ = ["LiveBytes"]


class LiveBytes(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts the bytes of storages created under it while they live, and their peak.

    A `Ledger` counts each output storage once and sees its free through a weak
    reference (also on the meta device); storages grown in place count their new size.
    """

    def __init__(self) -> None:
        """Start with nothing counted."""
        super().__init__()  # type: ignore[no-untyped-call]
        self.ledger = Ledger()
        self._excluded: weakref.WeakSet[torch.UntypedStorage] = weakref.WeakSet()

    @property
    def live(self) -> int:
        """Bytes of the counted storages alive now."""
        return self.ledger.live

    @property
    def peak(self) -> int:
        """Highest `live` so far."""
        return self.ledger.peak

    def exclude(self, tensors: object) -> None:
        """Storages that exist already (parameters, inputs): their views cost nothing."""
        for leaf in tree_flatten(tensors)[0]:
            if isinstance(leaf, torch.Tensor):
                self._excluded.add(leaf.untyped_storage())

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        """Run ``func`` and count each output storage not seen before, until it is freed."""
        out = func(*args, **(kwargs or {}))
        for leaf in tree_flatten(out)[0]:
            if isinstance(leaf, torch.Tensor):
                storage = leaf.untyped_storage()
                if storage not in self._excluded:
                    self.ledger.add(storage)
        return out
