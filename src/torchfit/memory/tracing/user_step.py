"""`trace_step`: the user's own training step, traced on fake copies of its objects."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from torchfit._core import checks
from torchfit.memory.tracing.fake import reachable_tensors
from torchfit.memory.tracing.result import Trace
from torchfit.memory.tracing.scaler import SCALER_NOTE, scaler_assumes_finite
from torchfit.memory.tracing.session import Session, copy_to_fake, new_fake_mode, run_session
from torchfit.memory.tracing.tracer import parse_trace_device

__all__ = ["trace_step"]


def _step_baseline(objects: tuple[Any, ...]) -> Callable[[], list[tuple[torch.Tensor, str, str]]]:
    """trace_step: categories of what the user's objects hold when the step starts."""

    def baseline() -> list[tuple[torch.Tensor, str, str]]:
        leaves = _flatten(objects)
        rows: list[tuple[torch.Tensor, str, str]] = []
        for module in (m for m in leaves if isinstance(m, nn.Module)):
            rows += [(t, "weights", "(weights)") for t in (*module.parameters(), *module.buffers())]
        tensors = list(reachable_tensors(objects))
        rows += [(t, "weights", "(weights)") for t in tensors if isinstance(t, nn.Parameter)]
        rows += [(t.grad, "gradients", "(gradients)") for t in tensors if t.grad is not None]
        for opt in (o for o in leaves if isinstance(o, torch.optim.Optimizer)):
            for state in opt.state.values():
                rows += [(t, "optimizer", "(optimizer)") for t in reachable_tensors(state)]
        rows += [(t, "activations", "(inputs)") for t in tensors]
        return rows

    return baseline


def _flatten(obj: object) -> list[Any]:
    if isinstance(obj, dict):
        return [leaf for value in obj.values() for leaf in _flatten(value)]
    if isinstance(obj, list | tuple):
        return [leaf for value in obj for leaf in _flatten(value)]
    return [obj]


@checks.arguments(autocast_dtype=checks.among(torch.bfloat16, torch.float16))
def trace_step(
    fn: Callable[..., object],
    *args: Any,
    device: str = "cpu",
    warmup: int = 1,
    autocast_dtype: torch.dtype | None = None,
    progress: bool = False,
    **kwargs: Any,
) -> Trace:
    """Trace the user's own training step ``fn(*args, **kwargs)`` on fake copies.

    Modules, optimizers and tensors in ``args``/``kwargs`` (also inside lists, tuples
    and dicts) are copied together to fake tensors, so an optimizer still points at its
    model's parameters; ``fn`` runs ``warmup`` times, then once more while every
    allocation is recorded. The user's objects are never touched. ``device``,
    ``warmup``, ``autocast_dtype`` and ``progress`` are options of the trace; every
    other keyword goes to ``fn``.

    Args:
        fn: One step, e.g. ``def step(model, opt, x, y): ...`` doing forward, loss,
            backward and ``opt.step()``.
        *args: Passed to ``fn`` (as fake copies).
        device: ``"cpu"`` or ``"cuda"``, as in `trace`.
        warmup: Steps run before the measured one (1: optimizer state exists).
        autocast_dtype: Run under ``torch.autocast("cpu", dtype=...)``. With
            ``device="cuda"``, ``fn``'s own ``torch.autocast("cuda", ...)`` regions run
            as CPU autocast with CUDA's op lists (the fake tensors are CPU tensors).
        progress: Show a tqdm progress bar.
        **kwargs: Passed to ``fn`` (as fake copies).

    A ``torch.amp.GradScaler`` in ``fn`` (the AMP loop) is traced as a step with finite
    gradients: its optimizer steps, and the estimate's notes say so.

    Returns:
        A `Trace`; its ``estimate`` compares with ``measure_peak(fn, *args,
        track=args)`` run after the same warm-up.

    Raises:
        RuntimeError: ``fn`` runs an op fake tensors cannot run (see `trace`).

    Example:
        >>> def step(model, opt, x):
        ...     model(x).square().mean().backward()
        ...     opt.step()
        ...     opt.zero_grad()
        >>> net = torch.nn.Linear(32, 32)
        >>> opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        >>> t = trace_step(step, net, opt, torch.randn(16, 32))
        >>> t.estimate.optimizer == 4 * (32 * 32 + 32)  # momentum buffers
        True
    """
    target = parse_trace_device(device)
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0 steps; got {warmup}")
    fake_mode = new_fake_mode()
    fake_args, fake_kwargs = copy_to_fake((args, kwargs), fake_mode)
    objects = (fake_args, fake_kwargs)
    found = [(f"arg{i}", m) for i, m in enumerate(fake_args) if isinstance(m, nn.Module)]
    found += [(k, m) for k, m in fake_kwargs.items() if isinstance(m, nn.Module)]
    modules = [("", found[0][1])] if len(found) == 1 else found
    session = Session(
        objects=objects,
        modules=modules,
        step=lambda: fn(*fake_args, **fake_kwargs),
        baseline=_step_baseline(objects),
        device=target.value,
        warmup=warmup,
        autocast_dtype=autocast_dtype,
        progress=progress,
        describe=f"the user's step {getattr(fn, '__qualname__', repr(fn))}",
        fake_mode=fake_mode,
    )
    with scaler_assumes_finite() as stepped:
        traced = run_session(session)
    if not stepped:
        return traced
    notes = (*traced.estimate.notes, SCALER_NOTE)
    return dataclasses.replace(traced, estimate=traced.estimate.replace(notes=notes))
