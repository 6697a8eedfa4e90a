"""Fake copies of a user's modules, optimizers and tensors, for `torchfit.memory.trace`.

A fake copy has the same structure, shapes, dtypes, strides and storage sharing as the
original, but its tensors are ``FakeTensor`` objects with no data: running the user's
code on it allocates nothing. The originals are only read, never written.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeCopyMode, FakeTensorMode

from torchfit._core.tensors import reachable_tensors

__all__ = ["check_no_quantized_parameters", "fake_copy", "reachable_tensors"]


class _Faker:
    """Turns real (or meta) tensors into fake CPU tensors, one fake per original."""

    def __init__(self, fake_mode: FakeTensorMode) -> None:
        self.fake_mode = fake_mode
        self.memo: dict[int, Any] = {}

    def data(self, tensor: torch.Tensor) -> torch.Tensor:
        """A fake CPU tensor with ``tensor``'s size, stride and dtype (no autograd)."""
        plain = tensor.detach()
        if plain.device.type == "cpu" and plain.numel() <= 1:
            # Scalars (an optimizer's ``step``) keep their value, as PyTorch's own fake
            # constants do, so that ``.item()`` on them works. The value is a private
            # copy: a constant is computed on for real, and in-place updates of the
            # copy must not reach the user's tensor.
            converter = self.fake_mode.fake_tensor_converter
            with torch.no_grad():
                private = plain.clone()
            return converter.from_real_tensor(self.fake_mode, private, make_constant=True)
        if plain.device.type == "cpu":
            # from_tensor keeps storage sharing between views and tied tensors and reads
            # no data (it builds meta tensors with the same metadata).
            return self.fake_mode.from_tensor(plain, static_shapes=True)
        # Meta tensors (models built on the meta device) and tensors of other devices:
        # the trace runs on CPU fakes; the target device is modelled separately.
        with self.fake_mode:
            return torch.empty_strided(
                tuple(plain.shape), plain.stride(), dtype=plain.dtype, device="cpu"
            )

    def tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        """The fake counterpart of ``tensor``: a parameter stays a parameter, grads follow."""
        if id(tensor) in self.memo:
            return self.memo[id(tensor)]  # type: ignore[no-any-return]
        fake: torch.Tensor
        if isinstance(tensor, nn.Parameter):
            fake = nn.Parameter(self.data(tensor), requires_grad=tensor.requires_grad)
        else:
            fake = self.data(tensor)
            if tensor.requires_grad:
                fake.requires_grad_()
        self.memo[id(tensor)] = fake
        if tensor.grad is not None:
            fake.grad = self.tensor(tensor.grad)
        return fake


def fake_copy(objects: tuple[Any, ...], fake_mode: FakeTensorMode) -> tuple[Any, ...]:
    """Deep-copy ``objects`` with every tensor replaced by a fake CPU tensor.

    Parameters, buffers, gradients, optimizer state and tensors in containers are
    converted first (so that tied weights stay tied and meta tensors become CPU fakes);
    any other tensor met by the deep copy (a plain tensor attribute of a module) is
    faked by PyTorch's ``FakeCopyMode``. The originals are only read.

    Args:
        objects: Modules, optimizers, tensors and containers of them, copied together so
            that an optimizer's parameters are the copied model's parameters.
        fake_mode: The fake-tensor mode the copies belong to.

    Returns:
        The copies, in the same structure.
    """
    faker = _Faker(fake_mode)
    for tensor in reachable_tensors(objects):
        faker.tensor(tensor)
    memo = dict(faker.memo)
    with FakeCopyMode(fake_mode):
        copied: tuple[Any, ...] = copy.deepcopy(objects, memo)
    return copied


def check_no_quantized_parameters(model: nn.Module) -> None:
    """Refuse bitsandbytes' parameter subclasses, which cannot become fake tensors."""
    for name, param in model.named_parameters():
        kind = type(param)
        if kind.__module__.startswith("bitsandbytes"):
            raise TypeError(
                f"parameter {name!r} is a bitsandbytes {kind.__name__} (a 4/8-bit layer), "
                "which trace cannot copy to fake tensors. Estimate the quantized model with "
                "torchfit.memory.estimate(config, dtype='nf4' or 'int8', trainable_params=...), "
                "or measure a real step with measure_step(model, inputs)"
            )
