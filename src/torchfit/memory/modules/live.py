"""Live bytes of the storages created under a dispatch mode, and their peak."""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["LiveBytes"]


class LiveBytes(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts the bytes of storages created under it while they live, and their peak.

    Storages are Python objects with a lifetime tied to the tensor data (PyObject
    preservation), so a weakref finalizer sees each free, also on the meta device.
    """

    def __init__(self) -> None:
        """Start with nothing counted."""
        super().__init__()  # type: ignore[no-untyped-call]
        self.live = 0
        self.peak = 0
        self._seen: weakref.WeakSet[torch.UntypedStorage] = weakref.WeakSet()

    def exclude(self, tensors: object) -> None:
        """Storages that exist already (parameters, inputs): their views cost nothing."""
        for leaf in tree_flatten(tensors)[0]:
            if isinstance(leaf, torch.Tensor):
                self._seen.add(leaf.untyped_storage())

    def _free(self, nbytes: int) -> None:
        self.live -= nbytes

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
                if storage not in self._seen:
                    self._seen.add(storage)
                    nbytes = storage.nbytes()
                    self.live += nbytes
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(storage, self._free, nbytes)
        return out
