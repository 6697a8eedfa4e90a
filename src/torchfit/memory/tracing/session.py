"""Running a step on fake copies under the tracker: the engine behind `trace`."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from torchfit._core.ledger import CUDA_BLOCK
from torchfit._core.rng import kept_rng
from torchfit._core.units import format_bytes
from torchfit.memory.analytic.formulas import sdpa_is_flash
from torchfit.memory.catalog.build import transformers_without_data
from torchfit.memory.kernels.autocast import cuda_autocast_on_cpu, cuda_autocast_runs_on_cpu
from torchfit.memory.kernels.cpu import workspace_rules
from torchfit.memory.kernels.cuda import FusedSdpa, cuda_notes, prefer_foreach
from torchfit.memory.kernels.cuda_reduce import REFERENCE_SMS
from torchfit.memory.tracing.fake import fake_copy, reachable_tensors
from torchfit.memory.tracing.result import Trace, build_trace
from torchfit.memory.tracing.tracker import Tracker, UntraceableOpError

__all__ = ["Session", "run_session"]

# What each rule models, for the notes: CPU kernels', then where CUDA's differ.
_RULE_WHAT = {
    "aten.convolution.default": "oneDNN reorders of source, weights and output",
    "aten.convolution_backward.default": "oneDNN reorders and grad_output copy",
    "aten.native_layer_norm_backward.default": "per-thread dgamma/dbeta partial sums",
    "aten.native_group_norm_backward.default": "per-sample ds/db buffers",
    "aten.native_batch_norm.default": "per-channel statistics",
    "aten.native_batch_norm_backward.default": "an input-sized temporary",
    "aten._scaled_dot_product_flash_attention_for_cpu.default": "per-thread flash buffers",
    "aten._scaled_dot_product_flash_attention_for_cpu_backward.default": (
        "per-thread flash buffers"
    ),
    "aten._safe_softmax.default": "-inf masks",
    "aten.embedding.default": "indices copy",
    "aten.embedding_dense_backward.default": "gradient/indices copies",
    "aten.mm.default": "copies of operands BLAS cannot read",
    "aten.addmm.default": "copies of operands BLAS cannot read",
    "aten.bmm.default": "copies of operands BLAS cannot read",
    "aten.baddbmm.default": "copies of operands BLAS cannot read",
}
_CUDA_RULE_WHAT = {
    "aten.convolution.default": "cuDNN workspaces: NHWC copies of input, weights and output",
    "aten.convolution_backward.default": "cuDNN workspaces of input and weight gradients",
    "aten._scaled_dot_product_flash_attention_for_cpu_backward.default": (
        "fused attention backward's fp32 accumulators"
    ),
}


@dataclasses.dataclass
class Session:
    """One trace: the fake objects, the step to run on them, and the options."""

    objects: tuple[Any, ...]  # the fake copies (modules, optimizers, tensors, containers)
    modules: list[tuple[str, nn.Module]]  # fake modules to watch, with a path prefix
    step: Callable[[], object]  # runs one step on ``objects``
    baseline: Callable[[], list[tuple[torch.Tensor, str, str]]]
    device: str
    warmup: int
    autocast_dtype: torch.dtype | None
    progress: bool
    describe: str  # what the step is, for the notes
    fake_mode: FakeTensorMode
    tracker: Tracker = dataclasses.field(init=False)
    handles: list[Any] = dataclasses.field(default_factory=list)
    kinds: dict[str, str] = dataclasses.field(default_factory=dict)
    cuda_autocasts: list[torch.dtype] = dataclasses.field(default_factory=list)


def new_fake_mode() -> FakeTensorMode:
    """A fake-tensor mode; a real tensor met in the step is an error (never written)."""
    return FakeTensorMode()


def copy_to_fake(objects: tuple[Any, ...], fake_mode: FakeTensorMode) -> tuple[Any, ...]:
    """Fake copies of the user's objects (see `fake_copy`)."""
    return fake_copy(objects, fake_mode)


def _optimizers(obj: object) -> Iterator[torch.optim.Optimizer]:
    if isinstance(obj, torch.optim.Optimizer):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _optimizers(value)
    elif isinstance(obj, list | tuple):
        for value in obj:
            yield from _optimizers(value)


def _install(session: Session) -> tuple[int, bool]:
    """Hooks on the fake copies; returns (module count, whether foreach was switched on)."""
    tracker = session.tracker
    modules = session.modules
    for label, module in modules:
        session.handles += tracker.watch_module(module, prefix=label)
        for name, sub in module.named_modules():
            path = ".".join(p for p in (label, name) if p)
            session.kinds[path or type(sub).__name__] = type(sub).__name__
    foreach = False
    for optimizer in _optimizers(session.objects):
        session.handles += tracker.watch_optimizer(optimizer)
        if session.device == "cuda":
            foreach = prefer_foreach(optimizer) or foreach
    for tensor in reachable_tensors(session.objects):
        if tensor.requires_grad and tensor.is_leaf:
            session.handles.append(tracker.watch_parameter(tensor))
    return len(modules), foreach


@contextlib.contextmanager
def _progress(session: Session) -> Iterator[None]:
    if not session.progress:
        yield
        return
    from torchfit._core.imports import require  # noqa: PLC0415 - optional dependency

    tqdm = require("tqdm", feature="trace(..., progress=True)")
    bar = tqdm.tqdm(desc="tracing", unit=" ops")
    tracker = session.tracker

    def tick() -> None:
        if tracker.ops % 64 == 0:
            bar.set_postfix_str(tracker.phase, refresh=False)
            bar.update(64)

    tracker.on_op = tick
    try:
        yield
    finally:
        tracker.on_op = None
        bar.close()


@contextlib.contextmanager
def _young_gc_only() -> Iterator[None]:
    """Automatic garbage collection off while tracing (restored after).

    The warm-up's reference cycles then stay in the young generations, and collecting
    those (as ``measure_step`` collects before measuring) is fast; a full collection
    costs ~0.4 s with transformers loaded.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextlib.contextmanager
def _step_context(session: Session, sdpa: FusedSdpa | None) -> Iterator[None]:
    """What a traced step runs inside: the target device's kernels and autocast lists."""
    with contextlib.ExitStack() as stack:
        if sdpa is not None:
            stack.enter_context(sdpa.installed())
        if session.device == "cuda":
            stack.enter_context(cuda_autocast_on_cpu())
            stack.enter_context(cuda_autocast_runs_on_cpu(session.cuda_autocasts))
        if "transformers" in sys.modules:  # a model of transformers: its MoE experts
            stack.enter_context(transformers_without_data())
        if session.autocast_dtype is not None:
            stack.enter_context(torch.autocast("cpu", dtype=session.autocast_dtype))
        yield


def _execute(session: Session, sdpa: FusedSdpa | None) -> int:
    """Warm-up steps, then the measured step, both recorded; returns the leftover bytes ignored.

    The warm-up is recorded from the weights and inputs alone (what a run starts with
    after loading), so that its events (`Tracker.warmup_events`) replay into the
    allocator state the measured step starts from.
    """
    tracker = session.tracker

    def one_step() -> None:
        with _step_context(session, sdpa):
            session.step()

    try:
        with (
            _young_gc_only(),
            kept_rng(),
            session.fake_mode,
            tracker,
            _progress(session),
        ):
            if session.warmup:  # recorded too, from what a run starts with after loading
                tracker.start(session.baseline())
            for _ in range(session.warmup):
                tracker.phase = "forward"
                one_step()
            tracker.drain()
            gc.collect(1)
            dropped = tracker.start(session.baseline())
            if sdpa is not None:
                sdpa.fused = sdpa.math = sdpa.dropouts = 0
            one_step()
            tracker.stop()
    except UntraceableOpError as e:
        raise RuntimeError(str(e)) from e
    except Exception as e:
        e.add_note(
            "(raised while torchfit traced the step on fake tensors; if the code needs "
            "real tensor data, use torchfit.memory.estimate instead)"
        )
        raise
    finally:
        tracker.recording = False
        for handle in session.handles:
            handle.remove()
    return dropped


def _notes(session: Session, dropped: int, sdpa: FusedSdpa | None, *, foreach: bool) -> list[str]:
    tracker = session.tracker
    notes = [
        (
            f"traced on fake tensors (nothing allocated): {session.describe}; "
            f"{session.warmup} warm-up step(s) first, their peak excluded"
        ),
        (
            "activations = tensors made in forward/loss and alive at the peak (saved for "
            "backward or in flight); workspace = transients of backward, optimizer, kernels"
        ),
    ]
    if tracker.rule_hits:
        what = _CUDA_RULE_WHAT if session.device == "cuda" else _RULE_WHAT
        hits = ", ".join(
            f"{op.removeprefix('aten.').split('.')[0]} x{count}"
            + (f" ({what[op]})" if op in what else "")
            for op, count in sorted(tracker.rule_hits.items())
        )
        if session.device == "cuda":
            notes.append(
                "CUDA kernel scratch modelled (torchfit.memory.kernels.cuda_reduce: reduction "
                "staging buffers, attention backward, cuDNN convolution workspaces): "
                f"{hits}; staging buffers sized for "
                f"{REFERENCE_SMS} SMs, and again for the card it is placed on"
            )
        else:
            notes.append(f"CPU kernel scratch modelled (torchfit.memory.kernels.cpu): {hits}")
    autocast = session.autocast_dtype is not None or "autocast" in session.describe
    if session.autocast_dtype is not None:
        notes.append(f"autocast: torch.autocast('cpu', dtype={session.autocast_dtype})")
    if session.cuda_autocasts:
        autocast = True
        dtypes = ", ".join(sorted({str(d) for d in session.cuda_autocasts}))
        notes.append(
            f"the step's torch.autocast('cuda', dtype={dtypes}) runs on the fake CPU tensors"
        )
    if autocast and session.device == "cuda":
        notes.append(
            "autocast with CUDA's op lists (aten/src/ATen/autocast_mode.h): softmax, "
            "layer_norm, exp, pow, sum and the losses in fp32"
        )
    if autocast and session.device == "cpu":
        notes.append(
            "autocast on CPU: of oneDNN's bf16 scratch, only AMX's weight-gradient GEMMs and "
            "stem backward-weights convolutions are modelled; forward and input-gradient "
            "GEMMs, convolution forward and backward-data, and every bf16 kernel without AMX "
            "are not (measured up to 4% low on tiny transformers without AMX)"
        )
    if dropped:
        notes.append(f"{format_bytes(dropped)} left over from the warm-up were not counted")
    if session.device == "cuda":
        convolutions = sum(op == "aten.convolution.default" for *_, op in tracker.history.values())
        notes += cuda_notes(
            fused_sdpa=sdpa.fused if sdpa else 0,
            math_sdpa=sdpa.math if sdpa else 0,
            dropouts=sdpa.dropouts if sdpa else 0,
            foreach=foreach,
            convolutions=convolutions,
        )
    return notes


def _cuda_fuses(dtype: torch.dtype, grouped: bool) -> bool:  # noqa: FBT001 - FusedSdpa's callback
    """CUDA's choice for attention in ``dtype`` (`sdpa_is_flash`, the estimators' rule)."""
    fp32_grouped = grouped and dtype == torch.float32
    return sdpa_is_flash(device="cuda", training=True, dropout=0.0, fp32_grouped=fp32_grouped)


def run_session(session: Session) -> Trace:
    """Warm up, trace the measured step, and build the `Trace`."""
    cuda = session.device == "cuda"
    session.tracker = Tracker(
        block=CUDA_BLOCK if cuda else 1, workspace=workspace_rules(session.device)
    )
    _, foreach = _install(session)
    sdpa = FusedSdpa(_cuda_fuses) if cuda else None
    dropped = _execute(session, sdpa)
    notes = _notes(session, dropped, sdpa, foreach=foreach)
    return build_trace(session.tracker, device=session.device, notes=notes, kinds=session.kinds)
