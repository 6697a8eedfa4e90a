"""oneDNN's f32 convolution backward on x86 CPUs: the buffers one call allocates.

``aten.convolution_backward`` on the ``Mkldnn`` backend runs two oneDNN primitives,
backward-data then backward-weights. Through ideep each one reorders its operands into
the layouts the chosen kernel wants, asks for a *scratchpad* (a single allocation from
PyTorch's CPU allocator, freed when the primitive returns), and reorders its results back.
`backward_scratch` replays that sequence and returns the call's peak of live bytes above
its outputs, so the tracker can count it as a transient at the op.

What decides the sizes (read from oneDNN's sources, uxlfoundation/oneDNN, and checked
against torch 2.13.0+cpu, which ships oneDNN v3.12, with ``ONEDNN_VERBOSE`` and the
profiler's allocation events, 2 threads, AVX-512):

* Scratchpad bookkeeping: `torchfit.memory.kernels.onednn_scratchpad`.
* Backward-weights, ``jit:avx512_core`` (``jit_avx512_common_conv_kernel.cpp``): channels
  padded to 16 (the input's left plain for a first convolution of 1-3 channels); threads
  split over minibatch, input and output channel blocks by ``balance()``; with
  ``nthr_mb > 1`` threads, ``nthr_mb - 1`` private copies of the weight and bias gradients
  and a barrier; the bias gradient is reduced by a ``cpu_reducer_t`` over the minibatch
  (``cpu_reducer.cpp``: a page-aligned buffer, one barrier per group, one more page).
  Measured: (4, 1, 16, 16) * 16x1x3x3 with bias -> 21,312 B = weights 768 + barrier
  8,192 + bias reducer 12,352.
* Backward-weights, ``jit:avx2`` (``jit_avx2_conv_kernel_f32.cpp``), taken when the input
  channels are neither 1-3 nor a multiple of 16: channels padded to 8, and both weight
  and bias gradients reduced by ``cpu_reducer_t``. Measured 5x8x12x12 * 8x8x5x5 with
  bias: 31,008 B = weight reducer 18,688 + bias reducer 12,320. It needs ``kh <= ih``
  (``[bwd_w:r2]``); otherwise oneDNN falls back to ``gemm:jit``, whose per-thread
  weight copies are booked 4x too large (``book<float>`` of a byte count).
* Backward-data, stride 1: ``jit:avx512_core``, channels padded to 16, no scratchpad.
* Backward-data, stride > 1: ``brgconv_strided:avx512_core`` on channels-last buffers
  (no channel padding) with weights padded to 16 input channels, and two more copies
  of the input gradient on the way back to PyTorch. Its scratchpad is per-thread: a
  brgemm batch, a grad_output buffer of the padded output extent times the output
  channels rounded up to 4096 elements, a block mask, and an output buffer for a width
  that is not a multiple of the stride (`ConvBackward.brgconv_strided_scratch`). The
  cache sizes oneDNN reads (``platform::get_per_core_cache_size``) only pick ``ih_block``,
  which moves the mask alone, and the mask stays one page below 4096 blocks.
* Channels-last activations: `torchfit.memory.kernels.onednn_nhwc`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torchfit.memory.kernels.onednn_1x1 import rtus_applies, rtus_scratch, weights_reducer
from torchfit.memory.kernels.onednn_scratchpad import (
    BARRIER,
    F32,
    PAGE,
    entry,
    reducer_bytes,
    up,
)

__all__ = ["ConvBackward", "backward_scratch"]

_MIN_OH_REDUCE = 9  # jit_avx512_common_conv_bwd_weights_kernel_f32_t::min_oh_reduce
_BATCH_ELEMENT = 40  # sizeof(brgemm_batch_element_t), brgemm_types.hpp


class ConvBackward:
    """The shapes of one 2-D convolution backward, as oneDNN's ``jcp`` sees them."""

    def __init__(
        self,
        x: Sequence[int],
        w: Sequence[int],
        out: Sequence[int],
        stride: Sequence[int],
        *,
        padding: Sequence[int],
        threads: int,
        groups: int = 1,
        block: int = 16,
    ) -> None:
        """Record batch, channels, spatial sizes, kernel, stride, padding, groups, block.

        ``block`` is oneDNN's channel block: 16 where it runs AVX-512 kernels, 8 where it
        runs AVX2 ones (`torchfit.memory.kernels.machine.cpu_block`).
        """
        self.mb, self.ic, self.ih, self.iw = x
        self.oc, _, self.kh, self.kw = w
        self.oh, self.ow = out[2], out[3]
        self.sh, self.sw = stride
        self.ph, self.pw = padding
        self.threads = threads
        self.groups = groups
        self.block = block
        # AVX-512 keeps a 1-3 channel source plain; AVX2's jit:avx2 only a 3-channel one
        # (ONEDNN_VERBOSE: ic 1 backward-weights reads ``aBcd8b`` padded, ic 3 ``abcd``).
        self.first = self.ic in {1, 2, 3} if block == 16 else self.ic == 3

    # -- backward-weights ---------------------------------------------------------
    def weights_kernel(self) -> str:
        """``avx512`` (16-blocked), ``avx2`` (8-blocked), ``gemm`` or ``1x1``.

        With AVX2 only (``block == 8``) there is no 16-blocked kernel: ``jit:avx2`` takes
        every dense kernel that fits (``kh <= ih``) and ``jit_1x1:avx2`` the 1x1 ones
        without padding, strided ones only where it can copy the source to unit stride
        (`torchfit.memory.kernels.onednn_1x1`); ``ONEDNN_VERBOSE`` shows ``jit:avx2``
        for a strided 1x1 whose input the stride does not divide and ``gemm:jit`` for a
        padded 1x1.
        """
        if self.block == 8:
            if self.kh == self.kw == 1:
                if self.ph or self.pw:
                    return "gemm"
                if not self.data_strided() or self.rtus():
                    return "1x1"
            return "avx2" if self.kh <= self.ih else "gemm"
        if self.first or self.ic % 16 == 0:
            return "avx512"
        return "avx2" if self.kh <= self.ih else "gemm"

    def _avx512_balance(self, nb_ic: int, ic_block: int, nb_oc: int) -> tuple[int, int]:
        """(nthr, nthr_mb) from ``jit_avx512_common_conv_bwd_weights_kernel_f32_t::balance``."""
        nthr = self.threads
        two_d = self.oh > _MIN_OH_REDUCE
        ih_r, oh_r = (self.ih, self.oh) if two_d else (1, 1)
        ih_n, oh_n = (1, 1) if two_d else (self.ih, self.oh)
        nthr_oh = max(1, oh_r // _MIN_OH_REDUCE)

        def mem(mb_t: int, oc_t: int, ic_t: int) -> int:
            src = -(-self.mb * ih_r // mb_t) * -(-nb_ic // ic_t) * ic_block * ih_n * self.iw
            src = src // self.sh // self.sw
            dst = -(-self.mb * oh_r // mb_t) * -(-nb_oc // oc_t) * 16 * oh_n * self.ow
            wei = 8 * -(-nb_oc // oc_t) * -(-nb_ic // ic_t) * self.kh * self.kw * ic_block * 16
            return src + dst + wei

        def comp(mb_t: int, oc_t: int, ic_t: int) -> int:
            return -(-self.mb * oh_r // mb_t) * -(-nb_oc // oc_t) * -(-nb_ic // ic_t)

        best = (1, 1, 1)
        best_mem = mem(*best)
        mb_max = min(nthr, self.mb * nthr_oh)
        splits = [
            (mb_t, oc_t, min(nthr // mb_t // oc_t, nb_ic))
            for mb_t in range(1, mb_max + 1)
            for oc_t in range(1, min(nthr // mb_t, nb_oc) + 1)
        ]
        for split in splits:
            if mem(*split) <= best_mem:
                best, best_mem = split, mem(*split)
        best_comp = comp(*best)
        for split in splits:
            cost = comp(*split)
            if (cost <= best_comp and mem(*split) < 1.1 * best_mem) or 4 * cost <= 3 * best_comp:
                best, best_comp = split, cost
        mb_t, oc_t, ic_t = best
        if nthr // 2 < mb_t < nthr:
            mb_t = min(self.mb * nthr_oh, nthr)
        return mb_t * oc_t * ic_t, mb_t

    def weights_scratch(self, *, bias: bool) -> int:
        """Scratchpad bytes of the backward-weights primitive."""
        kind = self.weights_kernel()
        if kind == "avx512":
            ic_block = self.ic if self.first else 16
            ic = up(self.ic, ic_block)
            oc = up(self.oc, 16)
            nthr, nthr_mb = self._avx512_balance(ic // ic_block, ic_block, oc // 16)
            total = 0
            if nthr_mb > 1:
                total += entry((oc * ic * self.kh * self.kw + oc) * (nthr_mb - 1) * F32)
                total += BARRIER
            if bias:
                if self.oc % 16:
                    total += entry(oc * F32)
                total += reducer_bytes(nthr, 16, oc // 16, self.mb, nthr * 3 * 5 * 5 * 16 * 16)
            return total
        if kind == "avx2":
            # a flat (3-channel) source: one job of all input channels per 8 outputs
            ic_block = self.ic if self.first and self.block == 8 else 8
            ic, oc = up(self.ic, ic_block), up(self.oc, 8)
            jobs = (ic // ic_block) * (oc // 8)
            job = self.kh * self.kw * ic_block * 8
            total = reducer_bytes(self.threads, job, jobs, self.mb, 1 << 21)
            if bias:
                if self.oc % 8:
                    total += entry(oc * F32)
                total += reducer_bytes(self.threads, 8, oc // 8, self.mb, 1 << 21)
            return total
        if kind == "1x1":
            # jit_1x1:avx2, no bias: the weight-gradient reducer (measured 4x64x16x16 *
            # 32x64x1x1, 2 threads: 24,704 B = 2 * 8,192 + 128 + a barrier 8,192) and,
            # strided, the reduce-to-unit-stride copy of the source (`onednn_1x1`).
            pixels = self.oh * self.ow
            reducer = weights_reducer(self.ic, self.oc, self.mb * pixels, threads=self.threads)
            if not self.data_strided():
                return reducer
            return reducer + rtus_scratch(self.ic, pixels, threads=self.threads, weights=True)
        return self._gemm_weights_scratch()

    def _gemm_weights_scratch(self) -> int:
        """``gemm:jit`` backward-weights (``gemm_convolution_utils.cpp``, plain layouts).

        With outer threading every thread gets a weight-gradient copy and im2col columns.
        The copies are booked as ``book<float>(nthr * weights_d.size())``, and ``size()``
        is already in bytes: 4x the weight bytes per thread. Measured (2 threads,
        4x8x4x4 * Ox8x5x5): O=8 77,056, O=16 128,256, O=32 230,656 B; 1-4 threads
        38,656 B per thread. Grouped: ``jcp.ic`` is a group's channels, the weights
        all groups', and outer threading also runs for ``mb == 1`` past two groups.
        """
        ks, ic_g = self.kh * self.kw, self.ic // self.groups
        wei, os_ = self.oc * ic_g * ks * F32, self.oh * self.ow
        src, dst = self.mb * self.ic * self.ih * self.iw * F32, self.mb * self.oc * os_ * F32
        limit = min(1 << 30, 15 * self.threads * (src + wei + dst))
        estimate = F32 * self.threads * (wei + ic_g * ks * 16)
        outer = estimate < limit and os_ // self.threads < 256 and (self.mb != 1 or self.groups > 2)
        nthr = self.threads if outer else 1
        cols = 0 if self.kh == self.kw == self.sh == self.sw == 1 else ic_g * ks * os_
        return entry(nthr * wei * F32) + entry(nthr * cols * F32)

    def weights_buffers(self) -> tuple[int, int, int]:
        """Bytes of the reordered (grad_output, input, grad_weight) of backward-weights."""
        kind = self.weights_kernel()
        block = {"avx512": 16, "avx2": 8, "1x1": 8}.get(kind, 1)
        oc = up(self.oc, block)
        flat = self.first and (kind == "avx512" or (kind == "avx2" and self.block == 8))
        ic = self.ic if flat or kind == "gemm" else up(self.ic, block)
        spatial_out, spatial_in = self.oh * self.ow, self.ih * self.iw
        dst = self.mb * oc * spatial_out * F32 if kind != "gemm" else 0
        # A first convolution reads its input in place (plain layout).
        src = 0 if flat or kind == "gemm" else self.mb * ic * spatial_in * F32
        # gemm:jit writes a plain grad_weight of its own, copied out afterwards.
        wei = oc * ic * self.kh * self.kw * F32
        return dst, src, wei

    def rtus(self) -> bool:
        """Whether a 1x1 kernel copies this strided source to unit stride (`rtus_applies`)."""
        x, out = (self.mb, self.ic, self.ih, self.iw), (self.mb, self.oc, self.oh, self.ow)
        return rtus_applies(x, out, (self.kh, self.kw), (self.sh, self.sw), (self.ph, self.pw))

    # -- backward-data --------------------------------------------------------------
    def data_strided(self) -> bool:
        """Whether backward-data runs ``brgconv_strided`` (channels-last) kernels."""
        return self.sh > 1 or self.sw > 1

    def _padded_out(self, size_in: int, size_out: int, k: int, stride: int, pad: int) -> int:
        """``ohp``/``owp``: the output extent plus the rows the kernel overhangs.

        ``jcp.t_ovf = max(0, kh - 1 - t_pad) / stride_h`` and likewise at the bottom,
        whose padding oneDNN derives from the sizes (``(oh - 1) * sh + kh - ih - t_pad``).
        """
        end_pad = (size_out - 1) * stride + k - size_in - pad
        return size_out + max(0, k - 1 - pad) // stride + max(0, k - 1 - end_pad) // stride

    def brgconv_strided_scratch(self) -> int:
        """Scratchpad of ``brgconv_strided`` backward-data (``init_scratchpad``).

        Per thread (``jit_brgemm_conv_bwd_utils.cpp``, oneDNN v3.12): a brgemm batch of
        ``kh * kw`` 40-byte elements rounded up to a 4 KiB page (``adjusted_batch_size``);
        an input buffer of ``rndup(ohp * owp * oc, 4096)`` float32 elements (the padded
        grad_output extent times all output channels: ``inp_buffer_size``); a mask of
        ``rndup(nb_ih * nb_iw * nb_oc, 4096)`` bytes (4 KiB while the blocks number fewer
        than 4096); and, when the width is not a multiple of the stride
        (``has_uneven_iw``, ``exec_trans``), an output buffer of
        ``rndup(iw_block * stride_w * ic, 4096)`` elements, taken at ``iw_block`` = the
        width rounded up to the stride. Each entry is page-aligned (+4 KiB). Measured
        (2 threads, 5x8xHxH * 32x8x3x3, stride 2, pad 1): H=20 61,488 B, H=24 94,256 B,
        H=25 131,120 B (the older constant rule was right only below 4096 elements).
        """
        ohp = self._padded_out(self.ih, self.oh, self.kh, self.sh, self.ph)
        owp = self._padded_out(self.iw, self.ow, self.kw, self.sw, self.pw)
        batch = -(-up(self.kh * self.kw * _BATCH_ELEMENT, PAGE) // _BATCH_ELEMENT)
        per_thread = [
            batch * _BATCH_ELEMENT,
            up(ohp * owp * self.oc, PAGE) * F32,
            PAGE,
        ]
        if self.iw % self.sw:
            per_thread.append(up(up(self.iw, self.sw) * self.sw * self.ic, PAGE) * F32)
        return sum(entry(self.threads * size, PAGE) for size in per_thread)

    def data_peak(self, grad_in: int) -> int:
        """Peak bytes of backward-data, the finished (plain) input gradient included."""
        spatial_in, spatial_out = self.ih * self.iw, self.oh * self.ow
        if self.data_strided():
            dst = self.mb * self.oc * spatial_out * F32
            wei = self.oc * up(self.ic, self.block) * self.kh * self.kw * F32
            scratch = self.brgconv_strided_scratch()
            # channels-last grad_input, then two copies on the way back to ATen.
            return max(dst + wei + grad_in + scratch, 3 * grad_in)
        ic, oc = up(self.ic, self.block), up(self.oc, self.block)
        dst = self.mb * oc * spatial_out * F32
        wei = oc * ic * self.kh * self.kw * F32
        src = self.mb * ic * spatial_in * F32
        return max(dst + wei + src, src + grad_in)


def backward_scratch(
    x: Sequence[int],
    w: Sequence[int],
    out: Sequence[int],
    stride: Sequence[int],
    mask: Sequence[bool],
    *,
    padding: Sequence[int],
    threads: int,
    block: int = 16,
) -> int | None:
    """Peak bytes of a float32 2-D ``convolution_backward`` on oneDNN, above its outputs.

    Args:
        x: Input shape (N, C, H, W).
        w: Weight shape (O, C, kh, kw).
        out: Output (grad_output) shape.
        stride: (sh, sw).
        padding: (ph, pw), symmetric as ATen passes it.
        mask: Which of grad_input, grad_weight, grad_bias are computed.
        threads: oneDNN's thread count (``torch.get_num_threads()``).
        block: oneDNN's channel block, 16 (AVX-512 kernels) or 8 (AVX2 kernels).

    Returns:
        Bytes the call holds at its peak beyond its outputs; ``None`` where oneDNN picks
        a kernel this model leaves out (AVX2's ``jit_1x1`` backward-weights with a bias).

    Example:
        >>> backward_scratch((4, 1, 16, 16), (16, 1, 3, 3), (4, 16, 8, 8), (2, 2),
        ...                  (False, True, True), padding=(1, 1), threads=2)
        37696
    """
    conv = ConvBackward(x, w, out, stride, padding=padding, threads=threads, block=block)
    if mask[1] and conv.weights_kernel() == "1x1" and mask[2]:
        return None  # jit_1x1:avx2 with a bias: not modelled
    grad_in = math.prod(x) * F32 if mask[0] else 0
    grad_w = math.prod(w) * F32 if mask[1] else 0
    grad_b = w[0] * F32 if mask[2] else 0
    peak_data = conv.data_peak(grad_in) if mask[0] else 0
    peak_weights = 0
    if mask[1]:
        dst, src, wei = conv.weights_buffers()
        # oneDNN's bias gradient is unpadded (the padded one lives in the scratchpad);
        # measured +32 B for 8 channels, freed after the plain copy.
        bias_b = grad_b
        running = dst + src + wei + conv.weights_scratch(bias=mask[2]) + bias_b
        # then the plain grad_weight and grad_bias appear next to their blocked copies
        peak_weights = grad_in + max(running, wei + bias_b + grad_w + grad_b)
    return max(peak_data, peak_weights) - grad_in - grad_w - grad_b
