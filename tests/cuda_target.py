"""What a CUDA-target trace holds beyond the step's tensors (to compare it with the closed form)."""

from torchfit.memory.allocator import cublas_workspace_bytes, matmul_threads


def tensors_of(traced):
    """A training trace's allocated peak less its cuBLAS workspaces (added by `to_device`)."""
    note = next(n for n in traced.notes if n.startswith("cuBLAS workspace"))
    assert "(unknown GPU)" in note, note  # the default workspace size is the one taken off
    return traced.total - matmul_threads(training=True) * cublas_workspace_bytes(None)
