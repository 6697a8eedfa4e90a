"""Scratch of the CPU convolutions: oneDNN's reorders and scratchpads, ATen's im2col.

``aten.convolution`` and ``aten.convolution_backward`` on CPU pick a backend the same way
the kernel does (``torch._C._select_conv_backend``). On ``Mkldnn`` (oneDNN) a call
reorders its operands into blocked layouts, asks for a scratchpad and reorders its
results back; on the ``Slow*`` backends ATen unfolds the input into im2col columns. The
modules `onednn`, `onednn_nhwc` and `onednn_groups` replay oneDNN's kernels for float32
2-D convolutions; where no model applies, the reorders alone are counted.

Measured with ``torch.profiler`` allocation events inside each call, compared with the
call's outputs (torch 2.13.0+cpu, oneDNN v3.12 with AVX-512, 2 threads); the figures are
quoted at each rule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from torchfit.memory.kernels.layout import cpu_twin
from torchfit.memory.kernels.machine import CpuMachine
from torchfit.memory.kernels.onednn import backward_scratch
from torchfit.memory.kernels.onednn_1x1 import AVX2_BLOCK, rtus_applies, rtus_scratch
from torchfit.memory.kernels.onednn_amx_conv import Conv2d, weights_call_scratch
from torchfit.memory.kernels.onednn_groups import (
    depthwise_scratch,
    grouped_forward_scratch,
    grouped_scratch,
)
from torchfit.memory.kernels.onednn_nhwc import avx2_modelled, backward_scratch_nhwc
from torchfit.memory.kernels.tensors import channels_last, copy_if_strided, dense_bytes, pointwise

__all__ = ["conv_backend", "conv_backward", "conv_forward"]

_SLOW = frozenset({"Slow2d", "Slow3d", "SlowDilated2d", "SlowDilated3d"})


def conv_backend(args: Sequence[Any]) -> str:
    """The backend ATen's CPU convolution takes for these arguments (``Mkldnn``, ...).

    The same choice the kernel makes (``torch._C._select_conv_backend``, from
    ``aten/src/ATen/native/Convolution.cpp``); meta tensors are asked as CPU ones.

    Example:
        >>> x, w = torch.empty(2, 8, 16, 16, device="meta"), torch.empty(8, 8, 3, 3, device="meta")
        >>> conv_backend((x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1))
        'Mkldnn'
    """
    x, w, b, stride, padding, dilation, transposed, output_padding, groups = args[:9]
    backend = torch._C._select_conv_backend(  # noqa: SLF001 - the same choice the kernel makes
        cpu_twin(x),
        cpu_twin(w),
        cpu_twin(b),
        stride,
        padding,
        dilation,
        transposed,
        output_padding,
        groups,
        None,
    )
    return str(backend).rsplit(".", 1)[-1]


def _conv_sizes(
    cpu: CpuMachine,
    x: torch.Tensor,
    w: torch.Tensor,
    out_shape: Sequence[int],
    groups: int,
    *,
    unit_1x1: bool,
) -> dict[str, int]:
    """Byte sizes of the oneDNN blocked buffers of a conv (channels padded to the block)."""
    es = x.element_size()
    n, c_in = x.shape[0], x.shape[1]
    c_out = w.shape[0]
    spatial_in = math.prod(x.shape[2:])
    spatial_out = math.prod(out_shape[2:])
    kernel = math.prod(w.shape[2:])
    depthwise = groups == c_in and groups > 1
    # oneDNN keeps a source with fewer channels than a block in plain layout (the
    # "first convolution" kernels); measured: Cin=3, 5, 8 plain with 16-blocks,
    # Cin=16, 32 blocked. Unstrided 1x1 kernels read a blocked (padded) source: measured
    # (4, 1, 23, 23) with 4x1x1x1 weights peaks at 271,872 = 2 * 135,424 + 1,024, while a
    # strided 1x1 conv of (7, 3, 17, 17) keeps it plain (72,576 = dst + output). AVX2's
    # jit_1x1 reads a strided source blocked too where it copies it to unit stride
    # (`onednn_1x1`; ONEDNN_VERBOSE: 4x3x8x8 stride 2 reads ``aBcd8b``, padded).
    src_blocked = cpu.block > 1 and (
        depthwise or (c_in // groups) >= cpu.block or (kernel == 1 and unit_1x1)
    )
    return {
        "src_b": n * cpu.pad(c_in) * spatial_in * es if src_blocked else 0,
        "dst_b": n * cpu.pad(c_out) * spatial_out * es,
        # Weights: output channels padded; input channels too when the source is blocked
        # (measured: ViT's 64x3x8x8 patch weights reorder to 49,152 B, unpadded).
        "wei_b": cpu.pad(c_out)
        * (cpu.pad(w.shape[1]) if src_blocked and groups == 1 else w.shape[1])
        * kernel
        * es,
        "out": n * c_out * spatial_out * es,
        "in": n * c_in * spatial_in * es,
        "cols": n * w.shape[1] * groups * kernel * spatial_out * es,
    }


def _unit_1x1(cpu: CpuMachine, args: Sequence[Any], out_shape: Sequence[int]) -> bool:
    """A unit stride, or (AVX2) a strided 1x1 that oneDNN copies to unit stride."""
    x, w, _b, stride, padding = args[:5]
    if all(v == 1 for v in stride):
        return True
    return cpu.block == AVX2_BLOCK and rtus_applies(
        x.shape, out_shape, w.shape[2:], stride, padding
    )


def conv_forward(cpu: CpuMachine, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    """``aten.convolution``: oneDNN's blocked reorders, or ATen's im2col columns."""
    del kwargs
    x, w, _b, stride, padding, _dil, transposed, _op, groups = args[:9]
    if transposed or not isinstance(out, torch.Tensor):
        return 0
    backend = conv_backend(args)
    sizes = _conv_sizes(cpu, x, w, out.shape, groups, unit_1x1=_unit_1x1(cpu, args, out.shape))
    grouped = groups > 1 and not (groups == x.shape[1] == w.shape[0])
    if backend == "Mkldnn" and grouped and cpu.block == 16 and _plain_2d(x, _dil):
        # grouped, not depthwise: 4/8/16-blocked jit:avx512_core or gemm:jit
        return grouped_forward_scratch(
            tuple(x.shape),
            tuple(w.shape),
            tuple(out.shape),
            tuple(stride),
            groups=groups,
            channels_last=channels_last(x) or channels_last(w),
            threads=cpu.threads,
        )
    if backend == "Mkldnn":
        if channels_last(x) or channels_last(w):
            return sizes["wei_b"]
        # Reorders of source and weights to blocked layouts and a blocked destination,
        # then the destination is reordered into the plain output. Measured peaks:
        # 8x32x32x32 k3 -> 2,007,040 = src 1,048,576 + wei 36,864 + dst 921,600;
        # 4x3x32x32 -> 16 ch k3 p1 -> 524,288 = dst 262,144 + out 262,144.
        # A bias of a channel count off the block is padded in a scratchpad entry (size +
        # 128 B of alignment), freed with the weights: 8 channels 192 B, 24 channels 256 B;
        # on AVX2 (8-blocks) 20 channels 224 B.
        bias = 0
        if _b is not None and cpu.block in {8, 16} and w.shape[0] % cpu.block:
            bias = cpu.pad(w.shape[0]) * x.element_size() + 128
        stage = bias + sizes["src_b"] + sizes["wei_b"] + sizes["dst_b"]
        stage += _avx2_rtus_forward(cpu, args, out)
        peak = max(stage, sizes["dst_b"] + sizes["out"])
        return peak - sizes["out"]
    if backend in _SLOW:
        # im2col columns: 1x4x8x8 k3 p1 -> 9,216 B measured = N*Cin*k*k*Ho*Wo*4.
        return 0 if pointwise(w, stride, padding) else sizes["cols"]
    return 0


def _avx2_rtus_forward(cpu: CpuMachine, args: tuple[Any, ...], out: torch.Tensor) -> int:
    """``jit_1x1:avx2`` forward of a strided NCHW 1x1 conv: its unit-stride source copy.

    All input channel blocks per thread (``nb_reduce``, `onednn_1x1`); measured
    8x32x8x8 * 64x32x1x1 stride 2 under AVX2 dispatch: 2,176 / 4,224 / 6,272 B over
    the reorders at 1 / 2 / 3 threads. AVX-512 runs brgemm 1x1 kernels without it.
    """
    x, w, _b, stride, padding, _dil, _transposed, _op, groups = args[:9]
    if cpu.block != AVX2_BLOCK or groups != 1 or x.dim() != 4 or x.dtype != torch.float32:
        return 0
    if not rtus_applies(x.shape, out.shape, w.shape[2:], stride, padding):
        return 0
    pixels = out.shape[2] * out.shape[3]
    return rtus_scratch(x.shape[1], pixels, threads=cpu.threads, weights=False)


def _plain_2d(x: torch.Tensor, dilation: Sequence[int]) -> bool:
    """A float32 2-D convolution without dilation."""
    return x.dim() == 4 and x.dtype == torch.float32 and all(d == 1 for d in dilation)


def _onednn_modelled(
    x: torch.Tensor, w: torch.Tensor, dilation: Sequence[int], groups: int
) -> bool:
    """Whether `backward_scratch` models this convolution (float32, NCHW, 2-D, dense)."""
    return (
        x.dim() == 4
        and x.dtype == torch.float32
        and groups == 1
        and all(d == 1 for d in dilation)
        and not channels_last(x)
        and not channels_last(w)
    )


def _onednn_depthwise(
    x: torch.Tensor, w: torch.Tensor, dilation: Sequence[int], groups: int
) -> bool:
    """Whether `depthwise_scratch` models this convolution (float32, NCHW, 2-D)."""
    return (
        x.dim() == 4
        and x.dtype == torch.float32
        and 1 < groups == x.shape[1] == w.shape[0]
        and all(d == 1 for d in dilation)
        and not channels_last(x)
        and not channels_last(w)
    )


def _onednn_nhwc(x: torch.Tensor, dilation: Sequence[int]) -> bool:
    """A float32 2-D convolution on channels-last activations (oneDNN's nxc kernels)."""
    return (
        x.dim() == 4
        and x.dtype == torch.float32
        and all(d == 1 for d in dilation)
        and channels_last(x)
    )


def _copy_unless_nhwc(tensor: torch.Tensor) -> int:
    """``.contiguous(memory_format=torch.channels_last)``: a copy unless it already is."""
    return 0 if tensor.is_contiguous(memory_format=torch.channels_last) else dense_bytes(tensor)


def _onednn_backward(cpu: CpuMachine, args: tuple[Any, ...], copy: int) -> int | None:
    """Scratch of a backward on oneDNN's modelled kernels (AVX-512, AVX2 dense), or None."""
    grad_out, x, w, _bias_sizes, stride, padding, dilation = args[:7]
    groups, mask = args[9], args[10]
    shapes = (tuple(x.shape), tuple(w.shape), tuple(grad_out.shape), tuple(stride))
    flags = tuple(bool(m) for m in mask)
    if _onednn_modelled(x, w, dilation, groups):
        # Plain float32 2-D convolutions: oneDNN's kernels, layouts and scratchpads
        # (`torchfit.memory.kernels.onednn`), AVX-512 or AVX2.
        scratch = backward_scratch(
            *shapes, flags, padding=tuple(padding), threads=cpu.threads, block=cpu.block
        )
        return None if scratch is None else copy + scratch
    if _onednn_depthwise(x, w, dilation, groups):
        # NCHW depthwise: jit_dw backward-data, jit_dw or gemm:jit backward-weights
        # (AVX2: jit_dw:avx2 on 8-blocked buffers, ONEDNN_VERBOSE).
        scratch = depthwise_scratch(
            *shapes, flags, padding=tuple(padding), threads=cpu.threads, block=cpu.block
        )
        return copy + scratch
    if cpu.block == 16 and _onednn_modelled(x, w, dilation, 1):
        # NCHW grouped: jit:avx512_core (4/8/16-blocked), gemm:jit or brgconv_strided
        # backward-data, jit:avx2, jit:avx512_core or gemm:jit backward-weights (see
        # `torchfit.memory.kernels.onednn_groups`); None where a kernel is not modelled.
        scratch = grouped_scratch(
            *shapes, flags, groups=groups, padding=tuple(padding), threads=cpu.threads
        )
        return None if scratch is None else copy + scratch
    if _onednn_nhwc(x, dilation) and (cpu.block == 16 or avx2_modelled(x.shape, w.shape, groups)):
        # Channels-last activations: ATen turns grad_output and the weights channels-last
        # (copies unless they already are), then oneDNN's nxc kernels
        # (`torchfit.memory.kernels.onednn_nhwc`).
        scratch = backward_scratch_nhwc(
            *shapes,
            flags,
            groups=groups,
            padding=tuple(padding),
            threads=cpu.threads,
            block=cpu.block,
        )
        if scratch is not None:
            return _copy_unless_nhwc(grad_out) + _copy_unless_nhwc(w) + scratch
    return None


def _amx_weights(cpu: CpuMachine, args: tuple[Any, ...], copy: int) -> int | None:
    """A bf16 backward without grad_input on AMX (`onednn_amx_conv`), or None."""
    _grad_out, x, w, bias_sizes, stride, padding, dilation = args[:7]
    groups, mask = args[9], args[10]
    if (
        mask[0]
        or not cpu.l2
        or x.dim() != 4
        or groups != 1
        or any(d != 1 for d in dilation)
        or channels_last(x)
        or channels_last(w)
    ):
        return None
    conv = Conv2d(
        mb=x.shape[0],
        ic=x.shape[1],
        oc=w.shape[0],
        ih=x.shape[2],
        iw=x.shape[3],
        kh=w.shape[2],
        kw=w.shape[3],
        sh=stride[0],
        sw=stride[1],
        ph=padding[0],
        pw=padding[1],
    )
    bias = bool(mask[2]) and bias_sizes is not None
    return weights_call_scratch(conv, grad_copy=copy, bias=bias, threads=cpu.threads, l2=cpu.l2)


def conv_backward(cpu: CpuMachine, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    """``aten.convolution_backward``: oneDNN's kernels, or ATen's im2col columns."""
    del kwargs
    (
        grad_out,
        x,
        w,
        _bias_sizes,
        stride,
        padding,
        dilation,
        transposed,
        output_padding,
        groups,
        mask,
    ) = args[:11]
    if transposed:
        return 0
    outputs = sum(dense_bytes(t) for t in out if isinstance(t, torch.Tensor))
    backend = conv_backend(
        (x, w, None, stride, padding, dilation, transposed, output_padding, groups)
    )
    unit_1x1 = _unit_1x1(cpu, (x, w, None, stride, padding), grad_out.shape)
    sizes = _conv_sizes(cpu, x, w, grad_out.shape, groups, unit_1x1=unit_1x1)
    # The kernel starts with grad_output.contiguous() (``convolution_backward`` in
    # aten/src/ATen/native/Convolution.cpp): a copy of a strided gradient.
    copy = copy_if_strided(grad_out)
    if backend == "Mkldnn" and cpu.amx and x.dtype == torch.bfloat16:
        amx = _amx_weights(cpu, args, copy)
        if amx is not None:
            return amx
    if backend == "Mkldnn" and cpu.block in {8, 16}:
        modelled = _onednn_backward(cpu, args, copy)
        if modelled is not None:
            return modelled
    if backend == "Mkldnn":
        grad_in = sizes["in"] if mask[0] else 0
        # backward-data: blocked grad_output, reordered weights, blocked grad_input,
        # then the plain grad_input.
        stage_data = (
            max(sizes["dst_b"] + sizes["wei_b"] + sizes["src_b"], sizes["src_b"] + grad_in)
            if mask[0]
            else 0
        )
        # backward-weights: blocked source and grad_output and blocked grad_weight, next to
        # the finished grad_input. Measured 4x16x20x20 -> 32 ch k3 p1 with bias:
        # 455,040 = grad_in 102,400 + src 102,400 + dst 204,800 + wei 18,432 + 27,008 of
        # plain grad_weight/grad_bias and oneDNN reduction scratch.
        wei_b = sizes["wei_b"]
        stage_weights = grad_in + sizes["src_b"] + sizes["dst_b"] + wei_b if mask[1] else 0
        if mask[2]:
            stage_weights += dense_bytes(w) + w.shape[0] * x.element_size()
        return copy + max(stage_data, stage_weights) - outputs
    if backend in _SLOW:
        # Measured 1x4x8x8 k3 p1: 9,216 B over the outputs, the im2col columns again.
        cols = 0 if pointwise(w, stride, padding) else sizes["cols"]
        return copy + cols
    return copy
