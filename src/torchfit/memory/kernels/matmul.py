"""Scratch of the CPU matrix products: copies of operands BLAS cannot read."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchfit.memory.kernels.machine import CpuMachine
from torchfit.memory.kernels.tensors import blas_ok, dense_bytes

__all__ = ["matmul_rule"]

Rule = Callable[[CpuMachine, tuple[Any, ...], dict[str, Any], Any], int]


def matmul_rule(first: int) -> Rule:
    """The rule of ``mm``/``bmm`` (operands from 0) or ``addmm``/``baddbmm`` (from 1)."""

    def rule(cpu: CpuMachine, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
        del cpu, kwargs, out
        # An operand BLAS cannot read (an expanded gradient with stride 0) is copied:
        # measured (torch 2.13 CPU) mm((4, 10) expanded, (10, 32)) -> 160 B.
        return sum(dense_bytes(t) for t in args[first : first + 2] if not blas_ok(t))

    return rule
