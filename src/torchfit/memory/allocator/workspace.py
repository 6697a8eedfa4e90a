"""What a step's kernels hold beyond its tensors: cuBLAS workspaces, reduction staging.

PyTorch gives every cuBLAS handle a workspace from the caching allocator, keyed by
(handle, stream), on the handle's first use (``setWorkspaceForHandle`` in
``aten/src/ATen/cuda/CublasHandlePool.cpp``), and keeps it for the life of the process:
allocated bytes that no tensor of the step owns. Handles are per thread (a thread-local
``PoolWindow`` reserves one), and autograd runs a CUDA backward on its own thread per
device (``torch/csrc/autograd/engine.cpp``, the device threads of
``Engine::start_device_threads``), so a training step holds two workspaces: the
forward's and the backward's. Measured on an H200 (torch 2.11, CUDA 13.0): 32.8 MiB
allocated beyond the weights and inputs before the first training step of a process
(one 32 MiB workspace), 65.0-66.0 MiB before every later one.

A trace's reduction staging buffers (`torchfit._core.reduction`) depend on the card's SMs:
`staged_for` sizes them for the card the estimate is placed on.
"""

from __future__ import annotations

import os
import re
import warnings
from typing import TYPE_CHECKING

from torchfit._core import checks
from torchfit._core.reduction import REFERENCE_SMS, threads_per_sm
from torchfit._core.units import format_bytes
from torchfit.memory.outline import RecordedStep, live_peak

if TYPE_CHECKING:
    from torchfit.memory.gpus import GPU
    from torchfit.memory.result import MemoryEstimate

__all__ = ["cublas_workspace_bytes", "matmul_threads", "staged_for"]

# cuBLAS workspace defaults, aten/src/ATen/cuda/CublasHandlePool.cpp,
# parseChosenWorkspaceSize: ":4096:2:16:8" (2 x 4096 KiB + 8 x 16 KiB), and 32 MiB
# (":4096:8") on compute capability 9.x-12.x (Hopper and Blackwell; sm_90 only before).
_CUBLAS_DEFAULT = 4096 * 1024 * 2 + 16 * 1024 * 8
_CUBLAS_32MB = 4096 * 8 * 1024
_CUBLAS_32MB_MAJORS = frozenset({9, 10, 11, 12})
_CUBLAS_CONFIG_RE = re.compile(r":([0-9]+):([0-9]+)")  # the regex PyTorch applies


def _capability_major(compute_capability: object) -> int:
    major = _read_major(compute_capability)
    if major < 0:
        raise ValueError(f"compute capability {compute_capability!r} is negative; use e.g. (9, 0)")
    return major


def _read_major(compute_capability: object) -> int:
    value = compute_capability
    if isinstance(value, tuple | list) and value and isinstance(value[0], int):
        return int(value[0])
    if isinstance(value, float):
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value if value < 20 else value // 10  # 9 or 90 both mean sm_90
    if isinstance(value, str):
        match = re.fullmatch(r"\s*(?:sm_?|compute_)?(\d+)(?:\.(\d+))?\s*", value.lower())
        if match:
            major, minor = match.groups()
            if minor is not None or len(major) == 1:
                return int(major)
            return int(major[:-1])  # "90" -> 9, "120" -> 12
    raise ValueError(
        f"cannot read compute capability {compute_capability!r}; use a (major, minor) "
        "tuple such as (9, 0), or a string such as '8.6' or 'sm_90'"
    )


@checks.arguments(compute_capability=checks.parsed(_capability_major))
def cublas_workspace_bytes(compute_capability: object = None) -> int:
    """The cuBLAS workspace PyTorch allocates, through the caching allocator, per handle.

    ``getChosenWorkspaceSize`` in ``aten/src/ATen/cuda/CublasHandlePool.cpp``: the
    ``CUBLAS_WORKSPACE_CONFIG`` environment variable when set (``:SIZE:COUNT`` pairs,
    SIZE in KiB, summed as SIZE x COUNT), else 8,519,680 bytes (``:4096:2:16:8``), or
    32 MiB on compute capability 9.x to 12.x (Hopper, Blackwell). One workspace per
    (handle, stream): one for a single-stream training loop. An unknown GPU (None)
    gets the larger 32 MiB, so an unknown card is not under-estimated. The cuBLASLt
    workspace (``CUBLASLT_WORKSPACE_SIZE``, 1 MiB by default, shared with this one in
    some builds) is not included.

    Args:
        compute_capability: ``(major, minor)``, ``"8.6"``, ``"sm_90"`` or None.

    Returns:
        Workspace bytes.

    Example:
        >>> cublas_workspace_bytes((8, 6))  # env var not set
        8519680
        >>> cublas_workspace_bytes("sm_90") // 2**20
        32
    """
    default = _CUBLAS_32MB
    if compute_capability is not None:
        major = _capability_major(compute_capability)
        default = _CUBLAS_32MB if major in _CUBLAS_32MB_MAJORS else _CUBLAS_DEFAULT
    config = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if config is None:
        return default
    pairs = _CUBLAS_CONFIG_RE.findall(config)
    if not pairs:
        # PyTorch warns ("Could not parse CUBLAS_WORKSPACE_CONFIG") and uses the default.
        warnings.warn(
            f"CUBLAS_WORKSPACE_CONFIG={config!r} has no ':SIZE:COUNT' pair, so PyTorch "
            f"ignores it and uses its default workspace of {default} bytes; "
            "set it like ':4096:8'",
            UserWarning,
            stacklevel=2,
        )
        return default
    return sum(int(size) * 1024 * int(count) for size, count in pairs)


@checks.arguments()
def matmul_threads(*, training: bool) -> int:
    """Threads that run a step's matmuls, each with its own cuBLAS workspace.

    The forward's (the caller's thread), and in training autograd's device thread, which
    runs the backward's matmuls (see the module's docstring).

    Example:
        >>> matmul_threads(training=True), matmul_threads(training=False)
        (2, 1)
    """
    return 2 if training else 1


def staged_for(estimate: MemoryEstimate, card: GPU | None) -> MemoryEstimate:
    """A traced estimate with its reduction staging buffers sized for ``card``.

    A CUDA trace sizes them for the reference card (`REFERENCE_SMS` SMs): the buffers
    scale with the SMs a reduction fills (`torchfit._core.reduction`). The events are
    resized and the allocated peak moves by what the peak's buffers change; ``card``
    None (unknown) keeps the reference.
    """
    outline = estimate.outline
    if card is None or not isinstance(outline, RecordedStep) or not outline.resizable:
        return estimate
    sms = card.sm_count or REFERENCE_SMS
    threads = threads_per_sm(card.compute_capability)
    placed = outline.on_card(sms, threads)
    if placed == outline:
        return estimate
    shift = live_peak(placed.events) - live_peak(outline.events)
    note = (
        f"reduction staging buffers sized for {card.name} "
        f"({sms} SMs x {threads} threads): {format_bytes(shift)} at the peak"
    )
    return estimate.replace(
        workspace=estimate.workspace + shift, outline=placed, notes=(*estimate.notes, note)
    )
