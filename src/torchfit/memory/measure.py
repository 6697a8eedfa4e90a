"""Real peaks: the truth every torchfit estimate is judged by.

On CUDA the caching allocator keeps the statistics (``max_memory_allocated``,
``max_memory_reserved``). On CPU there are none, so `measure_peak` records the CPU
allocator's own allocation and free events with ``torch.profiler`` (``profile_memory``)
and replays them in time order: the peak of live bytes is exact, to the byte, for
everything allocated through PyTorch's allocator. Neither RSS nor a Python-level guess
is used.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import gc
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

import torch
from torch import nn

from torchfit._core import checks
from torchfit._core.in_backward import fused_if_asked
from torchfit._core.ledger import cuda_block_bytes, storage_key, storage_of
from torchfit._core.rng import kept_rng
from torchfit._core.step import (
    Loop,
    Mode,
    OptimizerFactory,
    make_optimizer,
    parse_mode,
    precision_dtypes,
    run_step,
)
from torchfit._core.tensors import reachable_tensors
from torchfit._core.torch_rules import mean_keeps_input
from torchfit._core.units import format_bytes
from torchfit.memory.step.run import check_step_device, given_loop, run_keywords

__all__ = ["Measurement", "live_bytes", "measure_peak", "measure_step"]

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Measurement(Generic[T]):
    """What `measure_peak` saw.

    Attributes:
        peak: Peak of allocated bytes while ``fn`` ran, above the bytes live at the start,
            plus `tracked`: directly comparable with `MemoryEstimate.total`.
        increment: Peak above the start alone (``peak - tracked``).
        tracked: Bytes held at the start by the tensors named in ``track``.
        end: Bytes still allocated when ``fn`` returned, above the start.
        reserved: CUDA only: the allocator's peak reserved bytes (process-wide).
        device: ``"cpu"`` or ``"cuda"``.
        seconds: Wall time of ``fn``.
        value: What ``fn`` returned.
    """

    peak: int
    increment: int
    tracked: int
    end: int
    reserved: int | None
    device: str
    seconds: float
    value: T

    def __str__(self) -> str:
        """One line per figure, in binary units."""
        lines = [
            f"Measurement ({self.device})",
            f"  peak       {format_bytes(self.peak):>12}",
            f"  increment  {format_bytes(self.increment):>12}",
            f"  tracked    {format_bytes(self.tracked):>12}",
            f"  end        {format_bytes(self.end):>12}",
        ]
        if self.reserved is not None:
            lines.append(f"  reserved   {format_bytes(self.reserved):>12}")
        return "\n".join(lines)


@checks.arguments(device=checks.one_of("cpu", "cuda"))
def live_bytes(*objects: object, device: str | None = None) -> int:
    """Bytes of the distinct storages behind every tensor reachable from ``objects``.

    Modules count their parameters, buffers and gradients; optimizers their parameters,
    gradients and state; dicts, lists and tuples their items. A storage shared by
    several tensors (views, tied weights) counts once (`torchfit._core.ledger.storage_key`).
    On CUDA each storage is rounded up to the allocator's 512-byte block. Meta tensors
    hold no bytes and are skipped.

    Args:
        *objects: Tensors, modules, optimizers, or containers of them.
        device: Count only storages on this device type (``"cpu"``, ``"cuda"``); all when
            ``None``.

    Raises:
        ValueError: A tensor has no storage (sparse, nested).

    Example:
        >>> w = torch.zeros(10, 10)
        >>> live_bytes(w, w[0], [w.t()])
        400
    """
    storages: dict[int, int] = {}
    for tensor in reachable_tensors(objects):
        if tensor.device.type == "meta" or (device is not None and tensor.device.type != device):
            continue
        storage = storage_of(tensor)
        if storage is None:
            raise ValueError(
                f"live_bytes counts storages, and a {tensor.layout} tensor of shape "
                f"{tuple(tensor.shape)} has none; pass its parts instead (for a sparse COO "
                "tensor: t.indices() and t.values())"
            )
        size = storage.nbytes()
        storages[storage_key(storage)] = cuda_block_bytes(size) if tensor.is_cuda else size
    return sum(storages.values())


def _infer_device(track: tuple[object, ...]) -> str:
    # 0-dim CPU tensors do not vote: torch.optim keeps its step counts on the CPU when
    # neither fused nor capturable (torch/optim/adam.py, _init_group), whatever the model.
    types = {
        t.device.type
        for t in reachable_tensors(track)
        if not (t.device.type == "cpu" and t.dim() == 0)
    } - {"meta"}
    if len(types) > 1:
        raise ValueError(
            f"the tracked tensors live on several devices ({sorted(types)}); "
            "pass device='cpu' or device='cuda' to say which one to measure"
        )
    if types:
        return types.pop()
    return "cuda" if torch.cuda.is_available() else "cpu"


# The profiler tags each allocation event with a c10 DeviceType.
_CPU_DEVICE_TYPE = torch._C._autograd.DeviceType.CPU  # noqa: SLF001 - no public alias exists


def _cpu_events(prof: torch.profiler.profile) -> list[tuple[int, int]]:
    events = [
        (e.start_ns(), e.nbytes())  # type: ignore[union-attr]
        for e in prof.profiler.kineto_results.events()  # type: ignore[union-attr]
        if e.name() == "[memory]" and e.device_type() == _CPU_DEVICE_TYPE
    ]
    events.sort(key=lambda item: item[0])  # stable: equal stamps keep recording order
    return events


@contextlib.contextmanager
def _silenced_stderr() -> Iterator[None]:
    """Hide Kineto's "USDT ... profiler_start/stop" lines, printed from C++ on fd 2.

    No environment variable turns them off in torch 2.13; only profiler start and stop
    run inside, so nothing else is hidden.
    """
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no usable fd 2 (embedded interpreters): leave it be
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:  # noqa: PTH123 - a raw fd is needed
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _replay(deltas: Iterable[int]) -> tuple[int, int]:
    """Peak (>= 0) and final value of the running sum of allocation deltas."""
    live = peak = 0
    for delta in deltas:
        live += delta
        peak = max(peak, live)
    return peak, live


@checks.arguments(device=checks.one_of("cpu", "cuda"))
def measure_peak(
    fn: Callable[..., T],
    *args: Any,
    track: object = (),
    device: str | None = None,
    **kwargs: Any,
) -> Measurement[T]:
    """Run ``fn(*args, **kwargs)`` once and measure the peak of real allocations.

    Args:
        fn: The code to measure, e.g. one training step.
        *args: Passed to ``fn``.
        track: Objects whose tensors already exist and belong in the peak (model,
            optimizer, inputs): their live bytes at the start are added, so the result
            compares directly with an estimate's `total`. A single object or a tuple.
        device: ``"cpu"`` or ``"cuda"``; inferred from the tracked tensors, else CUDA when
            available.
        **kwargs: Passed to ``fn``.

    Returns:
        A `Measurement` with the peak, what was tracked, and ``fn``'s return value.

    Raises:
        ValueError: ``device`` is not ``"cpu"``/``"cuda"``, or CUDA was asked for and is
            not available.

    Example:
        >>> def step():
        ...     a = torch.ones(1000)  # 4000 bytes
        ...     b = torch.ones(500)  # 2000 bytes: 6000 live
        ...     del a, b
        ...     return torch.ones(10)  # 40 bytes, still alive at the end
        >>> m = measure_peak(step, device="cpu")
        >>> m.peak, m.end
        (6000, 40)
    """
    track_tuple = track if isinstance(track, tuple) else (track,)
    device = _infer_device(track_tuple) if device is None else device
    if device not in {"cpu", "cuda"}:
        raise ValueError(f"device must be 'cpu' or 'cuda'; got {device!r}")
    tracked = live_bytes(*track_tuple, device=device)
    if device == "cuda":
        return _measure_cuda(fn, args, kwargs, tracked)
    prof = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
    )
    with _silenced_stderr():
        prof.start()
    start = time.perf_counter()
    try:
        value = fn(*args, **kwargs)
    finally:
        seconds = time.perf_counter() - start
        with _silenced_stderr():
            prof.stop()
    increment, end = _replay(delta for _, delta in _cpu_events(prof))
    return Measurement(
        peak=tracked + increment,
        increment=increment,
        tracked=tracked,
        end=end,
        reserved=None,
        device="cpu",
        seconds=seconds,
        value=value,
    )


def _measure_cuda(
    fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any], tracked: int
) -> Measurement[T]:
    if not torch.cuda.is_available():
        raise ValueError("device='cuda' was asked for but CUDA is not available; use device='cpu'")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    start = time.perf_counter()
    value = fn(*args, **kwargs)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    increment = torch.cuda.max_memory_allocated() - base
    return Measurement(
        peak=tracked + increment,
        increment=increment,
        tracked=tracked,
        end=torch.cuda.memory_allocated() - base,
        reserved=torch.cuda.max_memory_reserved(),
        device="cuda",
        seconds=seconds,
        value=value,
    )


@checks.arguments(
    model=checks.model(),
    example_inputs=checks.inputs(),
    gradient_accumulation_steps=checks.whole(at_least=1),
    autocast_dtype=checks.among(torch.bfloat16, torch.float16),
)
def measure_step(
    model: nn.Module,
    example_inputs: object,
    *,
    mode: str = "train",
    optimizer: str | OptimizerFactory | torch.optim.Optimizer | None = "adamw",
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    autocast_dtype: torch.dtype | None = None,
    set_to_none: bool = True,
    device: str | None = None,
    precision: str | None = None,
    gradient_accumulation_steps: int = 1,
    keep_output: bool = False,
    optimizer_in_backward: bool = False,
    fp32_output: bool = False,
    step: Any = None,
) -> Measurement[None]:
    """Measure the real steady-state peak of one step, leaving ``model`` untouched.

    The step runs on a deep copy of the model (and of the optimizer, when one is given),
    after one warm-up step so that optimizer state exists, exactly as torchfit's
    estimators define a step (see `trace`): forward, loss (``output.loss``, else
    ``loss_fn(output)``, else a sum of the output), backward, ``optimizer.step()``,
    ``zero_grad(set_to_none=...)``. RNG states are restored afterwards.

    Args:
        model: The model; never modified.
        example_inputs: A tensor, a tuple (positional) or a dict (keyword arguments).
        mode: ``"train"`` or ``"inference"`` (forward under ``torch.inference_mode``).
        optimizer: A name (``"sgd"``, ``"sgd-momentum"``, ``"adam"``, ``"adamw"``,
            ``"adamw-8bit"``), a factory ``lambda params: ...``, an optimizer over
            ``model``'s parameters (copied with it), or ``None``.
        loss_fn: Makes the loss from the output when it has no ``.loss``.
        autocast_dtype: Run forward and loss under ``torch.autocast`` with this dtype
            (``torch.bfloat16``/``torch.float16``), as `trace` does with the same argument.
        set_to_none: Passed to ``zero_grad``; ``False`` keeps gradients alive between steps.
        device: See `measure_peak`.
        precision: As in `trace`: ``"*-true"`` converts the copy, ``"*-mixed"`` autocasts.
        gradient_accumulation_steps: Micro-batches per optimizer step, as in `trace`.
        keep_output: Keep the output referenced through backward, as in `trace`.
        optimizer_in_backward: Step each parameter during backward, as in `trace`.
        fp32_output: Cast the output to fp32 before the loss (Lightning Fabric), as in `trace`.
        step: Or the loop as a `torchfit.Step`, as `trace` takes it; its ``device`` must
            be the model's (the step runs where the model is).

    Returns:
        The `Measurement` of the measured step; ``tracked`` covers the copied model, its
        optimizer state and the inputs.

    Example:
        >>> net = torch.nn.Linear(256, 256)
        >>> m = measure_step(net, torch.randn(32, 256), optimizer="sgd", device="cpu")
        >>> m.peak > live_bytes(net)
        True
    """
    if step is not None:
        loop_keywords = given_loop(locals())
        if device is not None:
            loop_keywords["device"] = device
        where = "measure_step(model, inputs, step=)"
        run = run_keywords(step, model, example_inputs, loop_keywords, where=where)
        check_step_device(model, run["device"], where=where)
        if mean_keeps_input(step.torch_version) != mean_keeps_input():
            raise ValueError(
                f"{where} runs under the installed torch {torch.__version__}, whose autograd "
                f"keeps other tensors than Step(torch_version={step.torch_version!r})'s: run "
                "it under that torch, or use torchfit.estimate or memory.trace, which follow it"
            )
        return measure_step(model, example_inputs, loss_fn=loss_fn, **run)
    step_mode = parse_mode(mode)
    cast, autocast_dtype = precision_dtypes(precision, autocast_dtype)
    loop = Loop(
        accumulation_steps=gradient_accumulation_steps,
        set_to_none=set_to_none,
        keep_output=keep_output,
        optimizer_in_backward=optimizer_in_backward,
        fp32_output=fp32_output,
    )
    if cast is not None and isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(
            f"precision={precision!r} converts a copy of the model, which an optimizer "
            "built over the original cannot follow; pass the optimizer by name or factory"
        )
    with kept_rng(cuda=True):
        opt: torch.optim.Optimizer | None
        if isinstance(optimizer, torch.optim.Optimizer):
            work, opt = copy.deepcopy((model, optimizer))
        else:
            work = copy.deepcopy(model)
            if cast is not None:
                work.to(cast)
            opt = make_optimizer(optimizer, work.parameters()) if step_mode is Mode.TRAIN else None
        work.train(step_mode is Mode.TRAIN)
        step_opt = fused_if_asked(
            opt, in_backward=optimizer_in_backward, training=step_mode is Mode.TRAIN
        )

        def step() -> None:
            run_step(
                work,
                example_inputs,
                mode=step_mode,
                optimizer=step_opt,
                loss_fn=loss_fn,
                autocast_dtype=autocast_dtype,
                loop=loop,
            )

        if step_mode is Mode.TRAIN:
            step()  # warm-up: optimizer state exists from here on
        gc.collect()
        tracked = (work, getattr(step_opt, "optimizers", step_opt), example_inputs)
        return measure_peak(step, track=tracked, device=device)
