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
* Channels-last activations: `backward_scratch_nhwc` (depthwise and strided dense).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["ConvBackward", "backward_scratch", "backward_scratch_nhwc", "reducer_bytes"]

_F32 = 4
_ALIGN = 128  # registry_t default alignment
_PAGE = 4096  # P4K
_BARRIER = 2 * _PAGE  # sizeof(ctx_t) == alignof(ctx_t) == 4096, booked at that alignment
_MIN_OH_REDUCE = 9  # jit_avx512_common_conv_bwd_weights_kernel_f32_t::min_oh_reduce
_BATCH_ELEMENT = 40  # sizeof(brgemm_batch_element_t), brgemm_types.hpp


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
        padding: Sequence[int],
        threads: int,
        groups: int = 1,
    ) -> None:
        """Record batch, channels, spatial sizes, kernel, stride, padding and groups."""
        self.mb, self.ic, self.ih, self.iw = x
        self.oc, _, self.kh, self.kw = w
        self.oh, self.ow = out[2], out[3]
        self.sh, self.sw = stride
        self.ph, self.pw = padding
        self.threads = threads
        self.groups = groups
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
        wei, os_ = self.oc * ic_g * ks * _F32, self.oh * self.ow
        src, dst = self.mb * self.ic * self.ih * self.iw * _F32, self.mb * self.oc * os_ * _F32
        limit = min(1 << 30, 15 * self.threads * (src + wei + dst))
        estimate = _F32 * self.threads * (wei + ic_g * ks * 16)
        outer = estimate < limit and os_ // self.threads < 256 and (self.mb != 1 or self.groups > 2)
        nthr = self.threads if outer else 1
        cols = 0 if self.kh == self.kw == self.sh == self.sw == 1 else ic_g * ks * os_
        return _entry(nthr * wei * _F32) + _entry(nthr * cols * _F32)

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
        # gemm:jit writes a plain grad_weight of its own, copied out afterwards.
        wei = oc * ic * self.kh * self.kw * _F32
        return dst, src, wei

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
        an input buffer of ``rnd_up(ohp * owp * oc, 4096)`` float32 elements (the padded
        grad_output extent times all output channels: ``inp_buffer_size``); a mask of
        ``rnd_up(nb_ih * nb_iw * nb_oc, 4096)`` bytes (4 KiB while the blocks number fewer
        than 4096); and, when the width is not a multiple of the stride
        (``has_uneven_iw``, ``exec_trans``), an output buffer of
        ``rnd_up(iw_block * stride_w * ic, 4096)`` elements, taken at ``iw_block`` = the
        width rounded up to the stride. Each entry is page-aligned (+4 KiB). Measured
        (2 threads, 5x8xHxH * 32x8x3x3, stride 2, pad 1): H=20 61,488 B, H=24 94,256 B,
        H=25 131,120 B (the older constant rule was right only below 4096 elements).
        """
        ohp = self._padded_out(self.ih, self.oh, self.kh, self.sh, self.ph)
        owp = self._padded_out(self.iw, self.ow, self.kw, self.sw, self.pw)
        batch = -(-_up(self.kh * self.kw * _BATCH_ELEMENT, _PAGE) // _BATCH_ELEMENT)
        per_thread = [
            batch * _BATCH_ELEMENT,
            _up(ohp * owp * self.oc, _PAGE) * _F32,
            _PAGE,
        ]
        if self.iw % self.sw:
            per_thread.append(_up(_up(self.iw, self.sw) * self.sw * self.ic, _PAGE) * _F32)
        return sum(_entry(self.threads * size, _PAGE) for size in per_thread)

    def data_peak(self, grad_in: int) -> int:
        """Peak bytes of backward-data, the finished (plain) input gradient included."""
        spatial_in, spatial_out = self.ih * self.iw, self.oh * self.ow
        if self.data_strided():
            dst = self.mb * self.oc * spatial_out * _F32
            wei = self.oc * _up(self.ic, 16) * self.kh * self.kw * _F32
            scratch = self.brgconv_strided_scratch()
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
    padding: Sequence[int],
    threads: int,
) -> int:
    """Peak bytes of a float32 2-D ``convolution_backward`` on oneDNN, above its outputs.

    Args:
        x: Input shape (N, C, H, W).
        w: Weight shape (O, C, kh, kw).
        out: Output (grad_output) shape.
        stride: (sh, sw).
        padding: (ph, pw), symmetric as ATen passes it.
        mask: Which of grad_input, grad_weight, grad_bias are computed.
        threads: oneDNN's thread count (``torch.get_num_threads()``).

    Returns:
        Bytes the call holds at its peak beyond its outputs.

    Example:
        >>> backward_scratch((4, 1, 16, 16), (16, 1, 3, 3), (4, 16, 8, 8), (2, 2),
        ...                  (False, True, True), padding=(1, 1), threads=2)
        37696
    """
    conv = ConvBackward(x, w, out, stride, padding=padding, threads=threads)
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
    grad_w = math.prod(w) * _F32 if mask[1] else 0
    bias = oc * _F32 if mask[2] else 0
    data = 0
    if mask[0]:
        if depthwise:
            data = _up(groups, 16) * ks * _F32
        elif groups > 1 and not (strided and oc // groups > 16):
            data = groups * _up(oc // groups, 16) * _up(ic // groups, 16) * ks * _F32
        else:
            # brgconv_strided, also for groups of more than 16 output channels
            conv = ConvBackward(x, w, out, stride, padding=padding, threads=threads)
            data = oc * _up(ic // groups, 16) * ks * _F32 + conv.brgconv_strided_scratch()
    weights = 0
    if mask[1]:
        if first:
            # a first convolution's jit:avx512_core weights (Acdb16a) and its reductions
            conv = ConvBackward(x, w, out, stride, padding=padding, threads=threads)
            diff_w = _up(oc, 16) * ic * ks * _F32
            scratch = conv.weights_scratch(bias=mask[2])
        elif depthwise and kw <= 3 and _dw_weights_ok(x, w, out, stride, padding):
            diff_w = _up(groups, 16) * ks * _F32
            scratch = 0
            if threads > 1:
                scratch = _entry((threads - 1) * diff_w)
                if mask[2]:
                    scratch += _entry(groups * (threads - 1) * _F32)
        else:
            oc_g, ic_g = oc // groups, ic // groups
            diff_w = groups * _up(oc_g, 16) * _up(ic_g, 16) * ks * _F32
            scratch = _entry(groups * _up(oc_g, 16) * _F32) if mask[2] and oc_g % 16 else 0
        # the scratchpad lives before grad_weight and grad_bias are made; then the plain
        # grad_weight sits next to the blocked one and an unpadded bias copy
        weights = diff_w + max(scratch - grad_w, bias + grad_w)
    # the data stage runs before grad_weight and grad_bias exist
    return max(data - grad_w - bias, weights)


def _dw_weights_ok(
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
