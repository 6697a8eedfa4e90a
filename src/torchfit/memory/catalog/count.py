"""`count_parameters`: distinct parameters, tied weights counted once."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["count_parameters"]


def count_parameters(model: nn.Module, *, trainable_only: bool = False) -> int:
    """The exact number of distinct parameters: tied or shared weights count once.

    A parameter registered under two names (a tied LM head) is one parameter. On real
    devices, two parameter objects that view the same storage with the same offset,
    shape and strides are also counted once; meta tensors have no storage, so there
    only identity ties are seen.

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
    seen: set[tuple[Any, ...]] = set()
    total = 0
    for param in model.parameters():  # already yields each Parameter object once
        if trainable_only and not param.requires_grad:
            continue
        key = _storage_key(param)
        if key is not None:
            if key in seen:
                continue
            seen.add(key)
        total += param.numel()
    return total


def _storage_key(tensor: torch.Tensor) -> tuple[Any, ...] | None:
    if tensor.device.type == "meta" or tensor.numel() == 0:
        return None
    try:
        pointer = tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # fake or otherwise storage-less tensors
        return None
    if pointer == 0:
        return None
    return (tensor.device, pointer, tensor.storage_offset(), tuple(tensor.shape), tensor.stride())
