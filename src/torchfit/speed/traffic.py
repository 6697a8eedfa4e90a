"""What CUDA's kernels read beyond one pass over an op's tensors, and what they can load.

The recorder (`torchfit.speed.record`) counts each tensor an op reads once and each it
writes once. Two things about the CUDA kernels behind the ops change that:

- some normalizations run as two kernels, each reading the activations
  (`second_pass_bytes`);
- Hopper's tensor-core GEMMs load through the tensor memory accelerator, which needs
  16-byte row strides (`tma_aligned`).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["TMA_ALIGNMENT", "read_bytes", "second_pass_bytes", "tma_aligned"]

#: Where a batch norm's ``training`` flag sits in each overload's arguments.
_BATCH_NORM_TRAINING = {
    "native_batch_norm": 5,
    "_native_batch_norm_legit": 5,
    "_native_batch_norm_legit_functional": 5,
    "native_batch_norm_backward": 7,
    "batch_norm_backward": 7,
}
#: Byte multiple every row stride (and the start) of a TMA tensor must be: the CUDA
#: driver API's cuTensorMapEncodeTiled ("globalStrides ... must be a multiple of 16").
TMA_ALIGNMENT = 16


def read_bytes(tensor: torch.Tensor) -> int:
    """Bytes a kernel reads of ``tensor``: a broadcast (stride-0) dimension once.

    Example:
        >>> read_bytes(torch.empty(4, 1).expand(4, 8))
        16
    """
    elements = 1
    for size, stride in zip(tensor.shape, tensor.stride(), strict=True):
        if stride != 0:
            elements *= size
    return elements * tensor.element_size()


def tma_aligned(*tensors: torch.Tensor) -> bool:
    """Whether every tensor's start and non-unit strides are multiples of 16 bytes.

    Hopper's tensor-core GEMMs (``wgmma``) load their tiles with the tensor memory
    accelerator, whose descriptors need each global stride to be a multiple of 16 bytes
    (CUDA driver API, ``cuTensorMapEncodeTiled``). A 16-bit matrix whose rows are not a
    multiple of 8 elements (a BERT vocabulary of 30,522, GPT-2's 50,257) cannot be
    described, so cuBLAS runs an older ``mma.sync`` kernel (`torchfit.speed.roofline`).

    Example:
        >>> tma_aligned(torch.empty(4096, 768, dtype=torch.bfloat16))
        True
        >>> tma_aligned(torch.empty(768, 30522, dtype=torch.bfloat16))
        False
    """
    for t in tensors:
        size = t.element_size()
        if (t.storage_offset() * size) % TMA_ALIGNMENT:
            return False
        for dim, stride in zip(t.shape, t.stride(), strict=True):
            if dim > 1 and stride != 1 and (stride * size) % TMA_ALIGNMENT:
                return False
    return True


def second_pass_bytes(name: str, args: tuple[Any, ...]) -> int:
    """Bytes a normalization reads again because CUDA runs it as two kernels.

    - **Batch norm in training** cannot normalize before the batch's statistics are
      complete: PyTorch's CUDA kernels (``aten/src/ATen/native/cuda/Normalization.cu``)
      run ``batch_norm_collect_statistics`` and then ``batch_norm_transform_input``
      (forward), ``batch_norm_backward_reduce`` and then ``batch_norm_backward_elemt``
      (backward), each reading the activations (and the output gradient) once more;
      cuDNN's non-persistent spatial mode, which PyTorch asks for with NCHW tensors
      (``aten/src/ATen/native/cudnn/BatchNorm.cpp``, ``getCudnnBatchNormMode``), has the
      same dependence (channels-last fp32/fp16 activations get cuDNN's persistent mode,
      one pass). The second pass reads the input (and in backward the output gradient)
      again.
    - **Layer norm backward** computes the input gradient in one kernel and the weight
      and bias gradients in another (``GammaBetaBackwardCUDAKernel`` in
      ``aten/src/ATen/native/cuda/layer_norm_kernel.cu``), each reading the output
      gradient and the input.

    Example:
        >>> x = torch.empty(8, 64, 56, 56)
        >>> second_pass_bytes("native_batch_norm", (x, None, None, None, None, True)) / 1e6
        6.422528
        >>> second_pass_bytes("native_batch_norm", (x, None, None, None, None, False))
        0
    """
    if name == "native_layer_norm_backward":
        mask = args[7] if len(args) > 7 else (True, True, True)
        if mask[0] and (mask[1] or mask[2]):
            return read_bytes(args[0]) + read_bytes(args[1])
        return 0
    index = _BATCH_NORM_TRAINING.get(name)
    if name == "_native_batch_norm_legit" and len(args) == 6:  # .no_stats: training at 3
        index = 3
    if index is None or len(args) <= index or not args[index]:
        return 0
    x = args[1] if name.endswith("backward") else args[0]
    if _cudnn_persistent(x):
        return 0
    if name.endswith("backward"):
        return read_bytes(args[0]) + read_bytes(args[1])
    return read_bytes(args[0])


def _cudnn_persistent(x: torch.Tensor) -> bool:
    """Whether cuDNN's persistent (one-pass) batch norm runs: channels-last fp32/fp16.

    PyTorch gives batch norm to cuDNN unless the input is bf16 (``_batch_norm_impl_index``
    in ``aten/src/ATen/native/Normalization.cpp``) and asks for the persistent mode in
    training when the input is channels-last (``getCudnnBatchNormMode``).
    """
    if x.dim() != 4 or x.dtype == torch.bfloat16:
        return False
    return x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
