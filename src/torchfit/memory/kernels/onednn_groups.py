"""oneDNN's f32 grouped and depthwise convolutions: backward on NCHW, forward of grouped ones.

The companion of `torchfit.memory.kernels.onednn` for ``groups > 1``, measured the same
way (torch 2.13.0+cpu, oneDNN v3.12, AVX-512, ``ONEDNN_VERBOSE=1`` for the kernel, the
profiler's allocation events inside one ``aten.convolution_backward`` call, 2 threads).

Depthwise (``groups == in == out channels``):

* backward-data is always ``jit_dw:avx512_core`` on 16-blocked tensors (``aBcd16b``):
  grad_output and grad_input padded to 16 channels, weights ``Abcde16a`` (groups padded
  to 16), no scratchpad; then the plain grad_input.
* backward-weights is ``jit_dw:avx512_core`` while ``kw <= 3`` and the padding fits
  (`torchfit.memory.kernels.onednn_nhwc.dw_weights_ok`), on blocked source and grad_output, with the
  ``harness_mb_reduction`` split of ``jit_uni_dw_conv_kernel_utils.cpp``:
  ``nthr_g = min(nb_ch, nthr)``, ``nthr_mb = min(nthr // nthr_g, mb)``, and
  ``nthr_mb - 1`` private weight and bias copies over the groups padded to 16.
  Measured 3x8x16x16 * 8x1x3x3: 124,384 B peak = grad_input 24,576 + blocked source
  and grad_output 2 * 49,152 + blocked grad_weight 576 + scratchpad 896 (weights 576 +
  128, bias 64 + 128) + grad_bias 32.
* otherwise ``gemm:jit`` on the plain tensors (`ConvBackward._gemm_weights_scratch`
  with one input channel per group): 3x8x12x12 * 8x1x5x5 books 35,456 B = weight
  copies 2 * 800 * 4 + 128 and im2col columns 2 * 25 * 144 * 4 + 128.

Grouped (``1 < groups < channels``), per group ``ic_g`` input and ``oc_g`` output
channels:

* backward-data ``jit:avx512_core`` (``jit_avx512_common_conv_bwd_data_kernel_f32``)
  blocks a group's channels by the first of 16, 8, 4 dividing both ``ic_g`` and
  ``oc_g`` (``ok_to_try_lower_zmm``; grouped channels are never padded), so its
  reordered grad_output, weights and grad_input are the plain sizes. Measured
  6x16x11x11 * 32x8x3x3, 2 groups: 148,608 B = 92,928 + 9,216 + 46,464.
  With no such block, ``gemm:jit`` on plain tensors, whose scratchpad is per-thread
  im2col columns (``gemm_convolution_utils.cpp``, ``!is_nspc && is_bwd_d``); measured
  4x24x10x10 * 8x6x3x3, 4 groups: 43,328 B = 2 * 6 * 9 * 100 * 4 + 128.
  A stride > 1 goes to ``brgconv_strided`` (`ConvBackward.brgconv_strided_scratch`
  over all output channels; weights ``aCdeb16c``, a group's input channels padded)
  when ``oc_g`` exceeds its accumulator width (``is_grouped_small_oc``,
  ``jit_brgemm_conv_bwd_utils.cpp``): above 16 (avx512_core, tried first), or above 8
  (avx2, tried after the direct kernel). Measured 5x8x24x24 * 48x4x1x1 stride 2,
  2 groups: 234,608 B; 2x8x13x13 * 48x2x3x3, 4 groups (avx2): 127,344 B.
* backward-weights ``jit:avx2`` when 8 divides both (``ic_g``, ``oc_g``) and
  ``kh <= ih``, reductions over ``groups`` times as many jobs; ``gemm:jit`` otherwise
  (4x8x6x6 * 32x4x5x5, 2 groups: 131,456 B = 2 * 12,800 * 4 + 128 + 2 * 4 * 25 * 36 * 4
  + 128). Groups of 16-multiples take ``jit:avx512_core`` on 16-blocked buffers
  (4x32x10x10 * 32x16x3x3, 2 groups: 102,400 B, no reduction while each thread has a
  group of its own; more threads than groups are not modelled).
* forward (`grouped_forward_scratch`): NCHW as backward-data (blocked buffers of the
  plain sizes, or ``gemm:jit`` im2col columns, outer-threaded while ``is / nthr < 64``);
  channels-last only reorders the weights, per group padded to 16 unless both
  channel counts are below 16 and share a block of 8 or 4. Measured, 4 groups:
  4x32x10x10 * 48x8x3x3 NCHW 76,800 B, channels-last 13,824 B; 4x24x10x10 * 8x6x3x3
  NCHW 43,328 B, channels-last 36,864 B.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torchfit.memory.kernels.onednn import ConvBackward
from torchfit.memory.kernels.onednn_nhwc import dw_weights_ok
from torchfit.memory.kernels.onednn_scratchpad import entry, reducer_bytes, up

__all__ = ["depthwise_scratch", "grouped_forward_scratch", "grouped_scratch"]

_F32 = 4
_BLOCK = 16


def _dw_reduction(
    groups: int, ks: int, mb: int, threads: int, *, bias: bool, block: int = _BLOCK
) -> int:
    """``harness_mb_reduction`` scratchpad of ``jit_dw`` backward-weights, in bytes."""
    padded = up(groups, block)
    nthr_g = min(padded // block, threads)
    nthr_mb = min(max(1, threads // nthr_g), mb)
    if nthr_mb <= 1:
        return 0
    total = entry(padded * ks * (nthr_mb - 1) * _F32)
    return total + (entry(padded * (nthr_mb - 1) * _F32) if bias else 0)


def depthwise_scratch(
    x: Sequence[int],
    w: Sequence[int],
    out: Sequence[int],
    stride: Sequence[int],
    mask: Sequence[bool],
    *,
    padding: Sequence[int],
    threads: int,
    block: int = _BLOCK,
) -> int:
    """Peak bytes of a float32 NCHW depthwise ``convolution_backward``, above its outputs.

    Args:
        x: Input shape (N, C, H, W).
        w: Weight shape (C, 1, kh, kw).
        out: Output (grad_output) shape.
        stride: (sh, sw).
        mask: Which of grad_input, grad_weight, grad_bias are computed.
        padding: (ph, pw), symmetric as ATen passes it.
        threads: oneDNN's thread count (``torch.get_num_threads()``).
        block: oneDNN's channel block: 16 (``jit_dw:avx512_core``) or 8
            (``jit_dw:avx2``, the same kernels on ``aBcd8b``/``Abcde8a`` buffers).

    Returns:
        Bytes the call holds at its peak beyond its outputs.

    Example:
        >>> depthwise_scratch((3, 8, 16, 16), (8, 1, 3, 3), (3, 8, 16, 16), (1, 1),
        ...                   (True, True, True), padding=(1, 1), threads=2)
        99488
    """
    mb, groups = x[0], x[1]
    kh, kw = w[2], w[3]
    ks = kh * kw
    padded = up(groups, block)
    grad_in = math.prod(x) * _F32 if mask[0] else 0
    grad_w = math.prod(w) * _F32 if mask[1] else 0
    grad_b = groups * _F32 if mask[2] else 0
    src_b = mb * padded * x[2] * x[3] * _F32
    dst_b = mb * padded * out[2] * out[3] * _F32
    peak_data = max(dst_b + padded * ks * _F32 + src_b, src_b + grad_in) if mask[0] else 0
    peak_weights = 0
    if mask[1]:
        if kw <= 3 and dw_weights_ok(x, w, out, stride, padding):
            wei = padded * ks * _F32
            scratch = _dw_reduction(groups, ks, mb, threads, bias=mask[2], block=block)
            running = src_b + dst_b + wei + scratch
        else:
            conv = ConvBackward(x, w, out, stride, padding=padding, threads=threads, groups=groups)
            wei = grad_w
            running = wei + conv._gemm_weights_scratch()  # noqa: SLF001 - same package
        # oneDNN's own grad_bias (unpadded), then the plain grad_weight and grad_bias
        peak_weights = grad_in + max(running + grad_b, wei + 2 * grad_b + grad_w)
    return max(peak_data, peak_weights) - grad_in - grad_w - grad_b


def _gemm_data_scratch(conv: ConvBackward) -> int:
    """``gemm:jit`` backward-data on plain tensors: per-thread im2col columns, in bytes."""
    ic_g, oc_g = conv.ic // conv.groups, conv.oc // conv.groups
    ks, is_, os_ = conv.kh * conv.kw, conv.ih * conv.iw, conv.oh * conv.ow
    nthr = conv.threads
    unit = ks == 1 and conv.sh == conv.sw == 1 and (conv.oh, conv.ow) == (conv.ih, conv.iw)
    outer_work = conv.groups * conv.mb
    outer_eff = outer_work / up(outer_work, nthr)
    inner_work = -(-is_ // _BLOCK) * -(-ic_g // _BLOCK)
    inner_eff = inner_work / up(inner_work, nthr)
    outer = (
        (os_ // nthr < 512 or ks < 64)
        and (conv.mb != 1 or conv.groups > 2)
        and (outer_eff >= inner_eff or is_ * ic_g * oc_g // nthr < 64 * 1024)
    )
    return entry((nthr if outer else 1) * (0 if unit else ic_g * ks * os_) * _F32)


def grouped_scratch(
    x: Sequence[int],
    w: Sequence[int],
    out: Sequence[int],
    stride: Sequence[int],
    mask: Sequence[bool],
    *,
    groups: int,
    padding: Sequence[int],
    threads: int,
) -> int | None:
    """Peak bytes of a float32 NCHW grouped ``convolution_backward``, above its outputs.

    Same arguments as `depthwise_scratch`, plus ``groups``. Returns ``None`` where oneDNN
    picks a kernel this model leaves out (``brgconv_strided`` backward-data, 16-blocked
    ``jit:avx512_core`` backward-weights), for the caller's older rule.

    Example:
        >>> grouped_scratch((4, 24, 10, 10), (8, 6, 3, 3), (4, 8, 10, 10), (1, 1),
        ...                 (True, True, True), groups=4, padding=(1, 1), threads=2)
        57280
    """
    ic_g, oc_g = x[1] // groups, w[0] // groups
    strided = stride[0] > 1 or stride[1] > 1
    blocked16 = ic_g % _BLOCK == 0 == oc_g % _BLOCK
    if mask[1] and blocked16 and threads > groups:
        return None  # jit:avx512_core would split the minibatch: not measured
    conv = ConvBackward(x, w, out, stride, padding=padding, threads=threads, groups=groups)
    grad_in = math.prod(x) * _F32 if mask[0] else 0
    grad_w = math.prod(w) * _F32 if mask[1] else 0
    grad_b = w[0] * _F32 if mask[2] else 0
    dst = math.prod(out) * _F32
    peak_data = 0
    if mask[0]:
        direct = any(ic_g % simd == 0 == oc_g % simd for simd in (16, 8, 4))
        # brgconv_strided (avx512_core, then avx2 after the direct kernel) takes a
        # group of more output channels than its accumulator (is_grouped_small_oc)
        if strided and (oc_g > _BLOCK or (oc_g > 8 and not direct)):
            block = 16 if oc_g > _BLOCK else 8
            wei = groups * oc_g * up(ic_g, block) * w[2] * w[3] * _F32
            scratch = conv.brgconv_strided_scratch()
            peak_data = max(dst + wei + grad_in + scratch, 3 * grad_in)
        elif direct:
            peak_data = max(dst + grad_w + grad_in, 2 * grad_in)
        else:
            peak_data = grad_in + max(_gemm_data_scratch(conv), grad_in)
    peak_weights = 0
    if mask[1]:
        if blocked16:
            # jit:avx512_core, one group per thread: no weight reduction
            scratch = 0
            if mask[2]:
                jobs = groups * oc_g // _BLOCK
                scratch = reducer_bytes(threads, 16, jobs, x[0], threads * 3 * 5 * 5 * 16 * 16)
            running = dst + math.prod(x) * _F32 + grad_w + scratch
        elif ic_g % 8 == 0 == oc_g % 8 and w[2] <= x[2]:
            jobs = groups * (ic_g // 8) * (oc_g // 8)
            scratch = reducer_bytes(threads, w[2] * w[3] * 64, jobs, x[0], 1 << 21)
            if mask[2]:
                scratch += reducer_bytes(threads, 8, groups * oc_g // 8, x[0], 1 << 21)
            running = dst + math.prod(x) * _F32 + grad_w + scratch
        else:
            running = grad_w + conv._gemm_weights_scratch()  # noqa: SLF001 - same package
        peak_weights = grad_in + max(running + grad_b, 2 * grad_w + 2 * grad_b)
    return max(peak_data, peak_weights) - grad_in - grad_w - grad_b


def _lower_block(ic_g: int, oc_g: int, *, channels_last: bool) -> int | None:
    """``ok_to_try_lower_zmm``: the channel block of grouped ``jit:avx512_core`` (or None)."""
    if channels_last and not (ic_g < _BLOCK and oc_g < _BLOCK):
        return _BLOCK
    if ic_g % _BLOCK == 0 == oc_g % _BLOCK:
        return _BLOCK
    found = next((b for b in (8, 4) if ic_g % b == 0 == oc_g % b), None)
    return _BLOCK if found is None and channels_last else found


def grouped_forward_scratch(
    x: Sequence[int],
    w: Sequence[int],
    out: Sequence[int],
    stride: Sequence[int],
    *,
    groups: int,
    channels_last: bool,
    threads: int,
) -> int:
    """Peak bytes of a float32 grouped ``convolution`` forward on oneDNN, above its output.

    Example:
        >>> grouped_forward_scratch((4, 24, 10, 10), (8, 6, 3, 3), (4, 8, 10, 10), (1, 1),
        ...                         groups=4, channels_last=False, threads=2)
        43328
    """
    ic_g, oc_g = x[1] // groups, w[0] // groups
    ks = w[2] * w[3]
    block = _lower_block(ic_g, oc_g, channels_last=channels_last)
    if channels_last:
        assert block is not None  # noqa: S101 - _lower_block always finds one here
        return groups * up(oc_g, block) * up(ic_g, block) * ks * _F32
    out_bytes = math.prod(out) * _F32
    if block is not None:
        return max(math.prod(x) * _F32 + math.prod(w) * _F32, out_bytes)
    is_, os_ = x[2] * x[3], out[2] * out[3]
    unit = ks == 1 and stride[0] == stride[1] == 1 and os_ == is_
    outer_work = groups * x[0]
    inner_work = -(-is_ // _BLOCK) * -(-ic_g // _BLOCK)
    outer = (is_ // threads < 64 and x[0] != 1) and (
        outer_work / up(outer_work, threads) >= inner_work / up(inner_work, threads)
        or os_ * ic_g * oc_g // threads < 64 * 1024
    )
    cols = entry((threads if outer else 1) * (0 if unit else ic_g * ks * os_) * _F32)
    return max(cols, out_bytes)
