"""`count_parameters`: distinct parameters, tied weights counted once."""

from __future__ import annotations

from torch import nn

from torchfit._core import checks
from torchfit._core.ledger import view_key

__all__ = ["count_parameters"]


@checks.arguments(model=checks.model())
def count_parameters(model: nn.Module, *, trainable_only: bool = False) -> int:
    """The exact number of distinct parameters: tied or shared weights count once.

    A parameter registered under two names (a tied LM head) is one parameter, and so
    are two parameter objects that are the same view of one storage (same storage,
    offset, shape and strides: `torchfit._core.ledger.view_key`), on any device, meta
    and fake tensors included. Different views of one storage (a fused QKV weight split
    into three parameters) are different parameters.

    The parameters come from ``model.parameters()``, not from the shared tensor walk
    (`torchfit._core.tensors.reachable_tensors`): that walk also yields buffers and
    gradients, which are not parameters.

    Args:
        model: Any ``nn.Module``, on any device (meta included).
        trainable_only: Count only parameters with ``requires_grad``.

    Example:
        >>> lin = nn.Linear(4, 4)
        >>> tied = nn.ModuleDict({"a": lin, "b": nn.Linear(4, 4)})
        >>> tied["b"].weight = lin.weight
        >>> count_parameters(tied)  # 16 shared weights + 2 biases of 4
        24
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"count_parameters needs an nn.Module; got {type(model).__name__}")
    seen: set[object] = set()
    total = 0
    for param in model.parameters():  # already yields each Parameter object once
        if trainable_only and not param.requires_grad:
            continue
        key = view_key(param)
        if key is not None:
            if key in seen:
                continue
            seen.add(key)
        total += param.numel()
    return total
