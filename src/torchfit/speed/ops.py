"""The currency of `torchfit.speed`: the kernels of one step, with their FLOPs and bytes.

A step is a list of `Op` rows: one row per distinct kernel (the same shapes, dtype and
phase counted together). Each row knows its class (`OpKind`: matmul, convolution,
attention, memory-bound, dequantization), the floating-point operations it performs
and the bytes it reads and writes in device memory. The roofline
(`torchfit.speed.roofline`) turns each row into seconds on a card.
"""

from __future__ import annotations

import dataclasses
import enum
from collections import Counter
from collections.abc import Iterable

__all__ = ["Op", "OpKind", "Phase", "merge"]


class OpKind(enum.StrEnum):
    """What bounds a kernel, and which efficiency curve times it."""

    MATMUL = "matmul"  # mm, addmm, bmm, baddbmm: tensor cores (or fp32 SIMT)
    CONV = "conv"  # cuDNN convolutions, forward and backward (implicit GEMM)
    ATTENTION = "attention"  # fused SDPA (flash / memory-efficient), forward and backward
    MEMORY = "memory"  # elementwise, norms, reductions, copies, casts, optimizer: bytes
    DEQUANT = "dequant"  # 4/8-bit weights expanded to 16 bits before each matmul
    PYTHON = "python"  # no kernel: a layer's own Python on the host (`Op.host_s`)


class Phase(enum.StrEnum):
    """Where in the step a kernel runs (recomputation of checkpointing is backward)."""

    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"


@dataclasses.dataclass(frozen=True)
class Op:
    """One kernel, ``count`` times.

    Attributes:
        name: The ATen op (``"mm"``, ``"native_layer_norm"``) or a closed-form name
            (``"adamw"``, ``"dequantize_4bit"``).
        kind: Its class (`OpKind`).
        phase: Forward, backward (recomputation included) or optimizer.
        flops: Floating-point operations of one call (multiply-add = 2).
        bytes: Device-memory bytes one call reads plus writes.
        dtype: The dtype it computes in: ``"fp32"``, ``"bf16"``, ``"fp16"``.
        shape: What its efficiency depends on: ``(batch, m, n, k)`` for a matmul or the
            implicit GEMM of a convolution; ``(batch, heads, seq_q, seq_k, head_dim,
            causal)`` for attention; ``()`` otherwise.
        backend: Attention: ``"flash"`` or ``"efficient"`` (what SDPA picks on CUDA);
            a matmul: ``"unaligned"`` when its operands' row strides are not multiples
            of 16 bytes (`torchfit.speed.traffic.tma_aligned`), else ``""``.
        count: How many times the step runs it.
        host_s: For a ``PYTHON`` row, the host seconds of one call.
    """

    name: str
    kind: OpKind
    phase: Phase
    flops: float
    bytes: float
    dtype: str
    shape: tuple[int, ...] = ()
    backend: str = ""
    count: int = 1
    host_s: float = 0.0

    def times(self, count: int) -> Op:
        """The same kernel run ``count`` times as often."""
        return dataclasses.replace(self, count=self.count * count)

    @property
    def key(self) -> tuple[object, ...]:
        """Everything but the count: rows with the same key are the same kernel."""
        return (
            self.name,
            self.kind,
            self.phase,
            self.flops,
            self.bytes,
            self.dtype,
            self.shape,
            self.backend,
            self.host_s,
        )


def merge(ops: Iterable[Op]) -> tuple[Op, ...]:
    """The same ops with equal kernels counted once (order of first appearance).

    Example:
        >>> a = Op("mm", OpKind.MATMUL, Phase.FORWARD, 8.0, 12.0, "bf16", (1, 2, 2, 2))
        >>> [op.count for op in merge([a, a, a.times(3)])]
        [5]
    """
    counts: Counter[tuple[object, ...]] = Counter()
    first: dict[tuple[object, ...], Op] = {}
    for op in ops:
        counts[op.key] += op.count
        first.setdefault(op.key, op)
    return tuple(dataclasses.replace(first[key], count=counts[key]) for key in first)
