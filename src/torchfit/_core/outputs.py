"""What a step's model returns: calling it, the loss made from it, its dtype after the loop.

`run_step`, the speed workload and the meta-device pass call a model and take its loss
the same way: `call_model` with a tensor, a tuple or a dict; `compute_loss` from
``output.loss``, a ``loss_fn`` or a sum; `outputs_in_fp32` as Lightning Fabric's wrapped
module returns them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch.utils._pytree import tree_map_only

__all__ = ["call_model", "compute_loss", "outputs_in_fp32"]


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


def _fp32(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.float() if tensor.is_floating_point() else tensor


def outputs_in_fp32(output: Any) -> Any:
    """``output`` with every floating tensor cast to fp32, as Lightning Fabric returns it.

    Every Fabric precision plugin's ``convert_output`` casts the floating tensors of what
    the module ``fabric.setup`` returns to the default dtype (``_FabricModule.forward``,
    lightning/fabric/wrappers.py, since 2.1.0); objects other than tensors and their
    containers (a transformers cache) pass through.

    Example:
        >>> out = {"logits": torch.ones(2, dtype=torch.bfloat16), "ids": torch.ones(2).long()}
        >>> outputs_in_fp32(out)
        {'logits': tensor([1., 1.]), 'ids': tensor([1, 1])}
    """
    return tree_map_only(torch.Tensor, _fp32, output)
