"""cuDNN's convolution workspaces, which a CUDA trace counts as kernel scratch.

Each cuDNN convolution call asks the caching allocator for the workspace of the engine
it runs and frees it when the call returns (``aten/src/ATen/native/cudnn/Conv_v8.cpp``:
the plan's ``getWorkspaceSize()`` bytes, taken with ``c10::cuda::CUDACachingAllocator``).
With ``torch.backends.cudnn.benchmark`` off (PyTorch's default) cuDNN's heuristics choose
the engine, and so the size. The rules below describe what those heuristics chose for
NCHW convolutions on an H200 (torch 2.11 with CUDA 13.0 and cuDNN 9;
``torch.cuda.memory`` snapshots of ResNet-50 and ResNet-101 training steps in float32
and of ViT-B/16's under bf16 autocast, at batch 64: every allocation the convolutions
made):

- **A convolution that is not pointwise** (a kernel over 1x1, or a stride): input +
  weight + output bytes, forward and backward. These are the NHWC copies cuDNN makes
  to run its tensor-core kernels on NCHW tensors, and the NHWC result it then transposes
  back (NVIDIA, "Tensor Core AI Performance Milestones", developer.nvidia.com/blog,
  2019; the same transposes `torchfit.speed.record.nchw_bytes` times), in 16 bits with
  their channels padded to a multiple of 8 (`CHANNEL_MULTIPLE`). Recorded: 98.14
  MiB for a 3x3, 64-channel convolution of 64 x 56 x 56 inputs (rule 98.14), 232.79 MiB
  for ResNet's 7x7 stem (rule 232.79), 123.06 for a strided 3x3 (rule 123.06). The weight
  gradient's workspace holds its partial sums as well, 8 MiB more (recorded 2 to 8.25,
  18 for the stem), and a strided 1x1 at 56 x 56 took 196.5 MiB forward (rule 294.5).
- **A pointwise convolution** (1x1, unit stride, no padding) is one GEMM per image over
  NCHW data: no workspace forward or for the input gradient. Its weight gradient splits
  the reduction over the images and pixels into 64 fp32 partial sums (a split-K GEMM):
  64 x the weight's elements x 4 bytes, and never more than the NHWC copies above.
  Recorded: 1, 4, 8, 16, 32 and 64 MiB for weights of 16 KiB to 1 MiB (the rule for
  each), 30.6 MiB for the 4 MiB weights at 7 x 7 pixels (rule 34.6).

A backward call computes the input gradient and then the weight gradient, each with its
own workspace freed before the next. The order matters to the reserved memory: the
weight gradient's, a little larger, cannot reuse the block the input gradient's left,
and on the H200 that cost ResNet-50 a second 302 MiB segment.

Not modelled (no workspace counted): grouped and depthwise convolutions, transposed
ones, 1-D and 3-D ones, channels-last inputs (cuDNN's NHWC kernels need no copies), and
``cudnn.benchmark=True``, which times every engine with workspaces up to the free
memory. The first convolution's weight gradient took 18 MiB of partial sums, not 8, in
both steps that had one (ResNet's stem; ViT-B/16's patch convolution under bf16
autocast, 88.4 MiB where the rules give 78.4).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from torchfit.memory.kernels.tensors import dense_bytes, pointwise

__all__ = ["CHANNEL_MULTIPLE", "SPLIT_K", "WEIGHT_PARTIALS", "convolution_workspaces"]

aten = torch.ops.aten

#: fp16/bf16 tensor-core convolutions take channels in multiples of 8; cuDNN pads the
#: NHWC copies to them (NVIDIA, "Convolutional Layers User's Guide", docs.nvidia.com/
#: deeplearning/performance, "Channels In and Out"). ViT-B/16's 3-channel patch
#: convolution under bf16 autocast took 70.375 MiB on the H200: 8-channel input and weight.
CHANNEL_MULTIPLE = 8

#: Partial sums of a pointwise convolution's weight gradient (the H200 record above).
SPLIT_K = 64

#: What a weight gradient's workspace holds beyond the NHWC copies: its partial sums
#: (recorded 6.75 to 8.25 MiB, 2 MiB for the smallest weights, 18 MiB for the stem).
WEIGHT_PARTIALS = 8 * 2**20


def _covered(x: torch.Tensor, transposed: bool, groups: int) -> bool:  # noqa: FBT001
    """The case the rules cover: a 2-D, ungrouped, not transposed, NCHW convolution."""
    return x.dim() == 4 and not transposed and groups == 1 and x.is_contiguous()


def _padded(tensor: torch.Tensor, dims: tuple[int, ...]) -> int:
    """Bytes of ``tensor``'s NHWC copy: 16-bit channels padded to `CHANNEL_MULTIPLE`."""
    if tensor.dtype not in {torch.float16, torch.bfloat16}:
        return dense_bytes(tensor)
    shape = list(tensor.shape)
    for dim in dims:
        shape[dim] = -(-shape[dim] // CHANNEL_MULTIPLE) * CHANNEL_MULTIPLE
    return math.prod(shape) * tensor.element_size()


def _copies(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> int:
    return _padded(x, (1,)) + _padded(w, (0, 1)) + _padded(out, (1,))


def convolution_workspaces(func: Any, args: tuple[Any, ...], out: Any) -> tuple[int, ...]:
    """The cuDNN workspaces of one ``aten.convolution`` or ``convolution_backward`` call.

    Args:
        func: The ATen op.
        args: Its arguments, as the op's schema orders them.
        out: What the op returned (the forward's output).

    Returns:
        Bytes of each workspace the call takes on a CUDA device, in order, each freed
        before the next: one for a forward, the input gradient's and then the weight
        gradient's for a backward. Empty for other ops and for the convolutions the
        rules do not cover.

    Example:
        A 3x3 convolution of 64 x 64 x 56 x 56 float32 inputs: the NHWC copies of input,
        weight and output, 98.14 MiB forward (the H200 recorded 98.14), the same for the
        input gradient and 8 MiB more for the weight gradient (recorded 98.14 and 100.11):

        >>> x = torch.empty(64, 64, 56, 56, device="meta")
        >>> w = torch.empty(64, 64, 3, 3, device="meta")
        >>> y = torch.empty(64, 64, 56, 56, device="meta")
        >>> geometry = ([1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        >>> aten = torch.ops.aten
        >>> forward = convolution_workspaces(aten.convolution.default, (x, w, None, *geometry), y)
        >>> [round(n / 2**20, 2) for n in forward]
        [98.14]
        >>> call = (y, x, w, None, *geometry, [True, True, False])
        >>> backward = convolution_workspaces(aten.convolution_backward.default, call, None)
        >>> [round(n / 2**20, 2) for n in backward]
        [98.14, 106.14]
    """
    if func is aten.convolution.default:
        x, w, _bias, stride, padding, _dilation, transposed, _op, groups = args[:9]
        if not _covered(x, transposed, groups) or pointwise(w, stride, padding):
            return ()
        return (_copies(x, w, out),)
    if func is aten.convolution_backward.default:
        grad_out, x, w, _bias_sizes, stride, padding, _dilation, transposed, _op, groups, mask = (
            args[:11]
        )
        if not _covered(x, transposed, groups):
            return ()
        copies = _copies(x, w, grad_out)
        if pointwise(w, stride, padding):
            return (min(SPLIT_K * w.numel() * 4, copies),) if mask[1] else ()
        data = (copies,) if mask[0] else ()
        return (*data, copies + WEIGHT_PARTIALS) if mask[1] else data
    return ()
