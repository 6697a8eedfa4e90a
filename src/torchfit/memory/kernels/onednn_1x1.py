"""oneDNN's AVX2 1x1 convolution: the strided source copy and the weight reduction.

The ``jit_1x1:avx2`` kernels (``jit_avx2_1x1_conv_kernel_f32_t``) only run unit strides.
For a strided 1x1 convolution without padding whose output times the stride is exactly
the input (``rtus_prepare`` in ``src/cpu/x64/jit_uni_1x1_conv_utils.hpp``,
uxlfoundation/oneDNN v3.12, commit 80afa71, the version torch 2.13.0+cpu ships), the
primitive rewrites the problem to unit stride and, per thread, copies the strided
source's pixels into a unit-stride buffer before the kernel reads them
(``rtus_driver_t``). ``rtus_prepare_space_info`` books that buffer in the scratchpad:
``nthr * factor * is * ic_block`` floats, where ``is`` is the reduced (output) image
and ``factor`` the number of 8-channel blocks one thread copies at once:

* forward: ``jcp.nb_reduce``, all input channel blocks;
* backward-weights: ``jcp.nb_bcast_blocking``, the input channel blocks halved (or
  divided by 3) until at most 9 (``init_conf`` in ``jit_avx2_1x1_conv_kernel_f32.cpp``);
* backward-data would use ``jcp.nb_load_blocking_max``, but oneDNN runs
  ``brgconv_strided:avx2`` there (``ONEDNN_VERBOSE``), which has no such copy.

Without the copy's conditions (padding, or an input the stride does not divide) oneDNN
takes ``jit:avx2`` (no padding) or ``gemm:jit`` instead. Measured under
``ONEDNN_MAX_CPU_ISA=AVX2`` (torch 2.13.0+cpu, 2 threads): 8x32x8x8 * 64x32x1x1,
stride 2: forward 2 * 2,048 + 128 = 4,224 B of copy, backward-weights the same next to
its per-thread weight gradients (28,928 B of scratchpad).

Backward-weights reduces its weight gradient over the minibatch and pixels with a
``cpu_reducer_2d_t`` (``init_balancers`` in ``jit_avx2_1x1_convolution.hpp``): jobs of
``nb_oc_blocking x nb_ic_blocking`` 8x8 blocks, the output channel blocks cut to at most
32 the same way. Where the balancer gives each job one thread (many channels, two
threads), there is no reduction buffer at all: 2x128x8x8 * 256x128x1x1, stride 2, holds
no weight copies (the older rule, a copy per thread, was 246,016 B high).
"""

from __future__ import annotations

from collections.abc import Sequence

from torchfit.memory.kernels.onednn_scratchpad import F32, entry, reducer_2d_bytes, up

__all__ = ["AVX2_BLOCK", "rtus_applies", "rtus_scratch", "weights_reducer"]

AVX2_BLOCK = 8  # simd_w of jit_avx2_1x1_conv_kernel_f32_t
_BCAST_BLOCKING_LIMIT = 9  # bcast_blocking_lim, blocked (nChw8c) layouts
_LOAD_BLOCKING_LIMIT = 32  # backward-weights load_blocking, in blocks


def rtus_applies(
    x: Sequence[int],
    out: Sequence[int],
    kernel: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
) -> bool:
    """Whether oneDNN's 1x1 kernels copy a strided 2-D source to unit stride.

    Args:
        x: Input shape (N, C, H, W).
        out: Output shape (N, O, Ho, Wo).
        kernel: (kh, kw).
        stride: (sh, sw).
        padding: (ph, pw).

    Example:
        >>> rtus_applies((8, 32, 8, 8), (8, 64, 4, 4), (1, 1), (2, 2), (0, 0))
        True
        >>> rtus_applies((8, 32, 7, 7), (8, 64, 4, 4), (1, 1), (2, 2), (0, 0))
        False
    """
    return (
        all(k == 1 for k in kernel)
        and any(s != 1 for s in stride)
        and not any(padding)
        and all(o * s == i for o, s, i in zip(out[2:], stride, x[2:], strict=True))
    )


def _cut(channel_blocks: int, limit: int) -> int:
    """Blocks halved, else divided by 3, while above ``limit`` (``init_conf``'s loops)."""
    blocks = channel_blocks
    while blocks > limit:
        if blocks % 2 == 0:
            blocks //= 2
        elif blocks % 3 == 0:
            blocks //= 3
        else:
            break
    return blocks


def rtus_scratch(channels: int, out_pixels: int, *, threads: int, weights: bool) -> int:
    """Scratchpad bytes of the reduce-to-unit-stride copy (one booked entry).

    Args:
        channels: Input channels (padded to 8 here, as the blocked layout does).
        out_pixels: Pixels of the output image (``oh * ow``), the reduced source's size.
        threads: oneDNN's thread count (``dnnl_get_max_threads``).
        weights: Backward-weights (``nb_bcast_blocking``) rather than forward
            (``nb_reduce``).

    Example:
        >>> rtus_scratch(32, 16, threads=2, weights=True)  # 2 threads x 4 blocks x 16 x 8
        4224
    """
    blocks = up(channels, AVX2_BLOCK) // AVX2_BLOCK
    factor = _cut(blocks, _BCAST_BLOCKING_LIMIT) if weights else blocks
    return entry(threads * factor * out_pixels * AVX2_BLOCK * F32)


def weights_reducer(in_channels: int, out_channels: int, batch_pixels: int, *, threads: int) -> int:
    """Scratchpad bytes of backward-weights' weight-gradient reducer (``cpu_reducer_2d_t``).

    Args:
        in_channels: Input channels (padded to 8).
        out_channels: Output channels (padded to 8).
        batch_pixels: The reduction: minibatch times output pixels (``mb * nb_reduce``).
        threads: oneDNN's thread count.

    Example:
        >>> weights_reducer(64, 32, 4 * 256, threads=2)  # 2 copies of 32x64 and a barrier
        24704
        >>> weights_reducer(128, 256, 2 * 16, threads=2)  # one thread per job
        0
    """
    nb_ic = up(in_channels, AVX2_BLOCK) // AVX2_BLOCK
    nb_oc = up(out_channels, AVX2_BLOCK) // AVX2_BLOCK
    ic_blocking, oc_blocking = _cut(nb_ic, _BCAST_BLOCKING_LIMIT), _cut(nb_oc, _LOAD_BLOCKING_LIMIT)
    job_size = oc_blocking * ic_blocking * AVX2_BLOCK * AVX2_BLOCK
    njobs = -(-nb_oc // oc_blocking) * -(-nb_ic // ic_blocking)
    return reducer_2d_bytes(threads, job_size, njobs, batch_pixels, threads * job_size * 8)
