"""From allocated bytes to what the GPU shows: caching allocator, CUDA context, workspaces."""

from torchfit.memory.allocator.caching import CachingAllocator
from torchfit.memory.allocator.context import (
    CONTEXT_ENV_VAR,
    DEFAULT_CUDA_CONTEXT_BYTES,
    EAGER_LIBRARY_BYTES,
    LAZY_FIRST_USE_BYTES,
    bare_context_bytes,
    cuda_context_bytes,
    measure_cuda_context,
)
from torchfit.memory.allocator.device import (
    DEFAULT_FRAGMENTATION,
    approximate_reserved,
    to_device,
)
from torchfit.memory.allocator.rules import (
    K_LARGE_BUFFER,
    K_MIN_BLOCK_SIZE,
    K_MIN_LARGE_ALLOC,
    K_ROUND_LARGE,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    AllocatorStats,
    SegmentInfo,
    round_request,
    segment_size,
)
from torchfit.memory.allocator.schedule import Schedule, step_schedule
from torchfit.memory.allocator.simulator import replay, smallest_capacity
from torchfit.memory.allocator.snapshot import (
    SnapshotEvent,
    SnapshotReplay,
    SnapshotTrace,
    read_snapshot,
    replay_snapshot,
)
from torchfit.memory.allocator.workspace import cublas_workspace_bytes, matmul_threads

__all__ = [
    "CONTEXT_ENV_VAR",
    "DEFAULT_CUDA_CONTEXT_BYTES",
    "DEFAULT_FRAGMENTATION",
    "EAGER_LIBRARY_BYTES",
    "LAZY_FIRST_USE_BYTES",
    "bare_context_bytes",
    "K_LARGE_BUFFER",
    "K_MIN_BLOCK_SIZE",
    "K_MIN_LARGE_ALLOC",
    "K_ROUND_LARGE",
    "K_SMALL_BUFFER",
    "K_SMALL_SIZE",
    "AllocatorStats",
    "CachingAllocator",
    "Schedule",
    "SegmentInfo",
    "SnapshotEvent",
    "SnapshotReplay",
    "SnapshotTrace",
    "approximate_reserved",
    "cublas_workspace_bytes",
    "matmul_threads",
    "cuda_context_bytes",
    "measure_cuda_context",
    "read_snapshot",
    "replay",
    "replay_snapshot",
    "round_request",
    "segment_size",
    "smallest_capacity",
    "step_schedule",
    "to_device",
]
