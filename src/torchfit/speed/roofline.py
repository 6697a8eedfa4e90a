"""Seconds of one kernel on one card: the roofline with efficiency curves (`curves`).

A matmul or convolution runs on the tensor cores of its dtype (an fp32 convolution on
TF32 ones, as cuDNN does by default; an fp32 matmul on the CUDA cores, as cuBLAS does
by default) at the fitted matmul curve; fused attention at FlashAttention-2's measured
share of the peak for its sequence length, head size and mask, less the padding of its
last tiles (`torchfit.speed.curves.flash_tile_fill`; fp32 attention on Ampere and later
as three TF32 products: `torchfit.speed.cards`); everything else streams
its bytes at the achievable bandwidth plus a fixed part (`torchfit.speed.curves.memory_curve`:
Hopper's measured one, else 83% and 2 µs). Every kernel costs at least a few microseconds.
A convolution on tensor cores with NCHW activations adds the two transposes cuDNN runs
around it (`torchfit.speed.record.nchw_bytes`), each a memory-bound kernel reading
and writing its bytes. On Hopper a 16-bit matmul whose row strides are not multiples of
16 bytes cannot load through the tensor memory accelerator (``wgmma`` kernels need it;
`torchfit.speed.traffic.tma_aligned`) and runs on ``mma.sync`` at `MMA_SYNC_SHARE` of
the peak (the operands decide; the output is stored without the TMA).
"""

from __future__ import annotations

from torchfit.speed.cards import THREE_TF32, Peaks
from torchfit.speed.curves import (
    MEMORY_EFFICIENCY,
    MEMORY_KERNEL_S,
    attention_efficiency,
    flash_padded,
    flash_tile_fill,
    matmul_fit,
    memory_curve,
)
from torchfit.speed.ops import Op, OpKind, Phase

__all__ = ["MMA_SYNC_SHARE", "kernel_seconds", "math_of"]

#: The share of Hopper's tensor-core peak the pre-Hopper ``mma.sync`` instruction can
#: reach: "about 2/3" (FlashAttention-3, Shah et al. 2024, arXiv:2407.08608, section 2,
#: after Luo et al. 2024, arXiv:2402.13499).
MMA_SYNC_SHARE = 2 / 3


def math_of(op: Op, card: Peaks) -> str:
    """Which units run ``op``: ``"bf16"``, ``"fp16"``, ``"tf32"``, ``"3xtf32"`` or ``"fp32"``.

    Example:
        >>> from torchfit.memory import gpu
        >>> from torchfit.speed.cards import peaks
        >>> conv = Op("convolution", OpKind.CONV, Phase.FORWARD, 1.0, 1.0, "fp32", (1, 8, 8, 8))
        >>> math_of(conv, peaks(gpu("A100 80GB"))), math_of(conv, peaks(gpu("V100 16GB")))
        ('tf32', 'fp32')
    """
    if op.dtype in {"bf16", "fp16"}:
        return op.dtype if op.dtype in card.tensor_tflops else "fp32"
    if op.kind is OpKind.CONV and "tf32" in card.tensor_tflops:
        return "tf32"
    if op.kind is OpKind.ATTENTION and "tf32" in card.tensor_tflops:
        return THREE_TF32
    return "fp32"


def kernel_seconds(op: Op, card: Peaks, *, hopper: bool) -> float:
    """Seconds one call of ``op`` takes on ``card`` (module notes).

    Example:
        >>> from torchfit.memory import gpu
        >>> from torchfit.speed.cards import peaks
        >>> copy = Op("copy_", OpKind.MEMORY, Phase.FORWARD, 0.0, 4.8e9, "bf16")
        >>> round(kernel_seconds(copy, peaks(gpu("H200")), hopper=True) * 1e3, 3)  # 4.8 GB at 89%
        1.131
    """
    bandwidth = card.bandwidth_gb_s * 1e9
    if op.kind in {OpKind.MATMUL, OpKind.CONV}:
        kind = math_of(op, card)
        peak = card.dense_peak(kind)
        fit = matmul_fit(kind)
        share = card.sgemm if kind == "fp32" else card.mamf
        if hopper and op.backend == "unaligned" and kind in {"bf16", "fp16"}:
            peak *= MMA_SYNC_SHARE  # no TMA descriptor: an mma.sync kernel
        seconds = fit.seconds(op.flops, op.bytes, peak=peak, bandwidth=bandwidth, mamf=share)
        if op.kind is OpKind.CONV and kind != "fp32" and len(op.shape) > 4 and op.shape[4]:
            # NCHW -> NHWC and back: each byte read and written once more
            half = op.shape[4] / 2  # two transposes, each reading and writing half the bytes
            seconds += 2 * memory_curve(hopper=hopper).seconds(2 * half, bandwidth)
        return seconds
    if op.kind is OpKind.ATTENTION:
        _, _, seq_q, seq_k, head_dim, causal = op.shape[:6]
        # Philox masks (`curves`) cost against 16-bit tensor-core math; an fp32 kernel's
        # own math runs on the CUDA cores, many times slower, and hides them
        dropout = len(op.shape) > 6 and bool(op.shape[6]) and op.dtype in {"bf16", "fp16"}
        backward = op.phase is Phase.BACKWARD or op.name.endswith("_backward")
        flash = op.backend == "flash"
        # a ragged sequence runs FA2's whole tiles: the rate of the padded length
        padded = flash_padded(seq_q, seq_k, head_dim, backward=backward) if flash else None
        share = attention_efficiency(
            backward=backward,
            causal=bool(causal),
            head_dim=head_dim,
            seq=max(padded or (seq_q, seq_k)),
            hopper=hopper,
            backend=op.backend,
            dropout=dropout,
        )
        if flash:
            share *= flash_tile_fill(seq_q, seq_k, head_dim, backward=backward)
        compute = op.flops / (card.dense_peak(math_of(op, card)) * share)
        return max(compute, op.bytes / (bandwidth * MEMORY_EFFICIENCY)) + MEMORY_KERNEL_S
    return memory_curve(hopper=hopper).seconds(op.bytes, bandwidth)
