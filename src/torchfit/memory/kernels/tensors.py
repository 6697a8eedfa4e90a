"""What kernels copy and how large: dense sizes, layouts, accumulation types."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = [
    "acc_size",
    "blas_ok",
    "channels_last",
    "copy_if_strided",
    "dense_bytes",
    "pointwise",
]


def dense_bytes(tensor: torch.Tensor) -> int:
    """Bytes of a dense copy of ``tensor`` (what ``.contiguous()`` allocates).

    Example:
        >>> dense_bytes(torch.empty(3, 1, device="meta").expand(3, 5))
        60
    """
    return tensor.numel() * tensor.element_size()


def copy_if_strided(tensor: object) -> int:
    """``.contiguous()`` inside a kernel: a full copy unless already contiguous.

    Example:
        >>> copy_if_strided(torch.empty(4, 8, device="meta").t()), copy_if_strided(None)
        (128, 0)
    """
    if isinstance(tensor, torch.Tensor) and not tensor.is_contiguous():
        return dense_bytes(tensor)
    return 0


def acc_size(tensor: torch.Tensor) -> int:
    """Element size of the accumulation type (float for half/bfloat16 on CPU)."""
    return 8 if tensor.dtype == torch.float64 else 4


def channels_last(tensor: torch.Tensor) -> bool:
    """``suggest_memory_format() == channels_last``: channels-last and not plain-contiguous.

    Example:
        >>> x = torch.empty(2, 8, 5, 5, device="meta")
        >>> channels_last(x), channels_last(x.contiguous(memory_format=torch.channels_last))
        (False, True)
    """
    if tensor.dim() == 4:
        return (
            tensor.is_contiguous(memory_format=torch.channels_last) and not tensor.is_contiguous()
        )
    if tensor.dim() == 5:
        return (
            tensor.is_contiguous(memory_format=torch.channels_last_3d)
            and not tensor.is_contiguous()
        )
    return False


def blas_ok(tensor: object) -> bool:
    """Whether BLAS can read ``tensor`` in place (row- or column-major last two dims).

    Example:
        >>> blas_ok(torch.empty(4, 8, device="meta").t()), blas_ok(torch.empty(1, 8).expand(4, 8))
        (True, False)
    """
    if not isinstance(tensor, torch.Tensor) or tensor.dim() < 2:
        return True
    rows, cols = tensor.shape[-2], tensor.shape[-1]
    s_rows, s_cols = tensor.stride(-2), tensor.stride(-1)
    return (s_cols == 1 and s_rows >= max(1, cols)) or (s_rows == 1 and s_cols >= max(1, rows))


def pointwise(weight: torch.Tensor, stride: Sequence[int], padding: Sequence[int]) -> bool:
    """A 1x1 convolution with unit stride and no padding: one matmul per image.

    Example:
        >>> w = torch.empty(8, 4, 1, 1, device="meta")
        >>> pointwise(w, [1, 1], [0, 0]), pointwise(w, [2, 2], [0, 0])
        (True, False)
    """
    unit = all(k == 1 for k in weight.shape[2:]) and all(s == 1 for s in stride)
    return unit and not any(padding)
