"""One training or inference step, defined once.

The traced estimator, `measure_step` and the tests all run *the same* step, so that an
estimate and a measurement always describe the same code: forward, loss, backward,
optimizer step, ``zero_grad``.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn

__all__ = [
    "Mode",
    "OptimizerFactory",
    "OptimizerName",
    "call_model",
    "compute_loss",
    "make_optimizer",
    "parse_mode",
    "parse_optimizer",
    "run_step",
]

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


class Mode(enum.StrEnum):
    """What a step does: train (forward, backward, optimizer) or inference (forward only)."""

    TRAIN = "train"
    INFERENCE = "inference"


class OptimizerName(enum.StrEnum):
    """Optimizers with a known memory model."""

    NONE = "none"
    SGD = "sgd"
    SGD_MOMENTUM = "sgd-momentum"
    ADAM = "adam"
    ADAMW = "adamw"
    ADAMW_8BIT = "adamw-8bit"


_OPTIMIZER_ALIASES = {
    "momentum": OptimizerName.SGD_MOMENTUM,
    "sgd_momentum": OptimizerName.SGD_MOMENTUM,
    "adam8bit": OptimizerName.ADAMW_8BIT,
    "adamw8bit": OptimizerName.ADAMW_8BIT,
    "adam-8bit": OptimizerName.ADAMW_8BIT,
    "adamw_8bit": OptimizerName.ADAMW_8BIT,
    "8bit-adam": OptimizerName.ADAMW_8BIT,
}


def parse_mode(value: str | Mode) -> Mode:
    """``"train"``/``"training"`` or ``"inference"``/``"eval"`` as a `Mode`.

    Example:
        >>> parse_mode("training")
        <Mode.TRAIN: 'train'>
    """
    key = str(value).strip().lower()
    key = {"training": "train", "eval": "inference", "infer": "inference"}.get(key, key)
    try:
        return Mode(key)
    except ValueError:
        raise ValueError(f"unknown mode {value!r}; expected 'train' or 'inference'") from None


def parse_optimizer(value: str | OptimizerName | None) -> OptimizerName:
    """An optimizer name as an `OptimizerName`; ``None`` means no optimizer.

    Example:
        >>> parse_optimizer("AdamW")
        <OptimizerName.ADAMW: 'adamw'>
        >>> parse_optimizer("adam8bit")
        <OptimizerName.ADAMW_8BIT: 'adamw-8bit'>
    """
    if value is None:
        return OptimizerName.NONE
    key = str(value).strip().lower()
    if key in _OPTIMIZER_ALIASES:
        return _OPTIMIZER_ALIASES[key]
    try:
        return OptimizerName(key)
    except ValueError:
        names = ", ".join(repr(o.value) for o in OptimizerName)
        raise ValueError(
            f"unsupported optimizer {value!r}; expected one of {names}, "
            "or a factory such as lambda params: torch.optim.SGD(params, lr=0.1)"
        ) from None


def make_optimizer(
    optimizer: str | OptimizerName | OptimizerFactory | torch.optim.Optimizer | None,
    params: Iterable[nn.Parameter],
) -> torch.optim.Optimizer | None:
    """Build the optimizer a step uses: from a name, a factory, or as given.

    Named optimizers use PyTorch's defaults (``foreach`` where PyTorch picks it), so an
    estimate for ``"adamw"`` describes ``torch.optim.AdamW(params)``.
    """
    if isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    if callable(optimizer) and not isinstance(optimizer, str):
        built = optimizer(params)
        if not isinstance(built, torch.optim.Optimizer):
            raise TypeError(
                f"the optimizer factory returned {type(built).__name__}, not a "
                "torch.optim.Optimizer; pass e.g. lambda params: torch.optim.SGD(params, lr=0.1)"
            )
        return built
    name = parse_optimizer(optimizer)
    trainable = [p for p in params if p.requires_grad]
    if name is OptimizerName.NONE:
        return None
    if name is OptimizerName.ADAMW_8BIT:
        from torchfit._core.imports import require  # noqa: PLC0415 - optional dependency

        bnb = require("bitsandbytes", feature="optimizer='adamw-8bit'")
        built_8bit: torch.optim.Optimizer = bnb.optim.AdamW8bit(trainable, lr=1e-3)
        return built_8bit
    return _TORCH_OPTIMIZERS[name](trainable)


_TORCH_OPTIMIZERS: dict[OptimizerName, OptimizerFactory] = {
    OptimizerName.SGD: lambda ps: torch.optim.SGD(ps, lr=1e-3),
    OptimizerName.SGD_MOMENTUM: lambda ps: torch.optim.SGD(ps, lr=1e-3, momentum=0.9),
    OptimizerName.ADAM: lambda ps: torch.optim.Adam(ps, lr=1e-3),
    OptimizerName.ADAMW: lambda ps: torch.optim.AdamW(ps, lr=1e-3),
}


def call_model(model: Callable[..., Any], example_inputs: object) -> Any:
    """Call ``model`` with a tensor, a tuple (positional) or a dict (keyword arguments)."""
    if isinstance(example_inputs, Mapping):
        return model(**example_inputs)
    if isinstance(example_inputs, tuple | list):
        return model(*example_inputs)
    return model(example_inputs)


def _sum_tensors(output: object) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output.float().sum() if output.is_floating_point() else None
    values: Iterable[object]
    if isinstance(output, Mapping):
        values = output.values()
    elif isinstance(output, tuple | list):
        values = output
    else:
        return None
    total: torch.Tensor | None = None
    for value in values:
        part = _sum_tensors(value)
        if part is not None:
            total = part if total is None else total + part
    return total


def compute_loss(
    output: object, loss_fn: Callable[[Any], torch.Tensor] | None = None
) -> torch.Tensor:
    """The loss of a step: ``output.loss`` if present, else ``loss_fn(output)``, else a sum.

    Raises:
        ValueError: the output has no floating-point tensor to sum and no ``loss_fn`` was
            given.
    """
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, Mapping):
        loss = output.get("loss")
    if isinstance(loss, torch.Tensor):
        return loss
    if loss_fn is not None:
        return loss_fn(output)
    summed = _sum_tensors(output)
    if summed is None:
        raise ValueError(
            f"cannot make a loss from a model output of type {type(output).__name__}: it has "
            "no .loss and no floating-point tensor; pass loss_fn=lambda output: ..."
        )
    return summed


def run_step(
    model: nn.Module,
    example_inputs: object,
    *,
    mode: Mode,
    optimizer: torch.optim.Optimizer | None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    set_to_none: bool = True,
    autocast_dtype: torch.dtype | None = None,
) -> None:
    """One step. Train: forward, loss, backward, ``optimizer.step()``, ``zero_grad``.

    Inference: forward under ``torch.inference_mode`` (the output is dropped at the end).
    With ``autocast_dtype``, ``torch.autocast("cpu", ...)`` wraps forward and loss only,
    not backward or the optimizer step, as PyTorch recommends.
    """
    autocast = (
        contextlib.nullcontext()
        if autocast_dtype is None
        else torch.autocast("cpu", dtype=autocast_dtype)
    )
    if mode is Mode.INFERENCE:
        with torch.inference_mode(), autocast:
            call_model(model, example_inputs)
        return
    with autocast:
        output = call_model(model, example_inputs)
        loss = compute_loss(output, loss_fn)
        del output
    loss.backward()  # type: ignore[no-untyped-call]
    del loss
    if optimizer is not None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=set_to_none)
    else:
        model.zero_grad(set_to_none=set_to_none)
