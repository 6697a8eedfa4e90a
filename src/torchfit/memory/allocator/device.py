"""From allocated bytes to what the GPU shows: the caching allocator and the CUDA context.

torchfit's estimators predict the peak of *allocated* bytes (``max_memory_allocated``).
Users see ``torch.cuda.max_memory_reserved()`` and ``nvidia-smi``. This module closes
the gap:

* `round_request`, `segment_size`, `CachingAllocator` and `replay`: a byte-exact model
  of PyTorch's CUDA caching allocator (512-byte rounding, small/large pools, 2 MiB and
  20 MiB segments, 2 MiB rounding from 10 MiB, best-fit reuse, splitting, coalescing,
  ``empty_cache``, OOM recovery). Given the exact allocation sequence, it gives the
  exact ``max_memory_reserved``.
* `cuda_context_bytes` and `cublas_workspace_bytes` (``workspace.py``): memory outside
  the estimate's tensors: the CUDA context (never seen by the allocator) and the cuBLAS
  workspaces (allocated through it).
* `to_device`: fills an estimate's ``reserved`` and ``context`` so that
  ``device_total`` is the ``nvidia-smi`` figure.

Not yet checked against a real GPU (tests/memory/allocator/test_allocator_cuda.py does that where
one is present).
"""

from __future__ import annotations

import math
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
from torchfit.memory.allocator.workspace import (
    cublas_workspace_bytes,
    matmul_threads,
    staged_for,
)
from torchfit.memory.outline import RecordedStep, StepOutline
from torchfit.memory.result import MemoryEstimate

if TYPE_CHECKING:
    from torchfit.memory.gpus import GPU

__all__ = [
    "DEFAULT_FRAGMENTATION",
    "approximate_reserved",
    "to_device",
]

#: Fragmentation allowance of `approximate_reserved`: the share of allocated bytes that
#: cached-but-unusable blocks add. Calibrated by replaying the real allocation traces of
#: CPU training steps (MLP, CNN, two GPT-2 sizes) through `replay`: reserved/allocated
#: peaks of 1.02-1.37, where the fixed 22 MiB term carries the small models
#: (benchmarks/allocator_fragmentation.py).
DEFAULT_FRAGMENTATION = 0.05


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
    """A key no caller's trace can contain: one thread's cuBLAS workspace in a replay."""

    def __init__(self, thread: int) -> None:
        self.thread = thread

    def __repr__(self) -> str:
        return f"<cuBLAS workspace of thread {self.thread}>"


def _with_workspaces(events: list[Sequence[object]], workspaces: tuple[int, ...]) -> None:
    """Put one allocation per thread's cuBLAS workspace before ``events``' first."""
    events[:0] = [(_WorkspaceKey(i), nbytes) for i, nbytes in enumerate(workspaces)]


def _trains(estimate: MemoryEstimate) -> bool:
    """Whether ``estimate``'s step runs a backward: its outline says, else its bytes do."""
    outline = estimate.outline
    if isinstance(outline, StepOutline | RecordedStep):
        return outline.training
    return bool(estimate.gradients or estimate.optimizer)


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
    training: bool | None = None,
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
    With ``workspace`` the cuBLAS workspaces (`cublas_workspace_bytes` per thread that
    runs matmuls: two in training, the forward's and autograd's backward thread's,
    `matmul_threads`) are added to the ``workspace`` category (and, in a replay,
    allocated before the first event, as the first matmuls would: the warm-up's first
    when there is one). ``context`` comes from
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
        workspace: Add the cuBLAS workspaces (False when the estimate already has them).
        training: Whether the step runs a backward (a second cuBLAS workspace); None: the
            estimate's outline says, else its gradient or optimizer bytes do.
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
    estimate = staged_for(estimate, record)
    notes = list(estimate.notes)
    workspaces: tuple[int, ...] = ()
    if workspace:
        capability = getattr(record, "compute_capability", None)
        threads = matmul_threads(training=_trains(estimate) if training is None else training)
        workspaces = (cublas_workspace_bytes(capability),) * threads
        where = "unknown GPU" if capability is None else f"compute capability {capability}"
        each = "" if threads == 1 else f" x {threads} (forward and backward threads)"
        notes.append(
            f"cuBLAS workspace {format_bytes(workspaces[0])}{each} added to workspace ({where})"
        )
    extra = sum(workspaces)
    total = estimate.total + extra
    if events is None and warmup is not None:
        raise ValueError(
            "warmup= was given without events=; pass the step's events too (a trace's "
            "events and warmup_events), or neither for the approximation"
        )
    replayed = None
    if events is None:
        replayed = _outline_reserved(estimate, workspaces, total, notes, search=oom_line)
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
            workspaces=workspaces,
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
    estimate: MemoryEstimate,
    workspaces: tuple[int, ...],
    total: int,
    notes: list[str],
    *,
    search: bool,
) -> tuple[int, int | None] | None:
    """Reserved bytes and the OOM line (with ``search``) from the estimate's outline replayed.

    A `RecordedStep` is replayed as it is, a `StepOutline` through `step_schedule`. None
    when the outline does not describe this estimate's step (its weights differ,
    or its replayed allocated peak is more than `_OUTLINE_AGREEMENT` away from
    ``total``): an estimate rescaled or replaced after the closed form made it.
    """
    outline = estimate.outline
    warm: list[Sequence[object]]
    if isinstance(outline, RecordedStep):  # a trace's own events
        warm, events = list(outline.warmup), list(outline.events)
    elif outline is None or outline.weights != estimate.weights:
        return None
    else:
        schedule = step_schedule(outline)
        warm, events = list(schedule.warmup), list(schedule.events)
    _with_workspaces(warm, workspaces)
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
    workspaces: tuple[int, ...],
    total: int,
    fragmentation: float,
    notes: list[str],
) -> int:
    """Reserved bytes of the caller's exact events (and warm-up), the rest approximated."""
    trace = list(events)
    warm = None if warmup is None else list(warmup)
    _with_workspaces(trace if warm is None else warm, workspaces)
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
