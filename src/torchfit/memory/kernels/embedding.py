"""Scratch of the CPU embedding kernels: ``.contiguous()`` copies of their inputs."""

from __future__ import annotations

from typing import Any

from torchfit.memory.kernels.machine import CpuMachine
from torchfit.memory.kernels.tensors import copy_if_strided

__all__ = ["embedding", "embedding_backward"]


def embedding(cpu: CpuMachine, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    """``embedding``: ``indices.contiguous()``.

    Measured (torch 2.13 CPU): transformers' expanded token_type_ids buffer, (4, 64) ->
    2,048 B.
    """
    del cpu, kwargs, out
    return copy_if_strided(args[1])


def embedding_backward(
    cpu: CpuMachine, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any
) -> int:
    """``embedding_dense_backward``: ``grad.contiguous()`` and ``indices.contiguous()``.

    Measured (torch 2.13 CPU): 2,304 B for an expanded (4, 9, 16) gradient, + 288 B for
    transposed (4, 9) indices.
    """
    del cpu, kwargs, out
    return copy_if_strided(args[0]) + copy_if_strided(args[1])
