"""oneDNN's f32 convolution backward on channels-last (``acdb``) activations.

The companion of `torchfit.memory.kernels.onednn` (same sources and measurements, oneDNN
v3.12 in torch 2.13.0+cpu, AVX-512, 2 threads) for the ``nxc`` kernels: depthwise, grouped,
strided dense and first (1-3 channel) convolutions, and the padding limits of the
depthwise backward-weights kernel that NCHW shares (`dw_weights_ok`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torchfit.memory.kernels.onednn import ConvBackward
from torchfit.memory.kernels.onednn_scratchpad import F32, entry, up

__all__ = ["avx2_modelled", "backward_scratch_nhwc", "dw_weights_ok"]


def backward_scratch_nhwc(
    x: Sequence[int],
    w: Sequence[int],
    out: Sequence[int],
    stride: Sequence[int],
    mask: Sequence[bool],
    *,
    groups: int,
    padding: Sequence[int],
    threads: int,
    block: int = 16,
) -> int | None:
    """Peak bytes of a float32 channels-last 2-D ``convolution_backward``, above its outputs.

    Channels-last (``acdb``) activations need no source or destination reorders; what
    remains (oneDNN v3.12, AVX-512, verbose log and allocation events, 2 threads):

    * backward-data: the weights reordered for the kernel (depthwise ``jit_dw``:
      ``Abcde16a``, groups padded to 16; grouped ``jit:avx512_core``: ``aBCde16b16c``,
      each group's channels padded to 16, measured 5x8x19x19 * 32x4x3x3, 2 groups:
      18,432 B; ``brgconv_strided`` for a stride > 1, dense or with groups of more than
      16 output channels, weights ``aCdeb16c`` plus its scratchpad over all output
      channels, see `ConvBackward.brgconv_strided_scratch`; 4x16x12x12 * 48x8x3x3
      stride 2, 2 groups: 75,120 B);
    * backward-weights of a depthwise conv with ``kw <= 3`` (``jit_dw``, nxc harness,
      ``jit_uni_dw_conv_kernel_utils.cpp``): blocked grad_weight (groups padded to 16)
      and ``nthr - 1`` private weight and bias copies; measured 8x64x8x8 * 64x1x3x3
      stride 2: 2,304 + 2,816 B;
    * otherwise ``jit:avx512_core`` (``aBCde16c16b``): grad_weight blocked 16x16 *per
      group*, so a depthwise 7x7 over 64 channels holds 64*16*16*49*4 = 3,211,264 B, and
      a padded bias (``groups * 16`` floats) when a group's channels are off the block;
      measured 8x64x8x8 * 64x1x7x7: 3,224,064 B above the outputs;
    * a first convolution (1-3 input channels, stride 1, no grad_input): weights
      ``Acdb16a`` and the reductions of `ConvBackward.weights_scratch`; measured
      4x3x14x14 * 16x3x3x3 with bias: 1,728 + 22,464 B;
    * then the plain grad_weight next to the blocked one, and a second copy.

    Returns ``None`` where this model does not apply (dense stride 1 with grad_input or
    more than 3 input channels), for the caller's older rule.

    Example:
        >>> backward_scratch_nhwc((8, 64, 8, 8), (64, 1, 7, 7), (8, 64, 8, 8), (1, 1),
        ...                       (True, True, True), groups=64, padding=(3, 3), threads=2)
        3224064
    """
    ic, oc = x[1], w[0]
    depthwise = groups > 1 and groups == ic == oc
    strided = stride[0] > 1 or stride[1] > 1
    first = groups == 1 and not strided and ic <= 3 and not mask[0]
    if not (depthwise or groups > 1 or strided or first):
        return None
    kh, kw = w[2], w[3]
    ks = kh * kw
    grad_w = math.prod(w) * F32 if mask[1] else 0
    bias = oc * F32 if mask[2] else 0
    data = 0
    if mask[0]:
        if depthwise:
            data = up(groups, block) * ks * F32
        elif groups > 1 and not (strided and oc // groups > 16):
            data = groups * up(oc // groups, 16) * up(ic // groups, 16) * ks * F32
        else:
            # brgconv_strided, also for groups of more than 16 output channels
            conv = ConvBackward(x, w, out, stride, padding=padding, threads=threads)
            data = oc * up(ic // groups, 16) * ks * F32 + conv.brgconv_strided_scratch()
    weights = 0
    if mask[1]:
        if first:
            # a first convolution's jit:avx512_core weights (Acdb16a) and its reductions
            conv = ConvBackward(x, w, out, stride, padding=padding, threads=threads)
            diff_w = up(oc, 16) * ic * ks * F32
            scratch = conv.weights_scratch(bias=mask[2])
        elif depthwise and kw <= 3 and dw_weights_ok(x, w, out, stride, padding):
            diff_w = up(groups, 16) * ks * F32
            scratch = 0
            if threads > 1:
                scratch = entry((threads - 1) * diff_w)
                if mask[2]:
                    scratch += entry(groups * (threads - 1) * F32)
        else:
            oc_g, ic_g = oc // groups, ic // groups
            diff_w = groups * up(oc_g, block) * up(ic_g, block) * ks * F32
            scratch = entry(groups * up(oc_g, block) * F32) if mask[2] and oc_g % block else 0
        # the scratchpad lives before grad_weight and grad_bias are made; then the plain
        # grad_weight sits next to the blocked one and an unpadded bias copy
        weights = diff_w + max(scratch - grad_w, bias + grad_w)
    # the data stage runs before grad_weight and grad_bias exist
    return max(data - grad_w - bias, weights)


def dw_weights_ok(
    x: Sequence[int],
    w: Sequence[int],
    out: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
) -> bool:
    """``jit_uni_dw_conv_bwd_weights_kernel_t::init_conf``: padding and size limits."""
    for size_in, size_out, k, s, p in zip(x[2:], out[2:], w[2:], stride, padding, strict=True):
        end_pad = (size_out - 1) * s + k - size_in - p
        max_pad = k // 2
        if s > k or p > max_pad or end_pad > max_pad or size_in < k + (-p) % s:
            return False
        if (p > 1 and p % s) or (end_pad > 1 and end_pad % s):
            return False
    return True


def avx2_modelled(x: Sequence[int], w: Sequence[int], groups: int) -> bool:
    """Whether `backward_scratch_nhwc` models this call on AVX2 (8-channel blocks).

    Only the depthwise pair ``jit_dw:avx2`` backward-data / ``jit:avx2`` backward-weights
    (``aBCde8c8b``: 8x8 blocks per group) was measured (``ONEDNN_VERBOSE``, torch
    2.13.0+cpu, 2x16x8x8 * 16x1x7x7: 203,904 B), for ``kw > 3``; ``jit:avx2`` needs
    ``kh <= ih`` (a 7x7 kernel over a 4x4 input takes another kernel).

    Example:
        >>> x = (2, 16, 8, 8)
        >>> avx2_modelled(x, (16, 1, 7, 7), 16), avx2_modelled(x, (16, 1, 3, 3), 16)
        (True, False)
    """
    depthwise = groups > 1 and groups == x[1] == w[0]
    return depthwise and w[3] > 3 and w[2] <= x[2]
