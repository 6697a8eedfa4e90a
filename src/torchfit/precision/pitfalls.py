"""Known mixed-precision pitfalls, turned into clear errors before they happen.

Each check names what it found, why it breaks, and the fix. They run once, before the
first backward (on the autograd graph of the loss) and at the first optimizer step (on
the optimizers and schedulers); `MixedPrecision.check` runs them on a model up front.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn

from torchfit.precision.choice import Precision

__all__ = [
    "all_finite",
    "check_loss",
    "check_model",
    "check_optimizers",
    "check_schedulers",
    "check_trainable",
    "grads_of",
    "graph_leaves",
    "quantized_parts",
    "unscale_found_inf",
]


def graph_leaves(loss: torch.Tensor) -> list[torch.Tensor]:
    """The tensors a backward from ``loss`` will write ``.grad`` into (autograd leaves).

    Walks ``grad_fn.next_functions`` once; ``AccumulateGrad`` nodes hold the leaf in
    ``.variable``. Cost: one visit per graph node, done once per run.
    """
    leaves: list[torch.Tensor] = []
    seen: set[int] = set()
    stack: list[Any] = [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        variable = getattr(node, "variable", None)
        if isinstance(variable, torch.Tensor):
            leaves.append(variable)
        stack.extend(child for child, _ in node.next_functions)
    return leaves


def _describe(names: Sequence[str]) -> str:
    shown = ", ".join(names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def check_trainable(named: Iterable[tuple[str, torch.Tensor]], precision: Precision) -> None:
    """Raise if a trainable tensor is float16 (a model already halved).

    With a GradScaler, torch refuses after the backward ("Attempting to unscale FP16
    gradients."): fp16 gradients cannot be unscaled safely. Without one (bf16, fp32),
    fp16 weights get fp16 gradients with no loss scaling and small ones flush to zero.

    Raises:
        ValueError: with the names (or shapes) of the fp16 tensors and the fix.
    """
    halved = [name for name, t in named if t.requires_grad and t.dtype == torch.float16]
    if not halved:
        return
    if precision is Precision.FP16:
        why = (
            "the GradScaler cannot unscale fp16 gradients (torch raises 'Attempting to unscale "
            "FP16 gradients.' after the backward has run)"
        )
    else:
        why = (
            f"under {precision} there is no loss scaling, so their fp16 gradients underflow "
            "to zero silently"
        )
    raise ValueError(
        f"{len(halved)} trainable tensor(s) are float16 ({_describe(halved)}): {why}. Keep the "
        "weights in float32 (drop model.half() / .to(torch.float16), or call model.float()): "
        "autocast runs the low-precision math and the fp32 weights are the master copy."
    )


def check_loss(loss: torch.Tensor, device: torch.device, precision: Precision) -> None:
    """Checks before the first backward: a gradient path, the device, the weights' dtype.

    Raises:
        TypeError: ``loss`` is not a tensor.
        ValueError: no gradient path, another device, or float16 leaves (see
            `check_trainable`).
    """
    if not isinstance(loss, torch.Tensor):
        raise TypeError(f"backward() takes the loss tensor; got {type(loss).__name__}")
    if loss.grad_fn is None:
        raise ValueError(
            "the loss has no gradient path: nothing it was computed from requires grad. "
            "The model may be frozen, or quantized without trainable adapters (attach e.g. "
            "peft LoRA adapters), or the loss was computed under torch.no_grad() / "
            "torch.inference_mode()"
        )
    if loss.device.type != device.type:
        raise ValueError(
            f"the loss is on {loss.device} but MixedPrecision was built for {device}, so "
            f"autocast did not apply to it; pass device={loss.device.type!r}"
        )
    leaves = graph_leaves(loss)
    check_trainable([(f"a tensor of shape {tuple(t.shape)}", t) for t in leaves], precision)


def quantized_parts(model: nn.Module) -> list[str]:
    """Names of quantized pieces of ``model``: flags, bitsandbytes / torch.ao modules, int weights.

    Example:
        >>> quantized_parts(nn.Linear(2, 2))
        []
    """
    found = [
        f"model.{flag}"
        for flag in ("is_quantized", "is_loaded_in_4bit", "is_loaded_in_8bit")
        if getattr(model, flag, False) is True
    ]
    quantized_modules = ("bitsandbytes.", "torch.ao.nn.quantized", "torch.nn.quantized")
    for name, module in model.named_modules():
        if type(module).__module__.startswith(quantized_modules):
            found.append(f"{name or '(root)'} ({type(module).__name__})")
    found += [
        f"{name} ({param.dtype})"
        for name, param in model.named_parameters()
        if not param.is_floating_point()
    ]
    return found


def check_model(model: nn.Module, precision: Precision) -> None:
    """Raise if ``model`` cannot train: halved, or quantized with nothing trainable.

    Raises:
        ValueError: with what was found and the fix.
    """
    named = list(model.named_parameters())
    trainable = [name for name, p in named if p.requires_grad and p.is_floating_point()]
    parts = quantized_parts(model)
    if parts and not trainable:
        raise ValueError(
            f"the model is quantized ({_describe(parts)}) and has no trainable floating-point "
            "parameter: quantized weights cannot be trained directly. Attach trainable "
            "adapters (e.g. peft: get_peft_model(model, LoraConfig(...))) and train those, or "
            "load the model without quantization."
        )
    if not trainable:
        raise ValueError(
            "the model has no trainable parameter (every requires_grad is False); unfreeze "
            "what should learn, e.g. model.requires_grad_(True)"
        )
    check_trainable(named, precision)


def check_optimizers(optimizers: Sequence[torch.optim.Optimizer], *, scaler: bool) -> None:
    """Raise on optimizers the scaled step cannot drive: repeats, self-unscaling ones.

    torch's own ``fused=True`` optimizers are fine: MixedPrecision calls
    ``GradScaler.unscale_`` itself before clipping, and then the fused kernel gets no
    second scale. Optimizers whose ``step`` takes ``grad_scaler=`` (the deprecated
    contract of ``_step_supports_amp_scaling``) unscale inside their own step, so
    gradients could be neither unscaled once, nor clipped, nor checked before it.

    Raises:
        TypeError: not an optimizer, or the deprecated ``grad_scaler=`` contract.
        ValueError: the same optimizer twice (it would be unscaled twice).
    """
    for optimizer in optimizers:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                "optimizers must be a torch.optim.Optimizer or a list of them; got "
                f"{type(optimizer).__name__}"
            )
    if len({id(o) for o in optimizers}) != len(optimizers):
        raise ValueError(
            "the same optimizer was passed twice to step(); pass each optimizer once "
            "(GradScaler.unscale_ may run only once per optimizer per step)"
        )
    if not scaler:
        return
    for optimizer in optimizers:
        if getattr(optimizer, "_step_supports_amp_scaling", False) and (
            "grad_scaler" in inspect.signature(optimizer.step).parameters
        ):
            raise TypeError(
                f"{type(optimizer).__name__}.step takes grad_scaler=: it unscales gradients "
                "inside its own step, so they cannot be unscaled once, clipped and checked "
                "for inf/nan before it. Use a torch.optim optimizer (fused=True is fine), or "
                "MixedPrecision('bf16'), which needs no scaler."
            )


def check_schedulers(schedulers: Sequence[object]) -> None:
    """Raise on schedulers step() cannot advance: metric-driven or not schedulers at all.

    Raises:
        TypeError: with the fix.
    """
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau
    for scheduler in schedulers:
        if isinstance(scheduler, plateau):
            raise TypeError(
                "ReduceLROnPlateau steps on a metric, which step() does not have; call "
                "scheduler.step(metric) yourself when step() returns StepOutcome.STEPPED"
            )
        if not isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler):
            raise TypeError(
                f"scheduler= takes a torch.optim.lr_scheduler.LRScheduler or a list of them; "
                f"got {type(scheduler).__name__}"
            )


def all_finite(tensors: Sequence[torch.Tensor]) -> bool:
    """True when no element of ``tensors`` is inf or nan: one read pass, one sync per device.

    Uses the kernel behind ``GradScaler`` (``torch._amp_foreach_non_finite_check_and_unscale_``)
    with an inverse scale of 1.0, as ``GradScaler._check_inf_per_device`` does: it leaves
    the values bitwise unchanged (the kernels return ``val`` when the inverse scale is 1)
    and has no overflow false positives, unlike a 2-norm. Measured here on CPU (10
    tensors, 330k floats): 46 us, against 929 us for ``torch._foreach_norm(t, inf)``.

    Example:
        >>> all_finite([torch.ones(3), torch.tensor([1.0, float("nan")])])
        False
    """
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for tensor in tensors:
        values = tensor.coalesce()._values() if tensor.is_sparse else tensor  # noqa: SLF001
        groups.setdefault((values.device, values.dtype), []).append(values)
    found: dict[torch.device, torch.Tensor] = {}
    for (device, _), group in groups.items():
        if device not in found:
            found[device] = torch.zeros((), device=device)
        torch._amp_foreach_non_finite_check_and_unscale_(group, found[device], _one(device))
    return not any(flag.item() for flag in found.values())


@functools.cache
def _one(device: torch.device) -> torch.Tensor:
    """A 1.0 on ``device``, made once: the kernel only reads its inverse scale."""
    return torch.ones((), device=device)


def unscale_found_inf(
    scaler: torch.amp.GradScaler, optimizers: Sequence[torch.optim.Optimizer]
) -> bool:
    """``GradScaler.unscale_`` each optimizer once; True if any gradient is inf/nan.

    Reads the per-device flags that ``unscale_`` stored, the same ones
    ``GradScaler.step`` and ``update`` read (``_found_inf_per_device``, present since
    torch 1.x). One ``.item()`` in all. Without that accessor, checks the gradients.
    """
    for optimizer in optimizers:
        scaler.unscale_(optimizer)
    per_device = getattr(scaler, "_found_inf_per_device", None)
    if per_device is None:
        return not all_finite(grads_of(optimizers))
    flags: list[torch.Tensor] = []
    for index, optimizer in enumerate(optimizers):
        found = list(per_device(optimizer).values())
        if not found:
            # GradScaler.step would fail later with "No inf checks were recorded".
            raise RuntimeError(
                f"optimizer {index} ({type(optimizer).__name__}) has no parameter with a "
                "gradient: the loss did not reach its parameters. Pass step() only the "
                "optimizers whose parameters this backward reached."
            )
        flags += found
    total = flags[0]
    for flag in flags[1:]:
        total = total + flag.to(total.device)
    return bool(total.item())


def grads_of(optimizers: Sequence[torch.optim.Optimizer]) -> list[torch.Tensor]:
    """The ``.grad`` of every parameter of ``optimizers`` that has one."""
    return [
        p.grad
        for o in optimizers
        for group in o.param_groups
        for p in group["params"]
        if p.grad is not None
    ]
