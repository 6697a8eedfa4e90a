"""Copies a CUDA kernel makes of its inputs before it runs: layouts the fake step cannot see.

Some CUDA implementations call ``.contiguous()`` on an input before launching their
kernel. On a contiguous tensor that is free; on a strided view (a transpose, a permute,
the output of an elementwise op that kept a transposed operand's layout) it is one more
copy kernel reading and writing the whole tensor. A fake-tensor step runs each op's
meta function, not its CUDA wrapper, so the recorder never sees these copies;
`hidden_copies` names them from the op and its arguments:

- **Layer norm**: ``layer_norm_cuda`` makes its input contiguous (``auto X =
  input.expect_contiguous()``) and ``layer_norm_backward_cuda`` does the same to the
  saved input, and its kernel the output gradient (``dY.contiguous()`` in
  ``LayerNormBackwardKernelImpl``); PyTorch ``aten/src/ATen/native/cuda/layer_norm_kernel.cu``
  (2.x, unchanged since 1.x). torchvision's ViT feeds it such a view: its encoder block
  adds the output of ``nn.MultiheadAttention`` (batch-first, computed sequence-first and
  transposed back) to its input, and the sum keeps the transposed layout, so every layer
  norm after the first sees a non-contiguous input.
- **FlashAttention's backward**: ``_flash_attention_backward`` makes the output gradient
  contiguous in the kernel's (batch, sequence, heads, head size) order ("CUDA code
  assumes that dout is contiguous", ``auto contiguous_grad_out = grad_out.contiguous()``
  on ``grad_out.transpose(1, 2)``; PyTorch
  ``aten/src/ATen/native/transformers/cuda/attention_backward.cu``). A model that
  permutes the attention output to sequence-first before its projection (PyTorch's
  ``F.multi_head_attention_forward``) hands it a gradient in another order. The
  forward output is the kernel's own allocation (already in that order), so only the
  gradient is judged.
"""

from __future__ import annotations

from typing import Any

import torch

from torchfit.speed.traffic import read_bytes

__all__ = ["hidden_copies"]

#: Arguments the CUDA implementation of each op makes contiguous (module notes).
_CONTIGUOUS_ARGS: dict[str, tuple[int, ...]] = {
    "native_layer_norm": (0,),
    "native_layer_norm_backward": (0, 1),
}
#: Fused attention backward ops whose output gradient (argument 0) must be contiguous
#: in (batch, sequence, heads, head size) order: the FlashAttention-2 kernel's.
_FLASH_BACKWARD = frozenset(
    {
        "_scaled_dot_product_flash_attention_backward",
        "_scaled_dot_product_flash_attention_for_cpu_backward",
    }
)


def _copy_bytes(tensor: torch.Tensor) -> int:
    """A copy kernel reads the view's elements and writes them densely."""
    return read_bytes(tensor) + tensor.numel() * tensor.element_size()


def hidden_copies(name: str, args: tuple[Any, ...], *, flash: bool = False) -> list[int]:
    """Bytes of each copy kernel the CUDA implementation of ``name`` runs first.

    ``flash`` says the attention op runs FlashAttention-2 (16-bit, no mask); other
    attention kernels are left alone.

    Example:
        >>> x = torch.empty(197, 64, 768).transpose(0, 1)  # a batch-first view
        >>> hidden_copies("native_layer_norm", (x, [768], None, None, 1e-6))
        [77463552]
        >>> hidden_copies("native_layer_norm", (x.contiguous(), [768], None, None, 1e-6))
        []
    """
    if name in _FLASH_BACKWARD:
        if not flash or not args or not isinstance(args[0], torch.Tensor) or args[0].dim() != 4:
            return []
        grad = args[0].transpose(1, 2)
        return [] if grad.is_contiguous() else [_copy_bytes(grad)]
    copies = []
    for index in _CONTIGUOUS_ARGS.get(name, ()):
        tensor = args[index] if len(args) > index else None
        if isinstance(tensor, torch.Tensor) and not tensor.is_contiguous():
            copies.append(_copy_bytes(tensor))
    return copies
