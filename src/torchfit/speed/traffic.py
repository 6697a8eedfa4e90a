"""What CUDA's kernels read beyond one pass over an op's tensors, and what they can load.

The recorder (`torchfit.speed.record`) counts each tensor an op reads once and each it
writes once. Two things about the CUDA kernels behind the ops change that:

- some normalizations run as two kernels, each reading the activations, and a softmax
  over rows too long for one block's registers or shared memory reads them in several
  passes (`second_pass_bytes`);
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
    - **Softmax and log-softmax over long rows** (a vocabulary): `_softmax_passes`.

    Example:
        >>> x = torch.empty(8, 64, 56, 56)
        >>> second_pass_bytes("native_batch_norm", (x, None, None, None, None, True)) / 1e6
        6.422528
        >>> second_pass_bytes("native_batch_norm", (x, None, None, None, None, False))
        0
    """
    if name in _SOFTMAX:
        return _softmax_passes(name, args)
    if name == "native_layer_norm_backward":
        mask = args[7] if len(args) > 7 else (True, True, True)
        two_kernels = mask[0] and (mask[1] or mask[2])
        return read_bytes(args[0]) + read_bytes(args[1]) if two_kernels else 0
    return _batch_norm_passes(name, args)


def _batch_norm_passes(name: str, args: tuple[Any, ...]) -> int:
    """The second pass of a batch norm in training (`second_pass_bytes`)."""
    index = _BATCH_NORM_TRAINING.get(name)
    if name == "_native_batch_norm_legit" and len(args) == 6:  # .no_stats: training at 3
        index = 3
    if index is None or len(args) <= index or not args[index]:
        return 0
    backward = name.endswith("backward")
    if _cudnn_persistent(args[1] if backward else args[0]):
        return 0
    return read_bytes(args[0]) + (read_bytes(args[1]) if backward else 0)


def _cudnn_persistent(x: torch.Tensor) -> bool:
    """Whether cuDNN's persistent (one-pass) batch norm runs: channels-last fp32/fp16.

    PyTorch gives batch norm to cuDNN unless the input is bf16 (``_batch_norm_impl_index``
    in ``aten/src/ATen/native/Normalization.cpp``) and asks for the persistent mode in
    training when the input is channels-last (``getCudnnBatchNormMode``).
    """
    if x.dim() != 4 or x.dtype == torch.bfloat16:
        return False
    return x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()


#: The softmax ops whose CUDA kernels read a long row more than once.
_SOFTMAX = frozenset(
    {"_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data"}
)
#: Shared memory one block may use without opting in (CUDA C++ Programming Guide,
#: "Technical Specifications per Compute Capability": 48 KB on every capability since
#: 3.x); PyTorch sizes its softmax caches by ``sharedMemPerBlock``, this figure.
_SHARED_PER_BLOCK = 48 * 1024
_SOFTMAX_REDUCTION = 1024 // 32 * 4  # one fp32 partial per warp of a 1,024-thread block
_REGISTER_ROWS = 9 * 1024  # cunn_SoftMaxForwardReg: fewer than 10 elements per thread


def _softmax_passes(name: str, args: tuple[Any, ...]) -> int:
    """Bytes a softmax over the last dimension reads again when its row is long.

    PyTorch's CUDA softmax (``host_softmax`` in ``aten/src/ATen/native/cuda/SoftMax.cu``)
    keeps a row on chip when it can: a warp per row up to 2,048 elements, registers for
    fewer than 10 elements per thread of a 1,024-thread block, else shared memory when
    the row fits one block's 48 KB (and its length is a multiple of the 16-byte vector).
    A longer row (a vocabulary of 50,257 fp32 logits is 196 KB) goes to
    ``cunn_SoftMaxForward``, which reads it three times from device memory (the
    maximum, the sum of exponentials, then the output). Backward
    (``cunn_SoftMaxBackward``) reads the output gradient twice (its sum, then the
    gradient), softmax's the output too. Only the last dimension is judged.

    Example:
        >>> logits = torch.empty(8, 50257)
        >>> _softmax_passes("_log_softmax", (logits, 1, False)) == 2 * logits.nbytes
        True
        >>> _softmax_passes("_softmax", (torch.empty(8, 12, 1024, 1024), -1, False))
        0
    """
    backward = name.endswith("_backward_data")
    x = args[0]  # the input forward, the output gradient backward
    dim = args[2] if backward else args[1]
    if x.dim() == 0 or dim % x.dim() != x.dim() - 1:
        return 0
    row, size = x.shape[-1], x.element_size()
    fits_shared = row < (_SHARED_PER_BLOCK - _SOFTMAX_REDUCTION) // size and not row % (16 // size)
    if backward:
        if fits_shared or row * size <= 4096:
            return 0
        extra = read_bytes(x)
        return extra + (read_bytes(args[1]) if name == "_softmax_backward_data" else 0)
    if row <= _REGISTER_ROWS or fits_shared:
        return 0
    return 2 * read_bytes(x)
