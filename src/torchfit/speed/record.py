"""Record the kernels of a real step run on fake tensors: shapes in, `Op` rows out.

The step runs on fake CPU tensors (`torchfit.memory`'s tracing machinery: nothing is
allocated, a 70B model records in seconds) with the GPU's choices applied as the memory
trace applies them: CUDA's autocast op lists (`cuda_autocast_on_cpu`) and
``scaled_dot_product_attention`` as one fused kernel (`FusedSdpa`). A dispatch mode
sees every ATen op that runs, forward and backward (gradient checkpointing's
recomputation included), and turns each kernel-launching op into an `Op`:

- ``mm``/``addmm``/``bmm``/``baddbmm``: a matmul, FLOPs ``2·b·m·n·k``;
- ``convolution``/``convolution_backward``: a convolution, FLOPs from
  ``torch.utils.flop_counter`` (PyTorch's own formulas) forward and one forward's per
  gradient backward (the counter's backward over-counts grouped convolutions), shape as
  its implicit GEMM
  plus the activation bytes a tensor-core kernel must transpose when they are NCHW
  (`nchw_bytes`);
- the fused attention ops: FLOPs ``4·b·h·s_q·s_k·d`` forward (half when causal, as
  FlashAttention's kernels skip the masked half and its papers count), 2.5 times that
  backward (five matmuls against two: Dao 2023, arXiv:2307.08691, section 3.1);
- everything else that launches a kernel: memory-bound, its bytes the tensors it reads
  and writes (a broadcast input read once, a gathered table only where it is read);
  a normalization CUDA runs in two passes reads its inputs twice
  (`torchfit.speed.traffic.second_pass_bytes`).

An op whose CUDA implementation first makes a strided input contiguous is preceded by
that copy (`torchfit.speed.layouts.hidden_copies`: layer norm, FlashAttention's
backward), which its meta function does not show.

A matmul records whether its operands' row strides suit Hopper's tensor memory
accelerator (`torchfit.speed.traffic.tma_aligned`): the roofline times a 16-bit one that
does not on older instructions.

Views (``view``, ``t``, ``expand``...), allocations without a fill (``empty``) and
metadata queries launch no kernel and are skipped.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

from torchfit.speed.layouts import hidden_copies
from torchfit.speed.ops import Op, OpKind, Phase
from torchfit.speed.traffic import read_bytes, second_pass_bytes, tma_aligned

__all__ = ["OpRecorder", "attention_dropout", "attention_flops", "dtype_name", "nchw_bytes"]

_MATMULS = frozenset({"mm", "addmm", "bmm", "baddbmm"})
_CONVS = frozenset({"convolution", "convolution_backward"})
_ATTENTION_FORWARD = frozenset(
    {
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
    }
)
_ATTENTION = _ATTENTION_FORWARD | {f"{name}_backward" for name in _ATTENTION_FORWARD}
#: Ops that launch no kernel: views the schema does not mark, allocations, queries.
_NO_KERNEL = frozenset(
    {
        "_unsafe_view",
        "_reshape_alias",
        "lift_fresh",
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "_local_scalar_dense",
        "is_same_size",
        "_has_compatible_shallow_copy_type",
        "set_",
        "resize_",
        "detach",
        "alias",
        "_to_copy_noop",
    }
)
#: Ops that read only the rows they gather from their first argument (a table).
_GATHERS = frozenset(
    {"embedding", "index_select", "gather", "nll_loss_forward", "nll_loss2d_forward"}
)
#: Ops that write a whole gradient but read only one element per row of ``self``.
_SCATTERS = frozenset({"nll_loss_backward", "nll_loss2d_backward"})
#: How backward FLOPs of fused attention relate to forward (Dao 2023, section 3.1).
BACKWARD_ATTENTION_RATIO = 2.5


def dtype_name(dtype: torch.dtype) -> str:
    """``"fp32"``, ``"bf16"``, ``"fp16"`` (others by their torch name).

    Example:
        >>> dtype_name(torch.bfloat16)
        'bf16'
    """
    names = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
    return names.get(dtype, str(dtype).removeprefix("torch."))


def attention_flops(
    batch: int, heads: int, seq_q: int, seq_k: int, head_dim: int, *, causal: bool
) -> float:
    """Forward FLOPs of attention: ``Q·Kᵀ`` and ``P·V``, half of them when causal.

    Example:
        >>> attention_flops(1, 12, 1024, 1024, 64, causal=True) / 1e9  # GPT-2's, per layer
        1.610612736
    """
    full = 4.0 * batch * heads * seq_q * seq_k * head_dim
    return full / 2 if causal else full


def _tensors(value: Any) -> list[torch.Tensor]:
    leaves, _ = tree_flatten(value)
    return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]


def _launches_nothing(func: Any) -> bool:
    name = func.overloadpacket.__name__
    if name in _NO_KERNEL or func.namespace == "prim":
        return True
    returns = func._schema.returns  # noqa: SLF001 - the op schema says what aliases its input
    return bool(returns) and all(
        r.alias_info is not None and not r.alias_info.is_write for r in returns
    )


class OpRecorder(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """A dispatch mode that turns each kernel-launching ATen op into an `Op`.

    Set ``phase`` before each part of the step; ``ops`` collects the rows in order.
    ``hooks`` run after each recorded op (the dequantization of a 4-bit base uses them).
    """

    def __init__(self) -> None:
        """Start empty, in the forward phase."""
        super().__init__()  # type: ignore[no-untyped-call]
        self.phase = Phase.FORWARD
        self.ops: list[Op] = []
        # A language model's own mask (no padding in the batch) is causal or nothing:
        # transformers then calls SDPA with is_causal=True or no mask on CUDA, where it
        # can check the batch has no padding; on fake tensors it builds the mask instead.
        self.own_masks: bool | None = None

    def add(self, op: Op) -> None:
        """Record an op that is not an ATen call (a closed-form kernel)."""
        self.ops.append(op)

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        """Run the op (on the fake tensors below) and record it."""
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not _launches_nothing(func):
            op = self._op(func, args, kwargs, out)
            if op is not None:
                name = func.overloadpacket.__name__
                for moved in hidden_copies(name, args, flash=op.backend == "flash"):
                    copy = Op("contiguous", OpKind.MEMORY, self.phase, 0.0, float(moved), op.dtype)
                    self.ops.append(copy)
                self.ops.append(op)
        return out

    def _op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Op | None:
        name = func.overloadpacket.__name__
        inputs = _tensors((args, kwargs))
        outputs = _tensors(out)
        if not outputs:  # a query (device, size, is_contiguous) or an in-place list op
            return None
        if name in _SCATTERS:  # (grad_output, self, target, ...): self is not read
            inputs = [t for t in inputs if t is not args[1]]
        if name in _GATHERS:
            table, rest = inputs[0], inputs[1:]
            moved = min(read_bytes(table), sum(read_bytes(t) for t in outputs))
            moved += sum(read_bytes(t) for t in rest) + sum(t.nbytes for t in outputs)
        else:
            seen: set[int] = set()
            moved = 0
            for t in inputs:
                if id(t) not in seen:
                    seen.add(id(t))
                    moved += read_bytes(t)
            moved += sum(t.numel() * t.element_size() for t in outputs)
        first = (inputs or outputs)[0]
        dtype = dtype_name(first.dtype)
        if name in _MATMULS:
            return self._matmul(name, args, float(moved), dtype)
        if name in _CONVS:
            return self._conv(
                func, name=name, args=args, kwargs=kwargs, out=out, moved=float(moved)
            )
        if name in _ATTENTION:
            return self._attention(name, args, kwargs, float(moved))
        moved += second_pass_bytes(name, args)
        return Op(name, OpKind.MEMORY, self.phase, 0.0, float(moved), dtype)

    def _matmul(self, name: str, args: tuple[Any, ...], moved: float, dtype: str) -> Op:
        a, b = (args[1], args[2]) if name in {"addmm", "baddbmm"} else (args[0], args[1])
        batch = a.shape[0] if a.dim() == 3 else 1
        m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
        flops = 2.0 * batch * m * n * k
        # the operands the main loop loads through TMA; the output is stored without it
        backend = "" if tma_aligned(a, b) else "unaligned"
        return Op(name, OpKind.MATMUL, self.phase, flops, moved, dtype, (batch, m, n, k), backend)

    def _conv(
        self,
        func: Any,
        *,
        name: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        out: Any,
        moved: float,
    ) -> Op:
        if name == "convolution":
            x, weight, result, groups = args[0], args[1], out, args[8]
        else:  # convolution_backward(grad_output, input, weight, ..., groups, output_mask)
            result, x, weight, groups = args[0], args[1], args[2], args[9]
        m = result.shape[0] * math.prod(result.shape[2:])
        n = weight.shape[0] // groups
        k = (x.shape[1] // groups) * math.prod(weight.shape[2:])
        if name == "convolution":
            flops = float(flop_registry[func.overloadpacket](*args, **kwargs, out_val=out))
        else:
            # each gradient asked for (input, weight) is one forward's implicit GEMM;
            # torch.utils.flop_counter's conv_backward_flop counts the weight gradient of a
            # grouped convolution as if ungrouped (``groups`` times too many FLOPs)
            mask = args[10]
            flops = 2.0 * groups * m * n * k * (int(bool(mask[0])) + int(bool(mask[1])))
        dtype = dtype_name(weight.dtype)
        transposed = nchw_bytes(x, result, groups=groups, backward=name != "convolution")
        shape = (groups, m, n, k, transposed)
        return Op(name, OpKind.CONV, self.phase, flops, moved, dtype, shape)

    def _attention(
        self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], moved: float
    ) -> Op:
        backward = name.endswith("_backward")
        query, key = (args[1], args[2]) if backward else (args[0], args[1])
        causal = _causal(name, args, kwargs)
        batch, heads, seq_q, head_dim = query.shape
        seq_k = key.shape[-2]
        masks = (_argument(name, a, args, kwargs) for a in ("attn_mask", "attn_bias"))
        masked = any(mask is not None for mask in masks)
        if self.own_masks is not None and masked:
            masked = False
            causal = self.own_masks and seq_q == seq_k
        flops = attention_flops(batch, heads, seq_q, seq_k, head_dim, causal=causal)
        if backward:
            flops *= BACKWARD_ATTENTION_RATIO
        dtype = dtype_name(query.dtype)
        # CUDA's SDPA picks FlashAttention-2 for 16-bit inputs without a mask, else the
        # memory-efficient kernel (sdp_utils.cpp's priority order; fp32 is not flash's)
        backend = "flash" if dtype in {"bf16", "fp16"} and not masked else "efficient"
        dropout = int(attention_dropout(name, args, kwargs) > 0)
        shape = (batch, heads, seq_q, seq_k, head_dim, int(causal), dropout)
        return Op(name, OpKind.ATTENTION, self.phase, flops, moved, dtype, shape, backend)


def nchw_bytes(x: torch.Tensor, result: torch.Tensor, *, groups: int, backward: bool) -> int:
    """Activation bytes cuDNN transposes to NHWC and back around a tensor-core convolution.

    Tensor cores convolve NHWC data; given PyTorch's default NCHW (contiguous) layout,
    cuDNN transposes the input to NHWC before the kernel and the output back after it
    (NVIDIA, "Tensor Core AI Performance Milestones", developer.nvidia.com/blog, 2019,
    its NCHW/NHWC figure; PyTorch's "Channels Last Memory Format" tutorial). Forward
    moves the input and output; backward the output gradient, the input (for the weight
    gradient) and the input gradient. Grouped (depthwise) convolutions, channels-last
    tensors and non-2-D convolutions transpose nothing.

    Example:
        >>> x, out = torch.empty(8, 64, 56, 56), torch.empty(8, 64, 56, 56)
        >>> nchw_bytes(x, out, groups=1, backward=False) / 1e6  # MB
        12.845056
        >>> nchw_bytes(x.to(memory_format=torch.channels_last), out, groups=1, backward=False)
        0
    """
    if groups != 1 or x.dim() != 4 or x.is_contiguous(memory_format=torch.channels_last):
        return 0
    if not x.is_contiguous():
        return 0
    size = x.numel() * x.element_size()
    out = result.numel() * result.element_size()
    return 2 * size + out if backward else size + out


def _argument(name: str, argument: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> object:
    """``argument`` of a call of the ATen op ``name``, by its schema's position; None if absent."""
    if argument in kwargs:
        return kwargs[argument]
    index = _argument_index(name, argument)
    return args[index] if index is not None and len(args) > index else None


@functools.cache
def _argument_index(name: str, argument: str) -> int | None:
    """Where ``argument`` sits in the ATen op ``name``'s schema (``native_functions.yaml``)."""
    op = getattr(torch.ops.aten, name, None)
    if op is None or not hasattr(op, "default"):
        return None
    names = [a.name for a in op.default._schema.arguments]  # noqa: SLF001
    return names.index(argument) if argument in names else None


def _causal(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """The ``is_causal`` flag of a fused attention op, wherever its schema puts it."""
    return _argument(name, "is_causal", args, kwargs) is True


def attention_dropout(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> float:
    """The ``dropout_p`` a fused attention op applies inside its kernel (0.0 if none).

    Example:
        >>> attention_dropout("_scaled_dot_product_flash_attention_for_cpu", (0, 0, 0, 0.1), {})
        0.1
        >>> attention_dropout("_scaled_dot_product_cudnn_attention", (), {})
        0.0
    """
    dropout = _argument(name, "dropout_p", args, kwargs)
    return float(dropout) if isinstance(dropout, int | float) else 0.0
