"""The traced estimator: run the real step on fake tensors and count live storages.

The analytic estimator explains; this one is exact for the code that really runs: the
user's own forward, loss, backward and optimizer step (`torchfit._core.step.run_step`, the
step `measure_step` measures) execute on fake copies of the model, optimizer and inputs
(``torch._subclasses.fake_tensor.FakeTensorMode``), so nothing is allocated and no GPU
is needed. A dispatch-level tracker registers every storage an op creates and learns of
every free, so the result is the peak of live bytes of the step, broken down by category
at the moment of the peak, with the modules that hold the most.

One warm-up step runs first, so that optimizer state exists, and its peak is excluded:
the estimate is the steady-state peak, directly comparable with
``measure_step(model, inputs, ...).peak`` (which includes the model, optimizer state
and inputs alive at the start).

What fake tensors cannot see is modelled explicitly: kernel scratch of CPU kernels
(`torchfit.memory.kernels.cpu`, one measured rule per op), and for ``device="cuda"`` the
allocator's 512-byte blocks, the fused SDPA kernels and the ``foreach`` optimizers
(`torchfit.memory.kernels.cuda`). The estimate's ``notes`` list the rules applied.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from torchfit._core import checks
from torchfit._core.in_backward import InBackward, fused_if_asked
from torchfit._core.step import (
    Loop,
    Mode,
    OptimizerFactory,
    make_optimizer,
    parse_mode,
    precision_dtypes,
    run_step,
)
from torchfit._core.tensors import check_materialized
from torchfit._core.torch_rules import autograd_of
from torchfit.memory.kernels.cuda import CUBLAS_NOTE
from torchfit.memory.result import MemoryEstimate
from torchfit.memory.step import Step
from torchfit.memory.step.run import given_loop, run_keywords
from torchfit.memory.tracing.fake import check_no_quantized_parameters, reachable_tensors
from torchfit.memory.tracing.result import Trace
from torchfit.memory.tracing.session import Session, copy_to_fake, new_fake_mode, run_session

if TYPE_CHECKING:
    from torchfit.memory.gpus import GPU

__all__ = [
    "TraceDevice",
    "cast_floating",
    "parse_trace_device",
    "trace",
    "trace_events",
    "traced_step",
    "with_recorded_step",
]


class TraceDevice(enum.StrEnum):
    """The device whose allocations a trace predicts."""

    CPU = "cpu"
    CUDA = "cuda"


def parse_trace_device(value: str | TraceDevice) -> TraceDevice:
    """The target device of a trace: ``"cpu"`` or ``"cuda"`` (``"cuda:0"`` too)."""
    key = str(value).strip().lower()
    key = key.split(":", 1)[0]  # "cuda:0" -> "cuda"
    try:
        return TraceDevice(key)
    except ValueError:
        raise ValueError(
            f"unsupported trace device {value!r}; expected 'cpu' or 'cuda' (the trace runs "
            "on fake CPU tensors and models the target device's allocator)"
        ) from None


def cast_floating(model: nn.Module, dtype: torch.dtype) -> None:
    """Give ``model``'s floating parameters and buffers ``dtype``, keeping tied ones tied.

    ``nn.Module.to`` would swap each tensor in place, which fake tensors (weakly
    referenced by their mode) refuse; new tensors are set instead.
    """
    memo: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for table in (module._parameters, module._buffers):  # noqa: SLF001 - set in place
            for name, tensor in list(table.items()):
                if tensor is None or not tensor.is_floating_point():
                    continue
                if id(tensor) not in memo:
                    data = tensor.detach().to(dtype)
                    is_param = isinstance(tensor, nn.Parameter)
                    new = nn.Parameter(data, tensor.requires_grad) if is_param else data
                    memo[id(tensor)] = new
                table[name] = memo[id(tensor)]  # type: ignore[assignment]


def _model_baseline(
    model: nn.Module, optimizers: list[torch.optim.Optimizer], inputs: object
) -> Callable[[], list[tuple[torch.Tensor, str, str]]]:
    """What the step starts with, categorized the way `measure_step` tracks it."""

    def baseline() -> list[tuple[torch.Tensor, str, str]]:
        params = list(model.parameters())
        rows = [(t, "weights", "(weights)") for t in (*params, *model.buffers())]
        rows += [(p.grad, "gradients", "(gradients)") for p in params if p.grad is not None]
        for optimizer in optimizers:
            for state in optimizer.state.values():
                rows += [(t, "optimizer", "(optimizer)") for t in reachable_tensors(state)]
        rows += [(t, "activations", "(inputs)") for t in reachable_tensors(inputs)]
        return rows

    return baseline


def _training_loop(loop: Loop, optimizer: str) -> str:
    """The traced training loop in words, for the notes."""
    micro = f"{loop.accumulation_steps} x (forward, loss, backward)"
    passes = "forward, loss, backward" if loop.accumulation_steps == 1 else micro
    describe = f"{passes}, {optimizer} step, zero_grad(set_to_none={loop.set_to_none})"
    if loop.fp32_output:
        describe += "; the output cast to fp32 before the loss (Lightning Fabric)"
    if loop.keep_output:
        describe += "; the output kept through backward"
    if loop.optimizer_in_backward:
        fused = f", {optimizer} stepped per parameter in backward"
        describe = describe.replace(f", {optimizer} step", fused)
    return describe


@checks.arguments(
    model=checks.model(),
    example_inputs=checks.inputs(),
    gradient_accumulation_steps=checks.whole(at_least=1),
    autocast_dtype=checks.among(torch.bfloat16, torch.float16),
)
def trace_events(
    model: nn.Module,
    example_inputs: object,
    *,
    mode: str = "train",
    optimizer: str | OptimizerFactory | torch.optim.Optimizer | None = "adamw",
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    autocast_dtype: torch.dtype | None = None,
    set_to_none: bool = True,
    device: str = "cpu",
    progress: bool = False,
    precision: str | None = None,
    gradient_accumulation_steps: int = 1,
    keep_output: bool = False,
    optimizer_in_backward: bool = False,
    fp32_output: bool = False,
) -> Trace:
    """Trace one step of ``model`` and return everything: estimate, events, storages.

    Takes the same arguments as `trace`; see there. The `Trace` adds the time-ordered
    allocation events (``("alloc", id, nbytes)``, ``("free", id, nbytes)``) that an allocator
    model can replay, and what each storage is.

    Example:
        >>> net = torch.nn.Linear(64, 64)
        >>> t = trace_events(net, torch.randn(8, 64), optimizer="sgd")
        >>> t.peak == t.estimate.total
        True
        >>> t.events[0][0]
        'alloc'
    """
    check_materialized(model, what="trace")
    check_no_quantized_parameters(model)
    cast, autocast_dtype = precision_dtypes(precision, autocast_dtype)
    if cast is not None and isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(
            f"precision={precision!r} converts a copy of the model, which an optimizer "
            "built over the original cannot follow; pass the optimizer by name or factory"
        )
    loop = Loop(
        accumulation_steps=gradient_accumulation_steps,
        set_to_none=set_to_none,
        keep_output=keep_output,
        optimizer_in_backward=optimizer_in_backward,
        fp32_output=fp32_output,
    )
    step_mode = parse_mode(mode)
    target = parse_trace_device(device)
    training = step_mode is Mode.TRAIN
    fake_mode = new_fake_mode()
    fake_opt: torch.optim.Optimizer | None
    if isinstance(optimizer, torch.optim.Optimizer):
        fake_model, fake_opt, fake_inputs = copy_to_fake(
            (model, optimizer, example_inputs), fake_mode
        )
    else:
        fake_model, fake_inputs = copy_to_fake((model, example_inputs), fake_mode)
        fake_opt = None
        if cast is not None:
            with fake_mode:
                cast_floating(fake_model, cast)
        if training:
            with fake_mode:
                fake_opt = make_optimizer(optimizer, fake_model.parameters())
    step_opt = fused_if_asked(fake_opt, in_backward=optimizer_in_backward, training=training)
    stepped = (
        step_opt.optimizers if isinstance(step_opt, InBackward) else [fake_opt] if fake_opt else []
    )
    fake_model.train(training)
    step = functools.partial(
        run_step,
        fake_model,
        fake_inputs,
        mode=step_mode,
        optimizer=step_opt,
        loss_fn=loss_fn,
        autocast_dtype=autocast_dtype,
        loop=loop,
    )
    if training:
        what = type(fake_opt).__name__ if fake_opt is not None else "no optimizer"
        describe = _training_loop(loop, what)
        if cast is not None:
            describe += f"; the model in {cast} ({precision})"
    else:
        describe = "forward under torch.inference_mode"
    if autocast_dtype is not None:
        describe += (
            f"; torch.autocast('cpu', dtype={autocast_dtype}) around forward and loss only, "
            "as PyTorch recommends"
        )
    session = Session(
        objects=(fake_model, stepped, fake_inputs),
        modules=[("", fake_model)],
        step=step,
        baseline=_model_baseline(fake_model, stepped, fake_inputs),
        device=target.value,
        warmup=1 if training else 0,
        autocast_dtype=None,  # scoped inside the step: run_step wraps forward and loss
        progress=progress,
        describe=describe,
        fake_mode=fake_mode,
    )
    return run_session(session)


@checks.arguments(
    model=checks.model(),
    example_inputs=checks.inputs(),
    gradient_accumulation_steps=checks.whole(at_least=1),
    autocast_dtype=checks.among(torch.bfloat16, torch.float16),
)
def trace(
    model: nn.Module,
    example_inputs: object,
    *,
    mode: str = "train",
    optimizer: str | OptimizerFactory | torch.optim.Optimizer | None = "adamw",
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    autocast_dtype: torch.dtype | None = None,
    set_to_none: bool = True,
    device: str = "cpu",
    progress: bool = False,
    gpu: str | GPU | None = None,
    precision: str | None = None,
    gradient_accumulation_steps: int = 1,
    keep_output: bool = False,
    optimizer_in_backward: bool = False,
    fp32_output: bool = False,
    step: Step | None = None,
) -> MemoryEstimate:
    """Predict the peak memory of one step by running it on fake tensors.

    The step is torchfit's step (`measure_step` measures the same one): forward; the
    loss is ``output.loss`` when present, else ``loss_fn(output)``, else a sum of the
    output; backward; ``optimizer.step()``; ``zero_grad(set_to_none=...)``. One warm-up
    step runs first so that optimizer state exists; its peak is excluded. Nothing of
    ``model`` (parameters, buffers, gradients, training flag), of an optimizer passed in,
    of the inputs or of the RNG state is changed, and no memory is allocated for the
    tensors of the step, so a 7B model built on the meta device traces on a laptop.

    Args:
        model: The model: real, or built on the meta device
            (``torch.device("meta")``, ``accelerate.init_empty_weights()``).
        example_inputs: A tensor, a tuple (positional) or a dict (keyword arguments):
            one batch. Meta tensors are accepted.
        mode: ``"train"`` or ``"inference"`` (forward under ``torch.inference_mode``).
        optimizer: ``"sgd"``, ``"sgd-momentum"``, ``"adam"``, ``"adamw"`` (PyTorch
            defaults), a factory ``lambda params: torch.optim.SGD(params, lr=0.1)``, an
            optimizer over ``model``'s parameters (copied, never stepped), or ``None``.
        loss_fn: Makes the loss from the output when it has no ``.loss``.
        autocast_dtype: Run forward and loss under ``torch.autocast("cpu",
            dtype=...)``, e.g. ``torch.bfloat16``; backward and the optimizer step run
            outside it, as PyTorch recommends.
        set_to_none: Passed to ``zero_grad``: ``False`` keeps gradients alive between
            steps, and the estimate counts them.
        device: The device to predict: ``"cpu"`` (exact CPU allocator bytes plus
            measured kernel-scratch rules) or ``"cuda"`` (512-byte blocks, fused SDPA,
            ``foreach`` optimizers; see the notes), with ``reserved`` from replaying the
            allocation sequence through the caching-allocator model (the warm-up's, then
            the step's: ``max_memory_reserved`` of a step measured after a warm-up step),
            the CUDA context and the cuBLAS workspace
            (`torchfit.memory.allocator.to_device`).
        progress: Show a tqdm progress bar (needs tqdm).
        gpu: With ``device="cuda"``: the card (name or `GPU`), for its CUDA context and
            cuBLAS workspace; ``None``: the defaults for an unknown card.
        precision: Lightning's names, as in `estimate`: ``"*-true"`` traces a copy of
            the model converted to 16 bits, ``"*-mixed"`` autocasts forward and loss.
        gradient_accumulation_steps: Micro-batches (each ``example_inputs``) per
            optimizer step; gradients accumulate across them.
        keep_output: Keep the forward's output referenced through backward, as
            ``outputs = model(**batch); outputs.loss.backward()`` does.
        optimizer_in_backward: Step each parameter from its post-accumulate-grad hook and
            free its gradient there, as torchtune's ``optimizer_in_bwd`` does (one
            optimizer per parameter, of the optimizer's class and settings).
        fp32_output: Cast the forward's floating outputs to fp32 before the loss, as a
            Lightning Fabric loop's wrapped module does (`Step.fp32_output`).
        step: Or the loop as a `torchfit.Step` (mode, optimizer, precision, zero_grad,
            accumulation, output kept and cast, optimizer in backward, ``device``). Its
            fields of the model (LoRA, a 4/8-bit base, ...) are refused: the model is
            built; its batch, when set, must be the inputs'.

    Returns:
        A `MemoryEstimate` at the peak: weights, gradients, optimizer state, activations
        (made in forward and alive at the peak), workspace (backward, optimizer and
        kernel transients), overhead (CUDA rounding); ``layers`` lists the modules whose
        activations are alive at the peak, ``peak_at`` says where it happens, ``notes``
        which rules were applied.

    Raises:
        RuntimeError: The step cannot run on fake tensors (an op whose output shape or
            control flow depends on data, a custom kernel without a fake
            implementation); the message names the op and points to
            ``torchfit.memory.estimate``.
        ValueError: An unknown ``mode``, ``optimizer`` or ``device``.

    Example:
        >>> net = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU())
        >>> est = trace(net, torch.randn(32, 256), optimizer="adamw")
        >>> est.weights == 4 * (256 * 256 + 256)
        True
        >>> est.device, est.total > 3 * est.weights
        ('cpu', True)
    """
    if step is not None:
        loop = given_loop(locals())
        if device != "cpu":
            loop["device"] = device
        run = run_keywords(step, model, example_inputs, loop, where="trace(model, inputs, step=)")
        with autograd_of(step.torch_version):  # what that torch's autograd keeps
            return trace(model, example_inputs, loss_fn=loss_fn, progress=progress, gpu=gpu, **run)
    result = trace_events(
        model,
        example_inputs,
        mode=mode,
        optimizer=optimizer,
        loss_fn=loss_fn,
        autocast_dtype=autocast_dtype,
        set_to_none=set_to_none,
        device=device,
        progress=progress,
        precision=precision,
        gradient_accumulation_steps=gradient_accumulation_steps,
        keep_output=keep_output,
        optimizer_in_backward=optimizer_in_backward,
        fp32_output=fp32_output,
    )
    if device != "cuda":
        return result.estimate
    from torchfit.memory.allocator import to_device  # noqa: PLC0415 - light, but only for CUDA

    # the exact allocation sequence gives the allocator's reserved bytes by replay, the
    # step's after the warm-up's (reserved as measured after a warm-up step); to_device
    # also adds the cuBLAS workspaces the tracer leaves out
    return to_device(with_recorded_step(result), gpu=gpu)


def traced_step(model: nn.Module, example_inputs: object, step: Step) -> MemoryEstimate:
    """``step`` traced on fake tensors: its allocated peak, with its events for `to_device`.

    What `torchfit.memory.estimate` gives on ``device="cuda"`` for a model without a
    closed form (a CNN, a ViT): the step's own kernels under CUDA's rules (autocast's op
    lists, fused attention, ``foreach`` optimizers), and its exact allocation sequence.

    Raises:
        ValueError: ``step`` sets a field that describes the model (LoRA, a 4/8-bit base,
            frozen parameters), which a trace takes from the model itself.
        RuntimeError: The step cannot run on fake tensors.
    """
    run = run_keywords(step, model, example_inputs, {}, where="estimate(model, step)")
    return with_recorded_step(trace_events(model, example_inputs, **run))


def with_recorded_step(result: Trace) -> MemoryEstimate:
    """A CUDA trace's estimate carrying its own events (`RecordedStep`) for `to_device`.

    `to_device` replays them through the caching-allocator model for ``reserved`` and the
    OOM line, on whichever card it is given, and adds the cuBLAS workspaces the trace
    leaves out (two when the step has a backward).
    """
    estimate = result.estimate
    return estimate.replace(
        notes=tuple(n for n in estimate.notes if n != CUBLAS_NOTE),
        outline=result.recorded(),
    )
