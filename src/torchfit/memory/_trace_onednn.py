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

* Scratchpad bookkeeping (``src/common/memory_tracking.hpp``, ``registry_t::book``): each
  entry costs its size plus its alignment, at least 128 B; entries aligned to a 4 KiB
  page cost 4 KiB more. A barrier context (``simple_barrier::ctx_t``, ``cpu_barrier.hpp``)
  is aligned to 4 KiB, so each one costs 8 KiB.
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
  (``[bwd_w:r2]``); otherwise oneDNN falls back to GEMM (``gemm:jit``, not modelled).
* Backward-data, stride 1: ``jit:avx512_core``, channels padded to 16, no scratchpad.
* Backward-data, stride > 1: ``brgconv_strided:avx512_core`` on channels-last buffers
  (no channel padding) with weights padded to 16 input channels, and two more copies
  of the input gradient on the way back to PyTorch. Its scratchpad is per-thread brgemm
  batches and buffers whose size follows oneDNN's cache-based blocking
  (``jit_brgemm_conv_bwd_utils.cpp``); measured for inputs up to 26 wide: 24,600 B per
  thread + 12,288 B, and 16,384 B per thread + 4,096 B more when the width is not a
  multiple of the stride (the ``has_uneven_iw`` output buffer). Wider inputs with many
  output channels take more (5x8x26x26 -> 32 channels: 94,256 B, modelled 61,488 B).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["ConvBackward", "backward_scratch", "reducer_bytes"]

_F32 = 4
_ALIGN = 128  # registry_t default alignment
_PAGE = 4096  # P4K
_BARRIER = 2 * _PAGE  # sizeof(ctx_t) == alignof(ctx_t) == 4096, booked at that alignment
_MIN_OH_REDUCE = 9  # jit_avx512_common_conv_bwd_weights_kernel_f32_t::min_oh_reduce
_BRG_THREAD, _BRG_BASE = 24_600, 3 * _PAGE
_BRG_UNEVEN_THREAD = 16_384


def _up(value: int, block: int) -> int:
    return -(-value // block) * block


def _entry(nbytes: int, align: int = _ALIGN) -> int:
    """Bytes one scratchpad entry costs (``registry_t::book``); 0 for an empty one."""
    return 0 if nbytes <= 0 else nbytes + max(align, _ALIGN)


def reducer_bytes(threads: int, job_size: int, njobs: int, reduction: int, max_buffer: int) -> int:
    """Scratchpad of one ``cpu_reducer_t`` (``reduce_balancer_t::balance``), in bytes.

    Example:
        >>> reducer_bytes(2, 16, 1, 2, 2 * 3 * 5 * 5 * 16 * 16)  # a bias of 16, batch 2
        12352
    """
    min_per_group = max(1, njobs // threads)
    max_per_group = max(1, max_buffer // (threads * job_size))
    groups = min(njobs // min_per_group, threads)
    per_group = min(threads // groups, reduction)
    jobs_ub = -(-njobs // groups)
    cost = njobs * job_size * reduction
    for candidate in range(min_per_group, njobs):
        c_groups = min(njobs // candidate, threads)
        c_per_group = min(threads // c_groups, reduction)
        c_jobs_ub = -(-njobs // c_groups)
        if c_per_group > 1 and c_jobs_ub > max_per_group:
            continue
        c_cost = job_size * c_jobs_ub * (-(-reduction // c_per_group) + (c_per_group != 1))
        if c_cost < cost:
            groups, per_group, jobs_ub, cost = c_groups, c_per_group, c_jobs_ub, c_cost
    if per_group == 1:
        return 0
    space = groups * (per_group - 1) * jobs_ub * job_size * _F32
    return _entry(space, _PAGE) + _entry(groups * _PAGE, _PAGE)


class ConvBackward:
    """The shapes of one 2-D convolution backward, as oneDNN's ``jcp`` sees them."""

    def __init__(
        self,
        x: Sequence[int],
        w: Sequence[int],
        out: Sequence[int],
        stride: Sequence[int],
        *,
        threads: int,
    ) -> None:
        """Record batch, channels, spatial sizes, kernel and stride."""
        self.mb, self.ic, self.ih, self.iw = x
        self.oc, _, self.kh, self.kw = w
        self.oh, self.ow = out[2], out[3]
        self.sh, self.sw = stride
        self.threads = threads
        self.first = self.ic in {1, 2, 3}

    # -- backward-weights ---------------------------------------------------------
    def weights_kernel(self) -> str:
        """``avx512`` (16-blocked), ``avx2`` (8-blocked) or ``gemm``."""
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
            ic = _up(self.ic, ic_block)
            oc = _up(self.oc, 16)
            nthr, nthr_mb = self._avx512_balance(ic // ic_block, ic_block, oc // 16)
            total = 0
            if nthr_mb > 1:
                total += _entry((oc * ic * self.kh * self.kw + oc) * (nthr_mb - 1) * _F32)
                total += _BARRIER
            if bias:
                if self.oc % 16:
                    total += _entry(oc * _F32)
                total += reducer_bytes(nthr, 16, oc // 16, self.mb, nthr * 3 * 5 * 5 * 16 * 16)
            return total
        if kind == "avx2":
            ic, oc = _up(self.ic, 8), _up(self.oc, 8)
            jobs = (ic // 8) * (oc // 8)
            job = self.kh * self.kw * 64
            total = reducer_bytes(self.threads, job, jobs, self.mb, 1 << 21)
            if bias:
                if self.oc % 8:
                    total += _entry(oc * _F32)
                total += reducer_bytes(self.threads, 8, oc // 8, self.mb, 1 << 21)
            return total
        # gemm:jit (gemm_convolution_utils.cpp, outer threading): per-thread weight
        # copies and im2col columns. Measured once (6x8x4x4 * 8x8x5x5): 77,056 B against
        # these 38,656 B; a lower bound, for a kernel taller than its input only.
        wei = self.threads * self.oc * self.ic * self.kh * self.kw * _F32
        cols = self.threads * self.ic * self.kh * self.kw * self.oh * self.ow * _F32
        return _entry(wei) + _entry(cols)

    def weights_buffers(self) -> tuple[int, int, int]:
        """Bytes of the reordered (grad_output, input, grad_weight) of backward-weights."""
        kind = self.weights_kernel()
        block = {"avx512": 16, "avx2": 8}.get(kind, 1)
        oc = _up(self.oc, block)
        ic = self.ic if self.first or kind == "gemm" else _up(self.ic, block)
        spatial_out, spatial_in = self.oh * self.ow, self.ih * self.iw
        dst = self.mb * oc * spatial_out * _F32 if kind != "gemm" else 0
        # A first convolution reads its input in place (plain layout).
        src = 0 if self.first or kind == "gemm" else self.mb * ic * spatial_in * _F32
        wei = oc * ic * self.kh * self.kw * _F32 if kind != "gemm" else 0
        return dst, src, wei

    # -- backward-data --------------------------------------------------------------
    def data_strided(self) -> bool:
        """Whether backward-data runs ``brgconv_strided`` (channels-last) kernels."""
        return self.sh > 1 or self.sw > 1

    def data_peak(self, grad_in: int) -> int:
        """Peak bytes of backward-data, the finished (plain) input gradient included."""
        spatial_in, spatial_out = self.ih * self.iw, self.oh * self.ow
        if self.data_strided():
            dst = self.mb * self.oc * spatial_out * _F32
            wei = self.oc * _up(self.ic, 16) * self.kh * self.kw * _F32
            scratch = self.threads * _BRG_THREAD + _BRG_BASE
            if self.iw % self.sw:
                scratch += self.threads * _BRG_UNEVEN_THREAD + _PAGE
            # channels-last grad_input, then two copies on the way back to ATen.
            return max(dst + wei + grad_in + scratch, 3 * grad_in)
        ic, oc = _up(self.ic, 16), _up(self.oc, 16)
        dst = self.mb * oc * spatial_out * _F32
        wei = oc * ic * self.kh * self.kw * _F32
        src = self.mb * ic * spatial_in * _F32
        return max(dst + wei + src, src + grad_in)


def backward_scratch(
    x: Sequence[int],
    w: Sequence[int],
    out: Sequence[int],
    stride: Sequence[int],
    mask: Sequence[bool],
    *,
    threads: int,
) -> int:
    """Peak bytes of a float32 2-D ``convolution_backward`` on oneDNN, above its outputs.

    Args:
        x: Input shape (N, C, H, W).
        w: Weight shape (O, C, kh, kw).
        out: Output (grad_output) shape.
        stride: (sh, sw).
        mask: Which of grad_input, grad_weight, grad_bias are computed.
        threads: oneDNN's thread count (``torch.get_num_threads()``).

    Returns:
        Bytes the call holds at its peak beyond its outputs.

    Example:
        >>> backward_scratch((4, 1, 16, 16), (16, 1, 3, 3), (4, 16, 8, 8), (2, 2),
        ...                  (False, True, True), threads=2)
        37696
    """
    conv = ConvBackward(x, w, out, stride, threads=threads)
    grad_in = math.prod(x) * _F32 if mask[0] else 0
    grad_w = math.prod(w) * _F32 if mask[1] else 0
    grad_b = w[0] * _F32 if mask[2] else 0
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
