"""Scratch of the CPU attention kernels: flash attention's per-thread blocks, safe softmax.

Sizes from ``aten/src/ATen/native/cpu/FlashAttentionKernel.cpp`` (the q/kv split) and
measured with ``torch.profiler`` allocation events inside each call (torch 2.13.0+cpu,
2 threads); the figures are quoted at each rule.
"""

from __future__ import annotations

from typing import Any

import torch

from torchfit.memory.kernels.machine import CpuMachine
from torchfit.memory.kernels.tensors import acc_size, copy_if_strided

__all__ = ["flash_backward", "flash_forward", "flash_split", "safe_softmax"]

_REDUCED = (torch.float16, torch.bfloat16)


def flash_split(q_len: int) -> int:
    """The q block of CPU flash attention: 256, 64 or 32 rows by sequence length.

    ``FlashAttentionKernel.cpp``: ``q_split_size = q_seq_len >= 768 ? 256 : q_seq_len >=
    192 ? 64 : 32``.

    Example:
        >>> flash_split(1024), flash_split(200), flash_split(17)
        (256, 64, 32)
    """
    if q_len >= 768:
        return 256
    if q_len >= 192:
        return 64
    return 32


def flash_forward(cpu: CpuMachine, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    """``_scaled_dot_product_flash_attention_for_cpu``: per-thread qk, max, sum, dst."""
    del kwargs, out
    q, k = args[0], args[1]
    q_len, kv_len, head = q.shape[-2], k.shape[-2], q.shape[-1]
    q_split = min(flash_split(q_len), q_len)
    kv_split = min(512, kv_len)
    # Per-thread buffers (qk, max, sum, dst) in the accumulation type, plus a reduced-type
    # copy of qk for half/bfloat16. Measured (4, 4, 64, 16) causal: 20,992 B =
    # 2 threads * (32*64 + 32 + 32 + 32*16) * 4; (4, 4, 17, 16): 4,760 B.
    per_thread = q_split * kv_split + 2 * q_split + q_split * head
    extra = cpu.threads * per_thread * acc_size(q)
    if q.dtype in _REDUCED:
        extra += cpu.threads * q_split * (kv_split + kv_split % 2) * q.element_size()
    return int(extra)


def flash_backward(cpu: CpuMachine, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    """``_scaled_dot_product_flash_attention_for_cpu_backward``: per-thread attn blocks."""
    del kwargs, out
    grad_out, q, k = args[0], args[1], args[2]
    q_len, kv_len = q.shape[-2], k.shape[-2]
    q_split = min(flash_split(q_len), q_len)
    kv_split = min(512, kv_len)
    # grad_out.contiguous() (of the transposed view, see _scaled_dot_product_flash_
    # attention_cpu_backward in aten/src/ATen/native/transformers/attention.cpp),
    # per-thread attn and grad_attn blocks (accumulation type, and
    # reduced copies for half/bfloat16), and one dsum row block on the calling thread
    # (worker threads' allocations are not seen by the profiler). Measured
    # (4, 4, 64, 16): 32,896 B = 2 * 2 * 32 * 64 * 4 + 32 * 4.
    # The kernel sees (B, L, H, E) views: it copies grad_out unless that view is dense.
    extra = copy_if_strided(grad_out.transpose(1, 2))
    extra += cpu.threads * 2 * q_split * kv_split * acc_size(q)
    if q.dtype in _REDUCED:
        extra += cpu.threads * 2 * q_split * kv_split * q.element_size()
    return int(extra + q_split * acc_size(q))


def safe_softmax(cpu: CpuMachine, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    """``_safe_softmax``: the ``-inf`` mask, its all() over dim, and a scalar."""
    del cpu, kwargs, out
    x, dim = args[0], args[1]
    # Measured (4, 4, 64, 64) -> 66,564 B = 65,536 + 1,024 + 4.
    return int(x.numel() + x.numel() // max(1, x.shape[dim]) + 4)
