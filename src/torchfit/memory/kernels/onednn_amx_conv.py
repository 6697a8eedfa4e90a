"""oneDNN's bf16 convolution backward-weights on AMX (``brgconv_bwd_w``).

Under CPU autocast a first convolution (an RGB stem, a ViT patch embedding) computes only
its weight gradient in bfloat16. On a CPU with AMX tiles ATen's ``mkldnn_convolution``
backward runs ``brgconv_bwd_w:avx512_core_amx`` (``avx10_1_512_amx`` in
``ONEDNN_VERBOSE``) on channels-last (``acdb``) buffers. One call holds, measured here
(torch 2.13.0+cpu, oneDNN v3.12, Xeon with AMX-BF16, 2 threads), for ViT's 4x4 patches
(2x3x16x16 input, 64 output channels): the ``grad_output.contiguous()`` copy (4,096 B), the
reorders of grad_output and input to ``acdb`` (4,096 and 3,072 B), the weight gradient in
``ABcd16b16a2b`` (output channels padded to 16, input channels to 32: 65,536 B), the
scratchpad (312,496 B) and oneDNN's bias gradient (128 B), then the plain outputs.

`weights_scratchpad` replays the scratchpad: ``init_conf_bwd_w``, ``balance_bwd_w`` and
``init_scratchpad_bwd_w`` (``src/cpu/x64/jit_brgemm_conv_utils.cpp``): transposed source
and grad_output buffers per minibatch thread, f32 weight and bias reduction buffers (one
per minibatch thread for bf16 weights), barriers, the brgemm batch and two AMX tile pages
per thread; entries are booked as in `torchfit.memory.kernels.onednn_scratchpad`. Checked
byte for byte against the real call for 432 shapes (input channels 1-32, output channels
16-192, kernels 1-16, strides 1-16, batches 1-8) at 1, 2 and 3 threads.

Not modelled (`weights_scratchpad` returns ``None``): the thread split oneDNN takes for a
minibatch of at most half the threads with 64+ input and output channels (its "cubic"
heuristic), 1x1 kernels with 28+ threads, more than 2048 channels, kernels wider than
100; a grad_input (backward-data, ``brgconv_bwd_d``); channels-last operands; groups;
dilation.
"""

from __future__ import annotations

import dataclasses

from torchfit.memory.kernels.onednn_scratchpad import ALIGN, PAGE, entry, up

__all__ = ["Conv2d", "weights_call_scratch", "weights_scratchpad"]

_BF16 = 2
_F32 = 4
_BLOCK = 16
_TR_ROUND = 32  # tr_round: a full tile row
_BATCH_ELEMENT = 40  # sizeof(brgemm_batch_element_t)


def _div_up(a: int, b: int) -> int:
    return -(-a // b)


@dataclasses.dataclass(frozen=True)
class Conv2d:
    """A dense 2-D convolution as oneDNN's ``jcp`` sees it (no dilation, one group)."""

    mb: int
    ic: int
    oc: int
    ih: int
    iw: int
    kh: int
    kw: int
    sh: int
    sw: int
    ph: int
    pw: int

    @property
    def oh(self) -> int:
        """Output height."""
        return (self.ih + 2 * self.ph - self.kh) // self.sh + 1

    @property
    def ow(self) -> int:
        """Output width."""
        return (self.iw + 2 * self.pw - self.kw) // self.sw + 1


def _transposed_widths(conv: Conv2d, iw: int, ow: int) -> tuple[int, int, int]:
    """``tr_iw``, ``tr_ow`` and the guard elements of the transposed buffers."""
    r_pad = (ow - 1) * conv.sw + conv.kw - (iw + conv.pw)
    guard = up(max(conv.pw, r_pad + 1), _TR_ROUND)
    tr_iw = up(_div_up(iw + conv.pw + r_pad, conv.sw), _TR_ROUND) * conv.sw
    tr_ow = up(ow, 2)  # vnni_block of bf16
    if tr_ow > _TR_ROUND:  # a longer row for a better brgemm bd_block
        best_blocks, best = tr_ow // 2, tr_ow
        for width in range(tr_ow, up(tr_ow, _TR_ROUND) + 1, 2):
            step = next(i for i in range(_TR_ROUND, 0, -2) if width % i == 0)
            if width // step < best_blocks:
                best_blocks, best = width // step, width
        tr_ow = best
    return tr_iw, tr_ow, guard


def _balance(conv: Conv2d, dims: tuple[int, int, int, int], threads: int) -> tuple[int, int, int]:
    """``balance_bwd_w``'s memory-cost search: threads over minibatch, oc and ic blocks."""
    ih, oh, tr_iw, tr_ow = dims
    nb_ic, nb_oc = _div_up(conv.ic, _BLOCK), _div_up(conv.oc, _BLOCK)
    nb_icb, nb_ocb = (2 if nb_ic > 1 else 1), (2 if nb_oc > 1 else 1)
    os_chunks = conv.mb * oh
    oc_chunks, ic_chunks = _div_up(nb_oc, nb_ocb), _div_up(nb_ic, nb_icb)
    src_sp, dst_sp = conv.mb * ih * tr_iw, conv.mb * oh * tr_ow
    src_size, dst_size = src_sp * conv.ic * _BF16, dst_sp * conv.oc * _BF16
    wei_size = conv.oc * conv.ic * conv.kh * conv.kw * _F32
    wei_scale = 0.5 * (dst_size + src_size) / wei_size
    ratio = oc_chunks / ic_chunks
    src_coef = max(1.0 / ratio, 1.0) * (4.0 if wei_scale < 1.0 else 1.0)
    dst_coef, wei_coef = max(ratio, 1.0), max(wei_scale, 1.0)

    def cost(nthr_mb: int, nthr_oc_b: int, nthr_ic_b: int) -> float:
        thr_mb = _div_up(os_chunks, nthr_mb)
        ic_amount = _div_up(ic_chunks, nthr_ic_b) * _BLOCK * nb_icb
        oc_amount = _div_up(oc_chunks, _BLOCK * nb_ocb * nthr_oc_b) * _BLOCK * nb_ocb
        src_v = (
            _BF16 * src_coef * ic_amount * (thr_mb * (src_sp // os_chunks) // conv.sh // conv.sw)
        )
        dst_v = _BF16 * dst_coef * oc_amount * thr_mb * (dst_sp // os_chunks)
        wei_v = _F32 * wei_coef * oc_amount * ic_amount * conv.kh * conv.kw
        return src_v + dst_v + wei_v

    best, best_cost = (1, 1, 1), cost(1, 1, 1)
    for nthr_mb in range(1, min(threads, os_chunks) + 1):
        rest = threads // nthr_mb
        for nthr_oc_b in range(1, min(rest, oc_chunks) + 1):
            split = (nthr_mb, nthr_oc_b, min(rest // nthr_oc_b, nb_ic // nb_icb))
            if cost(*split) <= best_cost:
                best, best_cost = split, cost(*split)
    nthr_mb, nthr_oc_b, nthr_ic_b = best
    if threads // 2 < nthr_mb < threads:
        nthr_mb = min(os_chunks, threads)
    return nthr_mb, nthr_oc_b, nthr_ic_b


def weights_scratchpad(conv: Conv2d, *, bias: bool, threads: int, l2: int) -> int | None:
    """Scratchpad bytes of ``brgconv_bwd_w`` (bf16, AMX), or ``None`` where not modelled.

    Example:
        >>> vit = Conv2d(mb=2, ic=3, oc=64, ih=16, iw=16, kh=4, kw=4, sh=4, sw=4, ph=0, pw=0)
        >>> weights_scratchpad(vit, bias=True, threads=2, l2=2 * 1024**2)
        312496
    """
    pointwise = conv.kh == conv.kw == conv.sh == conv.sw == 1 and conv.ph == conv.pw == 0
    if (
        (conv.mb <= threads // 2 and conv.oc >= 64 and conv.ic >= 64)
        or (pointwise and threads >= 28)
        or max(conv.oc, conv.ic) > 2048
        or conv.kw > 100
    ):
        return None  # balance_bwd_w's special thread splits
    ih, iw, oh, ow, max_batch = conv.ih, conv.iw, conv.oh, conv.ow, conv.oh
    if pointwise and iw <= 28:  # a small 1x1 runs as a 1-d convolution
        ih, iw, oh, ow, max_batch = 1, iw * ih, 1, ow * oh, 1
    tr_iw, tr_ow, guard = _transposed_widths(conv, iw, ow)
    nthr_mb, nthr_oc_b, nthr_ic_b = _balance(conv, (ih, oh, tr_iw, tr_ow), threads)
    nthr = nthr_mb * nthr_oc_b * nthr_ic_b
    nb_ic, nb_oc = _div_up(conv.ic, _BLOCK), _div_up(conv.oc, _BLOCK)
    irow = _BF16 * tr_iw * _BLOCK * _div_up(nb_ic, nthr_ic_b) * 2
    orow = _BF16 * tr_ow * _BLOCK * _div_up(nb_oc, nthr_oc_b) * 2
    l2_budget = 0.8 * (3 * l2 // 4)  # brg_blocking_t::L2 is 3/4 of the per-core L2
    limit = int(max(1.0, max(0.0, l2_budget - conv.kh * irow) / (irow + orow)))
    oh_block = max(1, min(oh, _div_up(oh, _div_up(oh, limit))))
    in_rows = min(ih, (oh_block - 1) * min(conv.kh, conv.sh) + conv.kh)
    ih_block = min(ih, conv.sh * in_rows)
    tr_src = nthr_mb * nb_ic * tr_iw * _BLOCK * ih_block + guard
    tr_diff_dst = nthr_mb * nb_oc * tr_ow * _BLOCK * oh_block + tr_iw * _BLOCK
    weights = nb_oc * _BLOCK * nb_ic * _BLOCK * conv.kh * conv.kw
    biases = nb_oc * _BLOCK if bias else 0
    batch = _div_up(up(max_batch * _BATCH_ELEMENT, PAGE), _BATCH_ELEMENT)
    barrier = entry(PAGE, PAGE)  # simple_barrier::ctx_t: 4 KiB at 4 KiB alignment
    total = entry(tr_src * _BF16) + entry(tr_diff_dst * _BF16)
    for split in (nthr_oc_b, nthr_ic_b):  # barriers of the global transposes
        total += entry(nthr // split * PAGE, PAGE) if split > 1 else 0
    total += entry((weights + biases) * nthr_mb * _F32) + barrier
    total += 64 + ALIGN  # the AMX tile configuration, one cache line
    total += entry(nthr * batch * _BATCH_ELEMENT, PAGE) + entry(nthr * 2 * PAGE, PAGE)
    return total


def weights_call_scratch(
    conv: Conv2d, *, grad_copy: int, bias: bool, threads: int, l2: int
) -> int | None:
    """Bytes one bf16 ``convolution_backward`` without grad_input holds above its outputs.

    ``grad_copy`` is ATen's ``grad_output.contiguous()`` (0 for a contiguous gradient).
    NCHW operands are reordered to ``acdb`` unless they already match it (one channel, or
    a 1x1 plane); the weight gradient is blocked ``ABcd16b16a2b``.

    Example:
        >>> vit = Conv2d(mb=2, ic=3, oc=64, ih=16, iw=16, kh=4, kw=4, sh=4, sw=4, ph=0, pw=0)
        >>> weights_call_scratch(vit, grad_copy=4096, bias=True, threads=2, l2=2 * 1024**2)
        383152
    """
    scratchpad = weights_scratchpad(conv, bias=bias, threads=threads, l2=l2)
    if scratchpad is None:
        return None
    grad = conv.mb * conv.oc * conv.oh * conv.ow * _BF16
    source = conv.mb * conv.ic * conv.ih * conv.iw * _BF16
    reorders = (0 if conv.oc == 1 or conv.oh * conv.ow == 1 else grad) + (
        0 if conv.ic == 1 or conv.ih * conv.iw == 1 else source
    )
    blocked = up(conv.oc, _BLOCK) * up(conv.ic, 2 * _BLOCK) * conv.kh * conv.kw * _BF16
    bias_bytes = conv.oc * _BF16 if bias else 0
    outputs = conv.oc * conv.ic * conv.kh * conv.kw * _BF16 + bias_bytes
    return grad_copy + reorders + blocked + scratchpad + bias_bytes - outputs
