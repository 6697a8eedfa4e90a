"""Kernel scratch that a dispatch-level tracker cannot see: one small rule per op.

A fake-tensor trace sees the outputs of every ATen op, not the buffers a CPU kernel
allocates inside itself (oneDNN reorders, per-thread partial sums, ``.contiguous()``
copies of its inputs). Each rule below returns the bytes by which the op's real peak
exceeds its outputs: the tracker counts them as a transient allocation, alive together
with the outputs, freed when the op returns.

Every rule was found by measuring: a real step ran under ``torch.profiler`` with each
ATen op wrapped in a ``record_function``, and the allocator events inside each op were
compared with the op's outputs (torch 2.13.0+cpu, oneDNN with AVX-512, 2 threads). The
measured figures are quoted in comments; the thread count and the oneDNN channel block
are read at trace time, so the rules follow the machine the step will run on.

CUDA kernels keep their scratch elsewhere (cuBLAS/cuDNN workspaces that persist across
steps), so the CUDA target has no per-op rules here; see `cuda_notes`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from torchfit.memory.kernels.onednn import backward_scratch, backward_scratch_nhwc
from torchfit.memory.kernels.onednn_groups import (
    depthwise_scratch,
    grouped_forward_scratch,
    grouped_scratch,
)

__all__ = ["CpuRules", "cpu_block", "workspace_rules"]

aten = torch.ops.aten

Rule = Callable[["CpuRules", tuple[Any, ...], dict[str, Any], Any], int]


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str) -> Any:
    if len(args) > index:
        return args[index]
    return kwargs.get(name)


def _nbytes(tensor: torch.Tensor) -> int:
    """Bytes of a dense copy of ``tensor`` (what ``.contiguous()`` allocates)."""
    return tensor.numel() * tensor.element_size()


def _copy_if_strided(tensor: object) -> int:
    """``.contiguous()`` inside a kernel: a full copy unless already contiguous."""
    if isinstance(tensor, torch.Tensor) and not tensor.is_contiguous():
        return _nbytes(tensor)
    return 0


def _acc_size(tensor: torch.Tensor) -> int:
    """Element size of the accumulation type (float for half/bfloat16 on CPU)."""
    return 8 if tensor.dtype == torch.float64 else 4


def cpu_block() -> int:
    """The oneDNN channel block on this CPU: 16 with AVX-512, 8 with AVX2, else 1.

    oneDNN's blocked layouts (``nChw16c``/``nChw8c``) pad channels to this block; the
    ``onednn_verbose`` log of a conv shows ``aBcd16b`` with AVX-512.
    """
    capability = torch.backends.cpu.get_cpu_capability()
    if capability.startswith("AVX512"):
        return 16
    if capability == "AVX2":
        return 8
    return 1


@dataclasses.dataclass(frozen=True)
class CpuRules:
    """The CPU workspace rules, for a thread count and a oneDNN channel block."""

    threads: int
    block: int

    def pad(self, channels: int) -> int:
        """Channels rounded up to the oneDNN block."""
        return -(-channels // self.block) * self.block

    def __call__(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
        """Scratch bytes of one op call (0 when no rule applies)."""
        rule = _RULES.get(func)
        return 0 if rule is None else max(0, rule(self, args, kwargs, out))


# -- convolution ---------------------------------------------------------------------
def _conv_backend(args: Sequence[Any]) -> str:
    x, w, b, stride, padding, dilation, transposed, output_padding, groups = args[:9]
    backend = torch._C._select_conv_backend(  # noqa: SLF001 - the same choice the kernel makes
        x, w, b, stride, padding, dilation, transposed, output_padding, groups, None
    )
    return str(backend).rsplit(".", 1)[-1]


def _conv_sizes(
    rules: CpuRules,
    x: torch.Tensor,
    w: torch.Tensor,
    out_shape: Sequence[int],
    groups: int,
    *,
    unit_stride: bool,
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
    # strided 1x1 conv of (7, 3, 17, 17) keeps it plain (72,576 = dst + output).
    src_blocked = rules.block > 1 and (
        depthwise or (c_in // groups) >= rules.block or (kernel == 1 and unit_stride)
    )
    return {
        "src_b": n * rules.pad(c_in) * spatial_in * es if src_blocked else 0,
        "dst_b": n * rules.pad(c_out) * spatial_out * es,
        # Weights: output channels padded; input channels too when the source is blocked
        # (measured: ViT's 64x3x8x8 patch weights reorder to 49,152 B, unpadded).
        "wei_b": rules.pad(c_out)
        * (rules.pad(w.shape[1]) if src_blocked and groups == 1 else w.shape[1])
        * kernel
        * es,
        "out": n * c_out * spatial_out * es,
        "in": n * c_in * spatial_in * es,
        "cols": n * w.shape[1] * groups * kernel * spatial_out * es,
    }


def _channels_last(t: torch.Tensor) -> bool:
    """``suggest_memory_format() == channels_last``: channels-last and not plain-contiguous."""
    if t.dim() == 4:
        return t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()
    if t.dim() == 5:
        return t.is_contiguous(memory_format=torch.channels_last_3d) and not t.is_contiguous()
    return False


def _is_pointwise(w: torch.Tensor, stride: Sequence[int], padding: Sequence[int]) -> bool:
    return all(k == 1 for k in w.shape[2:]) and all(s == 1 for s in stride) and not any(padding)


def _conv_forward(rules: CpuRules, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    del kwargs
    x, w, _b, stride, padding, _dil, transposed, _op, groups = args[:9]
    if transposed or not isinstance(out, torch.Tensor):
        return 0
    backend = _conv_backend(args)
    sizes = _conv_sizes(rules, x, w, out.shape, groups, unit_stride=all(v == 1 for v in stride))
    grouped = groups > 1 and not (groups == x.shape[1] == w.shape[0])
    if backend == "Mkldnn" and grouped and rules.block == 16 and _plain_2d(x, _dil):
        # grouped, not depthwise: 4/8/16-blocked jit:avx512_core or gemm:jit
        return grouped_forward_scratch(
            tuple(x.shape),
            tuple(w.shape),
            tuple(out.shape),
            tuple(stride),
            groups=groups,
            channels_last=_channels_last(x) or _channels_last(w),
            threads=rules.threads,
        )
    if backend == "Mkldnn":
        if _channels_last(x) or _channels_last(w):
            return sizes["wei_b"]
        # Reorders of source and weights to blocked layouts and a blocked destination,
        # then the destination is reordered into the plain output. Measured peaks:
        # 8x32x32x32 k3 -> 2,007,040 = src 1,048,576 + wei 36,864 + dst 921,600;
        # 4x3x32x32 -> 16 ch k3 p1 -> 524,288 = dst 262,144 + out 262,144.
        # A bias of a channel count off the block is padded in a scratchpad entry (size +
        # 128 B of alignment), freed with the weights: 8 channels 192 B, 24 channels 256 B.
        bias = 0
        if _b is not None and rules.block == 16 and w.shape[0] % 16:
            bias = rules.pad(w.shape[0]) * x.element_size() + 128
        stage = bias + sizes["src_b"] + sizes["wei_b"] + sizes["dst_b"]
        peak = max(stage, sizes["dst_b"] + sizes["out"])
        return peak - sizes["out"]
    if backend in {"Slow2d", "Slow3d", "SlowDilated2d", "SlowDilated3d"}:
        # im2col columns: 1x4x8x8 k3 p1 -> 9,216 B measured = N*Cin*k*k*Ho*Wo*4.
        return 0 if _is_pointwise(w, stride, padding) else sizes["cols"]
    return 0


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
        and not _channels_last(x)
        and not _channels_last(w)
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
        and not _channels_last(x)
        and not _channels_last(w)
    )


def _onednn_nhwc(x: torch.Tensor, dilation: Sequence[int]) -> bool:
    """A float32 2-D convolution on channels-last activations (oneDNN's nxc kernels)."""
    return (
        x.dim() == 4
        and x.dtype == torch.float32
        and all(d == 1 for d in dilation)
        and _channels_last(x)
    )


def _copy_unless_nhwc(tensor: torch.Tensor) -> int:
    """``.contiguous(memory_format=torch.channels_last)``: a copy unless it already is."""
    return 0 if tensor.is_contiguous(memory_format=torch.channels_last) else _nbytes(tensor)


def _onednn_backward(rules: CpuRules, args: tuple[Any, ...], copy: int) -> int | None:
    """Scratch of a backward on oneDNN's modelled kernels (AVX-512), or None."""
    grad_out, x, w, _bias_sizes, stride, padding, dilation = args[:7]
    groups, mask = args[9], args[10]
    shapes = (tuple(x.shape), tuple(w.shape), tuple(grad_out.shape), tuple(stride))
    flags = tuple(bool(m) for m in mask)
    if _onednn_modelled(x, w, dilation, groups):
        # Plain float32 2-D convolutions: oneDNN's kernels, layouts and scratchpads
        # (see _trace_onednn).
        return copy + backward_scratch(
            *shapes, flags, padding=tuple(padding), threads=rules.threads
        )
    if _onednn_depthwise(x, w, dilation, groups):
        # NCHW depthwise: jit_dw backward-data, jit_dw or gemm:jit backward-weights.
        return copy + depthwise_scratch(
            *shapes, flags, padding=tuple(padding), threads=rules.threads
        )
    if _onednn_modelled(x, w, dilation, 1):
        # NCHW grouped: jit:avx512_core (4/8/16-blocked), gemm:jit or brgconv_strided
        # backward-data, jit:avx2, jit:avx512_core or gemm:jit backward-weights (see
        # _trace_onednn_groups); None where a kernel is not modelled.
        scratch = grouped_scratch(
            *shapes, flags, groups=groups, padding=tuple(padding), threads=rules.threads
        )
        return None if scratch is None else copy + scratch
    if _onednn_nhwc(x, dilation):
        # Channels-last activations: ATen turns grad_output and the weights channels-last
        # (copies unless they already are), then oneDNN's nxc kernels (see _trace_onednn).
        scratch = backward_scratch_nhwc(
            *shapes, flags, groups=groups, padding=tuple(padding), threads=rules.threads
        )
        if scratch is not None:
            return _copy_unless_nhwc(grad_out) + _copy_unless_nhwc(w) + scratch
    return None


def _conv_backward(rules: CpuRules, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
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
    outputs = sum(_nbytes(t) for t in out if isinstance(t, torch.Tensor))
    backend = _conv_backend(
        (x, w, None, stride, padding, dilation, transposed, output_padding, groups)
    )
    sizes = _conv_sizes(
        rules, x, w, grad_out.shape, groups, unit_stride=all(v == 1 for v in stride)
    )
    # The kernel starts with grad_output.contiguous(): FACTS.md's 4.27 MB Conv2d step.
    copy = _copy_if_strided(grad_out)
    if backend == "Mkldnn" and rules.block == 16:
        modelled = _onednn_backward(rules, args, copy)
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
            stage_weights += _nbytes(w) + w.shape[0] * x.element_size()
        return copy + max(stage_data, stage_weights) - outputs
    if backend in {"Slow2d", "Slow3d", "SlowDilated2d", "SlowDilated3d"}:
        # Measured 1x4x8x8 k3 p1: 9,216 B over the outputs, the im2col columns again.
        cols = 0 if _is_pointwise(w, stride, padding) else sizes["cols"]
        return copy + cols
    return copy


# -- normalization -------------------------------------------------------------------
def _layer_norm_backward(
    rules: CpuRules, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any
) -> int:
    del kwargs, out
    grad_out, x, normalized_shape, _mean, _rstd, weight = args[:6]
    mask = args[7]
    extra = _copy_if_strided(grad_out) + _copy_if_strided(x)
    if weight is not None and (mask[1] or mask[2]):
        # Per-thread partial sums of dgamma and dbeta in the accumulation type. Measured:
        # (4, 64, 64) -> 1,024 B and (4, 3136) -> 50,176 B = 2 threads * 2 * N * 4.
        extra += rules.threads * 2 * math.prod(normalized_shape) * _acc_size(x)
    return extra


def _group_norm_backward(
    rules: CpuRules, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any
) -> int:
    del rules, kwargs, out
    x, n, c = args[1], args[5], args[6]
    # ds and db per (sample, channel): measured (4, 16, 30, 30) -> 512 B = 2 * 4 * 16 * 4.
    return int(2 * n * c * _acc_size(x))


def _batch_norm(rules: CpuRules, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    del rules, kwargs, out
    x = args[0]
    channels = x.shape[1] if x.dim() > 1 else 1
    # Per-channel statistics: measured 128 B for (4, 16, 32, 32) = 2 * 16 * 4, and
    # 384 B for (8, 24) = 4 * 24 * 4 (the 2-D path keeps two more).
    return (2 if x.dim() > 2 else 4) * channels * _acc_size(x)


def _batch_norm_backward(
    rules: CpuRules, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any
) -> int:
    del rules, kwargs, out
    grad_out, x = args[0], args[1]
    if x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=_NHWC):
        # Channels-last input (measured, fp32, 2 threads): with a channels-last gradient
        # one temporary of the input's size ((4, 48, 18, 18) -> 248,832 B; (2, 16, 8, 8)
        # -> 8,192 B); with a plain-layout gradient only 4 bytes per channel (192 B for
        # 48 channels, 64 B for 16, 128 B for 32).
        if grad_out.is_contiguous(memory_format=_NHWC):
            return _nbytes(x)
        return 4 * int(x.shape[1])
    # A full temporary of the input's size: measured (4, 16, 32, 32) -> 262,144 B,
    # (4, 16, 8, 8) -> 16,384 B, (8, 24) -> 768 B.
    return _nbytes(x) + _copy_if_strided(grad_out)


_NHWC = torch.channels_last


# -- embeddings, attention, matmul -----------------------------------------------------
def _embedding(rules: CpuRules, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    del rules, kwargs, out
    # indices.contiguous(): transformers' expanded token_type_ids buffer, (4, 64) -> 2,048 B.
    return _copy_if_strided(args[1])


def _embedding_backward(
    rules: CpuRules, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any
) -> int:
    del rules, kwargs, out
    # grad.contiguous() and indices.contiguous(): measured 2,304 B for an expanded
    # (4, 9, 16) gradient, + 288 B for transposed (4, 9) indices.
    return _copy_if_strided(args[0]) + _copy_if_strided(args[1])


def _flash_split(q_len: int) -> int:
    # aten/src/ATen/native/cpu/FlashAttentionKernel.cpp: q split 256 / 64 / 32 by length.
    if q_len >= 768:
        return 256
    if q_len >= 192:
        return 64
    return 32


def _flash_forward(rules: CpuRules, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    del kwargs, out
    q, k = args[0], args[1]
    q_len, kv_len, head = q.shape[-2], k.shape[-2], q.shape[-1]
    q_split = min(_flash_split(q_len), q_len)
    kv_split = min(512, kv_len)
    # Per-thread buffers (qk, max, sum, dst) in the accumulation type, plus a reduced-type
    # copy of qk for half/bfloat16. Measured (4, 4, 64, 16) causal: 20,992 B =
    # 2 threads * (32*64 + 32 + 32 + 32*16) * 4; (4, 4, 17, 16): 4,760 B.
    per_thread = q_split * kv_split + 2 * q_split + q_split * head
    extra = rules.threads * per_thread * _acc_size(q)
    if q.dtype in {torch.float16, torch.bfloat16}:
        extra += rules.threads * q_split * (kv_split + kv_split % 2) * q.element_size()
    return int(extra)


def _flash_backward(
    rules: CpuRules, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any
) -> int:
    del kwargs, out
    grad_out, q, k = args[0], args[1], args[2]
    q_len, kv_len = q.shape[-2], k.shape[-2]
    q_split = min(_flash_split(q_len), q_len)
    kv_split = min(512, kv_len)
    # grad_out.contiguous() (of the transposed view, see _scaled_dot_product_flash_
    # attention_cpu_backward in aten/src/ATen/native/transformers/attention.cpp),
    # per-thread attn and grad_attn blocks (accumulation type, and
    # reduced copies for half/bfloat16), and one dsum row block on the calling thread
    # (worker threads' allocations are not seen by the profiler). Measured
    # (4, 4, 64, 16): 32,896 B = 2 * 2 * 32 * 64 * 4 + 32 * 4.
    # The kernel sees (B, L, H, E) views: it copies grad_out unless that view is dense.
    extra = _copy_if_strided(grad_out.transpose(1, 2))
    extra += rules.threads * 2 * q_split * kv_split * _acc_size(q)
    if q.dtype in {torch.float16, torch.bfloat16}:
        extra += rules.threads * 2 * q_split * kv_split * q.element_size()
    return int(extra + q_split * _acc_size(q))


def _safe_softmax(rules: CpuRules, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    del rules, kwargs, out
    x, dim = args[0], args[1]
    # self == -inf (bool), all() over dim (bool), and a scalar: measured (4, 4, 64, 64)
    # -> 66,564 B = 65,536 + 1,024 + 4.
    return int(x.numel() + x.numel() // max(1, x.shape[dim]) + 4)


def _blas_ok(t: object) -> bool:
    """Whether BLAS can read ``t`` in place (row- or column-major last two dims)."""
    if not isinstance(t, torch.Tensor) or t.dim() < 2:
        return True
    rows, cols = t.shape[-2], t.shape[-1]
    s_rows, s_cols = t.stride(-2), t.stride(-1)
    return (s_cols == 1 and s_rows >= max(1, cols)) or (s_rows == 1 and s_cols >= max(1, rows))


def _matmul(first: int) -> Rule:
    def rule(rules: CpuRules, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
        del rules, kwargs, out
        # An operand BLAS cannot read (an expanded gradient with stride 0) is copied:
        # measured mm((4, 10) expanded, (10, 32)) -> 160 B.
        return sum(_nbytes(t) for t in args[first : first + 2] if not _blas_ok(t))

    return rule


_RULES: dict[Any, Rule] = {
    aten.convolution.default: _conv_forward,
    aten.convolution_backward.default: _conv_backward,
    aten.native_layer_norm_backward.default: _layer_norm_backward,
    aten.native_group_norm_backward.default: _group_norm_backward,
    aten.native_batch_norm.default: _batch_norm,
    aten.native_batch_norm_backward.default: _batch_norm_backward,
    aten.embedding.default: _embedding,
    aten.embedding_dense_backward.default: _embedding_backward,
    aten._scaled_dot_product_flash_attention_for_cpu.default: _flash_forward,  # noqa: SLF001
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default: _flash_backward,  # noqa: SLF001
    aten._safe_softmax.default: _safe_softmax,  # noqa: SLF001
    aten.mm.default: _matmul(0),
    aten.bmm.default: _matmul(0),
    aten.addmm.default: _matmul(1),
    aten.baddbmm.default: _matmul(1),
}


@functools.cache
def _cpu_rules(threads: int, block: int) -> CpuRules:
    return CpuRules(threads=threads, block=block)


def workspace_rules(device: str) -> CpuRules | None:
    """The per-op scratch rules for a target device (``None``: none apply)."""
    if device == "cpu":
        return _cpu_rules(torch.get_num_threads(), cpu_block())
    return None
