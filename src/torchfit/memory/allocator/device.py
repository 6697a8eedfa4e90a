"""From allocated bytes to what the GPU shows: the caching allocator and the CUDA context.

torchfit's estimators predict the peak of *allocated* bytes (``max_memory_allocated``).
Users see ``torch.cuda.max_memory_reserved()`` and ``nvidia-smi``. This module closes
the gap:

* `round_request`, `segment_size`, `CachingAllocator` and `replay`: a byte-exact model
  of PyTorch's CUDA caching allocator (512-byte rounding, small/large pools, 2 MiB and
  20 MiB segments, 2 MiB rounding from 10 MiB, best-fit reuse, splitting, coalescing,
  ``empty_cache``, OOM recovery). Given the exact allocation sequence, it gives the
  exact ``max_memory_reserved``.
* `cuda_context_bytes` and `cublas_workspace_bytes`: memory outside the estimate's
  tensors: the CUDA context (never seen by the allocator) and the cuBLAS workspace
  (allocated through it).
* `to_device`: fills an estimate's ``reserved`` and ``context`` so that
  ``device_total`` is the ``nvidia-smi`` figure.

Not yet checked against a real GPU (tests/memory/allocator/test_allocator_cuda.py does that where
one is present).
"""

from __future__ import annotations

import math
import os
import re
import warnings
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from torchfit._core import checks
from torchfit._core.units import format_bytes
from torchfit.memory.allocator.context import (
    asks_to_measure,
    check_context_size,
    context_and_source,
    given_context,
    parse_cuda_version,
    resolve_gpu,
)
from torchfit.memory.allocator.rules import (
    K_LARGE_BUFFER,
    K_ROUND_LARGE,
    K_SMALL_BUFFER,
    check_nbytes,
)
from torchfit.memory.allocator.schedule import step_schedule
from torchfit.memory.allocator.simulator import replay, smallest_capacity
from torchfit.memory.outline import RecordedStep
from torchfit.memory.result import MemoryEstimate

if TYPE_CHECKING:
    from torchfit.memory.gpus import GPU

__all__ = [
    "DEFAULT_FRAGMENTATION",
    "approximate_reserved",
    "cublas_workspace_bytes",
    "to_device",
]

#: Fragmentation allowance of `approximate_reserved`: the share of allocated bytes that
#: cached-but-unusable blocks add. Calibrated by replaying the real allocation traces of
#: CPU training steps (MLP, CNN, two GPT-2 sizes) through `replay`: reserved/allocated
#: peaks of 1.02-1.37, where the fixed 22 MiB term carries the small models
#: (benchmarks/allocator_fragmentation.py).
DEFAULT_FRAGMENTATION = 0.05

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


def approximate_reserved(allocated: int, *, fragmentation: float = DEFAULT_FRAGMENTATION) -> int:
    """Reserved bytes at a peak of ``allocated`` bytes when the allocation order is unknown.

    The rule: ``allocated * (1 + fragmentation)`` rounded up to 2 MiB (large segments are
    2 MiB multiples), plus one 20 MiB segment (``kLargeBuffer``: mid-size requests share
    partly used 20 MiB segments) and one 2 MiB small-pool segment. With the default
    fragmentation of 5% this falls within -5%/+8% of exact replays of real training-step
    traces (see `DEFAULT_FRAGMENTATION`); with the real allocation order, use `replay`.

    Example:
        >>> approximate_reserved(400 * 2**20) // 2**20  # 420 + 20 + 2
        442
        >>> approximate_reserved(0)
        0
    """
    if isinstance(fragmentation, bool) or not isinstance(fragmentation, int | float):
        raise TypeError(f"fragmentation must be a number such as 0.05; got {fragmentation!r}")
    if not 0 <= fragmentation < math.inf:
        raise ValueError(f"fragmentation must be a finite share >= 0; got {fragmentation}")
    if check_nbytes(allocated, "allocated") == 0:
        return 0
    held = math.ceil(allocated * (1 + fragmentation))
    return -(-held // K_ROUND_LARGE) * K_ROUND_LARGE + K_LARGE_BUFFER + K_SMALL_BUFFER


class _WorkspaceKey:
    """A key no caller's trace can contain: the cuBLAS workspace in a replay."""

    def __repr__(self) -> str:
        return "<cuBLAS workspace>"


_WORKSPACE_KEY = _WorkspaceKey()


@checks.arguments(
    context_bytes=checks.parsed(check_context_size, kinds=(str, int, float)),
    fragmentation=checks.number(at_least=0, below=1),
    cuda_version=checks.parsed(parse_cuda_version),
)
def to_device(
    estimate: MemoryEstimate,
    *,
    gpu: str | GPU | None = None,
    events: Iterable[Sequence[object]] | None = None,
    warmup: Iterable[Sequence[object]] | None = None,
    context_bytes: int | str | None = None,
    workspace: bool = True,
    fragmentation: float = DEFAULT_FRAGMENTATION,
    lazy_loading: bool | None = None,
    cuda_version: object = None,
    oom_line: bool = True,
) -> MemoryEstimate:
    """Add the CUDA device's view to an estimate: ``reserved``, ``context``, cuBLAS workspace.

    With ``events`` (the exact allocation sequence behind the estimate, as `replay`
    takes it, every tensor the estimate counts included), ``reserved`` is the replayed
    ``max_memory_reserved``: exact under the modelled rules; with ``warmup`` too (the
    warm-up step's events, `replay`'s ``warmup``), it is the peak of the step after the
    warm-up, from the segments the warm-up left, as a step measured after a warm-up
    step. Without ``events``, it is `approximate_reserved` of the estimate's ``total``.
    With ``workspace`` the cuBLAS workspace (`cublas_workspace_bytes`) is added to the
    ``workspace`` category (and, in a replay, allocated before the first event, as the
    first matmul would: the warm-up's first when there is one). ``context`` comes from
    ``context_bytes`` when given, else `cuda_context_bytes`.

    Args:
        estimate: An estimate made for ``device="cuda"``.
        gpu: Catalog name or `GPU` record: its compute capability picks the cuBLAS
            workspace size.
        events: ``(key, nbytes)`` allocations and ``(key,)`` frees, in order.
        warmup: The warm-up's events, replayed before ``events`` (see `replay`); only
            with ``events``.
        context_bytes: Override of the CUDA context size (bytes or a string like
            ``"400MB"``), or ``"measure"`` to measure it on this machine's GPU
            (`measure_cuda_context`).
        workspace: Add the cuBLAS workspace (False when the estimate already has it).
        fragmentation: See `approximate_reserved` (used without ``events``).
        lazy_loading: See `cuda_context_bytes`.
        cuda_version: See `cuda_context_bytes` (``"11.2"``: a context of 1341 MiB).
        oom_line: With a replayed step schedule, search the smallest capacity it runs in
            (`MemoryEstimate.oom_line`: about 15 more replays). False skips the search:
            ``device_needed`` is then ``device_total``, never below the searched one.

    Returns:
        A copy of ``estimate`` with ``reserved``, ``context``, ``workspace`` and notes set.

    Raises:
        ValueError: ``estimate`` is not a CUDA estimate, or an argument is malformed.

    Example:
        >>> e = to_device(MemoryEstimate(weights=400 * 2**20), gpu=None, context_bytes="300MB")
        >>> e.workspace // 2**20, e.reserved // 2**20, e.context
        (32, 476, 300000000)
        >>> e.device_total == e.reserved + e.context
        True
    """
    if not isinstance(estimate, MemoryEstimate):
        raise TypeError(f"to_device takes a MemoryEstimate; got {type(estimate).__name__}")
    if estimate.device != "cuda":
        raise ValueError(
            f"to_device models the CUDA caching allocator, but this estimate was made for "
            f"device={estimate.device!r}; estimate again with device='cuda'"
        )
    record = resolve_gpu(gpu)
    notes = list(estimate.notes)
    extra = 0
    if workspace:
        capability = getattr(record, "compute_capability", None)
        extra = cublas_workspace_bytes(capability)
        where = "unknown GPU" if capability is None else f"compute capability {capability}"
        notes.append(f"cuBLAS workspace {format_bytes(extra)} added to workspace ({where})")
    total = estimate.total + extra
    if events is None and warmup is not None:
        raise ValueError(
            "warmup= was given without events=; pass the step's events too (a trace's "
            "events and warmup_events), or neither for the approximation"
        )
    replayed = None
    if events is None:
        replayed = _outline_reserved(estimate, extra, total, notes, search=oom_line)
    line = None if replayed is None else replayed[1]
    if replayed is not None:
        reserved = replayed[0]
    elif events is None:
        reserved = approximate_reserved(total, fragmentation=fragmentation)
        notes.append(
            f"reserved approximated from the allocated peak: +{fragmentation:.0%} "
            "fragmentation, rounded to 2 MiB, + one 20 MiB and one 2 MiB segment "
            "(pass events= for an exact replay)"
        )
    else:
        reserved = _events_reserved(
            events,
            warmup,
            workspace=extra,
            total=total,
            fragmentation=fragmentation,
            notes=notes,
        )
    if context_bytes is None:
        context, source = context_and_source(
            record, lazy_loading=lazy_loading, cuda_version=cuda_version
        )
    else:
        context = given_context(context_bytes) or 0
        source = "measured on this machine" if asks_to_measure(context_bytes) else "given"
    notes.append(
        f"CUDA context {format_bytes(context)} ({source}; outside the allocator, "
        "shown by nvidia-smi)"
    )
    if estimate.weights:
        notes.append(
            "not counted: blocks the allocator still caches from loading the weights "
            "(a loader's temporary copies, e.g. from_pretrained's, stay reserved and in "
            "nvidia-smi until torch.cuda.empty_cache())"
        )
    return estimate.replace(
        workspace=estimate.workspace + extra,
        reserved=reserved,
        context=context,
        notes=tuple(dict.fromkeys(notes)),
        oom_line=line,
    )


#: How far the outline's replayed allocated peak may stray from the estimate's total
#: before the outline is taken to describe another step (a sharded or loading estimate
#: derived from it) and the approximation is used instead.
_OUTLINE_AGREEMENT = 0.10


def _outline_reserved(
    estimate: MemoryEstimate, workspace: int, total: int, notes: list[str], *, search: bool
) -> tuple[int, int | None] | None:
    """Reserved bytes and the OOM line (with ``search``) from the estimate's outline replayed.

    A `RecordedStep` is replayed as it is, a `StepOutline` through `step_schedule`. None
    when the outline does not describe this estimate's step (its weights differ,
    or its replayed allocated peak is more than `_OUTLINE_AGREEMENT` away from
    ``total``): an estimate rescaled or replaced after the closed form made it.
    """
    outline = estimate.outline
    if isinstance(outline, RecordedStep):  # a trace's own events
        warm, events = list(outline.warmup), list(outline.events)
    elif outline is None or outline.weights != estimate.weights:
        return None
    else:
        schedule = step_schedule(outline)
        warm, events = list(schedule.warmup), list(schedule.events)
    if workspace:
        warm.insert(0, (_WORKSPACE_KEY, workspace))
    stats = replay(events, warmup=warm)
    if abs(stats.peak_allocated / total - 1) > _OUTLINE_AGREEMENT:
        return None
    # What the estimate counts beyond the replayed tensors (small buffers, rounding) is
    # added as whole 2 MiB pages.
    missing = max(total - stats.peak_allocated, 0)
    reserved = stats.peak_reserved + -(-missing // K_ROUND_LARGE) * K_ROUND_LARGE
    note = (
        f"reserved replayed exactly from {len(events)} allocator events, after {len(warm)} "
        f"of the warm-up step's (peak allocated {format_bytes(stats.peak_allocated)})"
        if isinstance(outline, RecordedStep)
        else f"reserved from a synthetic schedule of the step ({len(events)} allocator "
        f"events after a warm-up of {len(warm)}) replayed through the allocator model"
    )
    if not search:
        notes.append(note)
        return max(reserved, total), None
    line = smallest_capacity(
        events, warmup=warm, upper=stats.peak_reserved, lower=stats.peak_allocated
    ) + (reserved - stats.peak_reserved)
    notes.append(f"{note}; it runs out of memory below {format_bytes(line)} reserved")
    return max(reserved, total), line


def _events_reserved(
    events: Iterable[Sequence[object]],
    warmup: Iterable[Sequence[object]] | None,
    *,
    workspace: int,
    total: int,
    fragmentation: float,
    notes: list[str],
) -> int:
    """Reserved bytes of the caller's exact events (and warm-up), the rest approximated."""
    trace = list(events)
    warm = None if warmup is None else list(warmup)
    if workspace:
        (trace if warm is None else warm).insert(0, (_WORKSPACE_KEY, workspace))
    stats = replay(trace, warmup=warm)
    reserved = stats.peak_reserved
    after = "" if warm is None else f", after {len(warm)} of the warm-up step's"
    notes.append(
        f"reserved replayed exactly from {len(trace)} allocator events{after} "
        f"(peak allocated {format_bytes(stats.peak_allocated)})"
    )
    missing = total - stats.peak_allocated
    if missing > 0:
        reserved += approximate_reserved(missing, fragmentation=fragmentation)
        notes.append(
            f"the events cover {format_bytes(stats.peak_allocated)} of the "
            f"{format_bytes(total)} allocated peak; the other "
            f"{format_bytes(missing)} is approximated"
        )
    return reserved
