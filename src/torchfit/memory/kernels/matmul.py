"""Scratch of the CPU matrix products: copies of operands, oneDNN's bf16 GEMM buffers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from torchfit.memory.kernels.machine import CpuMachine
from torchfit.memory.kernels.onednn_matmul import transposed_a_scratch
from torchfit.memory.kernels.tensors import blas_ok, dense_bytes

__all__ = ["matmul_rule", "mm"]

Rule = Callable[[CpuMachine, tuple[Any, ...], dict[str, Any], Any], int]


def matmul_rule(first: int) -> Rule:
    """The rule of ``mm``/``bmm`` (operands from 0) or ``addmm``/``baddbmm`` (from 1)."""

    def rule(cpu: CpuMachine, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
        del cpu, kwargs, out
        # An operand BLAS cannot read (an expanded gradient with stride 0) is copied:
        # measured (torch 2.13 CPU) mm((4, 10) expanded, (10, 32)) -> 160 B.
        return sum(dense_bytes(t) for t in args[first : first + 2] if not blas_ok(t))

    return rule


_copies = matmul_rule(0)


def _transposed(t: torch.Tensor) -> bool:
    """A 2-D column-major matrix of more than one row (oneDNN's ``ba`` source)."""
    rows, cols = t.shape
    return rows > 1 and cols > 1 and t.stride(0) == 1 and t.stride(1) == rows


def mm(cpu: CpuMachine, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    """``mm``: copies of unreadable operands; on AMX, a bf16 weight gradient's scratchpad.

    A bfloat16 ``mm`` of ``M * K * N > 4096`` runs oneDNN's ``brg_matmul``
    (``use_mkldnn_bf16_matmul`` in aten/src/ATen/native/mkldnn/Matmul.cpp). With AMX its
    scratchpad for a transposed A and a plain B, the weight gradient ``grad.t() @ x`` of a
    ``Linear``, is `transposed_a_scratch`; other layouts and CPUs without AMX keep the
    copies rule (their oneDNN buffers are not modelled).
    """
    a, b = args[0], args[1]
    if (
        cpu.amx
        and cpu.l1
        and cpu.l2
        and a.dtype == b.dtype == torch.bfloat16
        and a.dim() == b.dim() == 2
        and _transposed(a)
        and b.is_contiguous()
    ):
        m, k = a.shape
        return transposed_a_scratch(m, k, b.shape[1], threads=cpu.threads, l1=cpu.l1, l2=cpu.l2)
    return _copies(cpu, args, kwargs, out)
