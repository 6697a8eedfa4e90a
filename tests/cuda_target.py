"""What a CUDA-target trace holds beyond the step's tensors (to compare it with the closed form)."""

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from torchfit.memory.allocator import cublas_workspace_bytes, matmul_threads


def tensors_of(traced):
    """A training trace's allocated peak less its cuBLAS workspaces (added by `to_device`)."""
    note = next(n for n in traced.notes if n.startswith("cuBLAS workspace"))
    assert "(unknown GPU)" in note, note  # the default workspace size is the one taken off
    return traced.total - matmul_threads(training=True) * cublas_workspace_bytes(None)


class CloneSizes(TorchDispatchMode):
    """The byte sizes of the copies ``.contiguous()`` makes (``aten.clone``), in order."""

    def __init__(self):
        super().__init__()
        self.sizes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.clone.default:
            self.sizes.append(out.numel() * out.element_size())
        return out
