"""Scratch of the CPU normalization kernels: batch, layer and group norm.

Measured with ``torch.profiler`` allocation events inside each ATen call, compared with the
call's outputs (torch 2.13.0+cpu, 2 threads); the figures are quoted at each rule.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from torchfit.memory.kernels.machine import CpuMachine
from torchfit.memory.kernels.tensors import acc_size, copy_if_strided, dense_bytes

__all__ = ["batch_norm", "batch_norm_backward", "group_norm_backward", "layer_norm_backward"]


def layer_norm_backward(
    cpu: CpuMachine, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any
) -> int:
    """``native_layer_norm_backward``: input copies and per-thread dgamma/dbeta sums."""
    del kwargs, out
    grad_out, x, normalized_shape, _mean, _rstd, weight = args[:6]
    mask = args[7]
    extra = copy_if_strided(grad_out) + copy_if_strided(x)
    if weight is not None and (mask[1] or mask[2]):
        # Per-thread partial sums of dgamma and dbeta in the accumulation type. Measured:
        # (4, 64, 64) -> 1,024 B and (4, 3136) -> 50,176 B = 2 threads * 2 * N * 4.
        extra += cpu.threads * 2 * math.prod(normalized_shape) * acc_size(x)
    return extra


def group_norm_backward(
    cpu: CpuMachine, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any
) -> int:
    """``native_group_norm_backward``: ds and db per (sample, channel)."""
    del cpu, kwargs, out
    x, n, c = args[1], args[5], args[6]
    # Measured (4, 16, 30, 30) -> 512 B = 2 * 4 * 16 * 4.
    return int(2 * n * c * acc_size(x))


def batch_norm(cpu: CpuMachine, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    """``native_batch_norm``: per-channel statistics."""
    del cpu, kwargs, out
    x = args[0]
    channels = x.shape[1] if x.dim() > 1 else 1
    # Measured 128 B for (4, 16, 32, 32) = 2 * 16 * 4, and 384 B for (8, 24) = 4 * 24 * 4
    # (the 2-D path keeps two more).
    return (2 if x.dim() > 2 else 4) * channels * acc_size(x)


def batch_norm_backward(
    cpu: CpuMachine, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any
) -> int:
    """``native_batch_norm_backward``: a temporary of the input's size, by layout."""
    del cpu, kwargs, out
    grad_out, x = args[0], args[1]
    nhwc = torch.channels_last
    if x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=nhwc):
        # Channels-last input (measured, fp32, 2 threads): with a channels-last gradient
        # one temporary of the input's size ((4, 48, 18, 18) -> 248,832 B; (2, 16, 8, 8)
        # -> 8,192 B); with a plain-layout gradient only 4 bytes per channel (192 B for
        # 48 channels, 64 B for 16, 128 B for 32).
        if grad_out.is_contiguous(memory_format=nhwc):
            return dense_bytes(x)
        return 4 * int(x.shape[1])
    # A full temporary of the input's size: measured (4, 16, 32, 32) -> 262,144 B,
    # (4, 16, 8, 8) -> 16,384 B, (8, 24) -> 768 B.
    return dense_bytes(x) + copy_if_strided(grad_out)
