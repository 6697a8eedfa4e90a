"""CUDA's autocast op lists, applied to a trace that runs on CPU tensors.

A trace runs on fake CPU tensors, so ``torch.autocast`` uses the CPU's op lists, which
differ from CUDA's: CUDA runs softmax, log_softmax, layer_norm, group_norm, exp, log, pow,
rsqrt, sum, cumsum and the losses in fp32, and has no CPU-style fp32 rules for pooling or
padding. The dtype of what autograd saves follows the lists, so a CUDA-target trace must
use CUDA's. `cuda_autocast_on_cpu` registers, for the duration of the trace, a kernel at
the ``AutocastCPU`` dispatch key for every op whose policy differs: casts happen above
autograd exactly as real autocast does (the cast is in the graph; the cast copy is what
the op saves), also in gradient checkpointing's recomputation.

The lists are PyTorch's, ``aten/src/ATen/autocast_mode.h`` (``AT_FORALL_LOWER_PRECISION_FP``,
``AT_FORALL_FP32``, ``AT_FORALL_FP32_SET_OPT_DTYPE``, ``AT_FORALL_PROMOTE``) and
``aten/src/ATen/autocast_mode.cpp`` (the ``AutocastCPU`` registrations), for torch 2.x.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

__all__ = [
    "CPU_ONLY",
    "CUDA_FP32",
    "CUDA_FP32_SET_OPT_DTYPE",
    "CUDA_LOWER_PRECISION",
    "CUDA_PROMOTE",
    "cuda_autocast_on_cpu",
    "cuda_autocast_runs_on_cpu",
]

#: CUDA runs these in the autocast dtype (``AT_FORALL_LOWER_PRECISION_FP`` and the
#: cuDNN convolutions). Those CPU also lowers keep CPU's kernel.
CUDA_LOWER_PRECISION = (
    "addmv",
    "addr",
    "einsum",
    "mv",
    "chain_matmul",
    "linalg_multi_dot",
    "lstm_cell",
    "gru_cell",
    "rnn_tanh_cell",
    "rnn_relu_cell",
    "_scaled_dot_product_flash_attention",
    "convolution",
    "_convolution",
)

#: CUDA runs these in fp32 (``AT_FORALL_FP32``).
CUDA_FP32 = (
    "acos",
    "asin",
    "cosh",
    "erfinv",
    "exp",
    "expm1",
    "log",
    "log10",
    "log2",
    "log1p",
    "reciprocal",
    "rsqrt",
    "sinh",
    "tan",
    "pow.Tensor_Scalar",
    "pow.Tensor_Tensor",
    "pow.Scalar",
    "softplus",
    "layer_norm",
    "native_layer_norm",
    "group_norm",
    "frobenius_norm.dim",
    "nuclear_norm",
    "nuclear_norm.dim",
    "cosine_similarity",
    "poisson_nll_loss",
    "cosine_embedding_loss",
    "nll_loss",
    "nll_loss2d",
    "hinge_embedding_loss",
    "kl_div",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "mse_loss",
    "margin_ranking_loss",
    "multilabel_margin_loss",
    "soft_margin_loss",
    "triplet_margin_loss",
    "multi_margin_loss",
    "binary_cross_entropy_with_logits",
    "dist",
    "pdist",
    "cdist",
    "renorm",
    "logsumexp",
)

#: CUDA computes these in fp32 by passing ``dtype=torch.float32`` when none is given
#: (``AT_FORALL_FP32_SET_OPT_DTYPE``): their output is fp32.
CUDA_FP32_SET_OPT_DTYPE = (
    "prod",
    "prod.dim_int",
    "softmax.int",
    "log_softmax.int",
    "cumprod",
    "cumsum",
    "linalg_vector_norm",
    "linalg_matrix_norm",
    "sum",
    "sum.dim_IntList",
)

#: CUDA casts these to the widest floating input (``AT_FORALL_PROMOTE``).
CUDA_PROMOTE = (
    "addcdiv",
    "addcmul",
    "atan2",
    "bilinear",
    "cross",
    "dot",
    "index_put",
    "tensordot",
    "scatter_add",
)

#: CPU autocast rules that CUDA does not have (``AutocastCPU`` in autocast_mode.cpp):
#: under the emulation these run as they come, without a cast.
CPU_ONLY = (
    "avg_pool3d",
    "max_pool3d",
    "max_unpool2d",
    "max_unpool3d",
    "adaptive_avg_pool3d",
    "adaptive_max_pool3d",
    "fractional_max_pool2d",
    "fractional_max_pool3d",
    "reflection_pad1d",
    "reflection_pad2d",
    "replication_pad1d",
    "replication_pad2d",
    "replication_pad3d",
    "grid_sampler_2d",
    "grid_sampler_3d",
    "stft",
    "polar",
    "quantile",
    "nanquantile",
    "trace",
    "view_as_complex",
    "stack",
    "cat",
    "index_copy",
    "mkldnn_rnn_layer",
    "_native_multi_head_attention",
)

#: Composite ops CPU autocast casts as a whole but CUDA's autocast does not: on CUDA they
#: decompose and the ops inside are autocast one by one. cross_entropy_loss runs
#: log_softmax in the input's own dtype (aten/src/ATen/native/LossNLL.cpp) and only
#: nll_loss casts to fp32: under fp16 autocast an fp16 log-softmax and an fp32 copy of it
#: are kept, where a cast of the whole op would keep two fp32 tensors.
CUDA_DECOMPOSED = ("cross_entropy_loss",)

_LOW = frozenset({torch.float16, torch.bfloat16})


def _op(name: str) -> Any:
    base, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, base), overload or "default")


def _map_tensors(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, list | tuple):
        return type(value)(_map_tensors(v, fn) for v in value)
    return value


def _floating(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() else []
    if isinstance(value, list | tuple):
        return [t for v in value for t in _floating(v)]
    return []


def _cast_to(dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    def cast(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype) if t.is_floating_point() and t.dtype != torch.float64 else t

    return cast


_CPU_AUTOCAST = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)  # noqa: SLF001


Arguments = tuple[tuple[Any, ...], dict[str, Any]]


def _cast_all(args: tuple[Any, ...], kwargs: dict[str, Any], dtype: torch.dtype) -> Arguments:
    cast = _cast_to(dtype)
    return _map_tensors(args, cast), {k: _map_tensors(v, cast) for k, v in kwargs.items()}


def _lower(_names: list[str], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Arguments:
    return _cast_all(args, kwargs, torch.get_autocast_dtype("cpu"))


def _fp32(_names: list[str], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Arguments:
    return _cast_all(args, kwargs, torch.float32)


def _set_opt_dtype(names: list[str], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Arguments:
    first = next(iter(_floating(args)), None)
    if first is None or first.dtype == torch.float64:
        return args, kwargs
    where = names.index("dtype")
    if where < len(args):
        if args[where] is None:
            args = (*args[:where], torch.float32, *args[where + 1 :])
        return args, kwargs
    if kwargs.get("dtype") is None:
        kwargs = {**kwargs, "dtype": torch.float32}
    return args, kwargs


def _promote(_names: list[str], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Arguments:
    found = _floating((args, tuple(kwargs.values())))
    if not found:
        return args, kwargs
    widest = max((t.dtype for t in found), key=lambda d: torch.finfo(d).bits)
    return _cast_all(args, kwargs, widest)


def _as_is(_names: list[str], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Arguments:
    return args, kwargs


_POLICIES: dict[str, Callable[[list[str], tuple[Any, ...], dict[str, Any]], Arguments]] = {
    "lower": _lower,
    "fp32": _fp32,
    "set_opt_dtype": _set_opt_dtype,
    "promote": _promote,
    "none": _as_is,
}


#: On CUDA, softmax and log_softmax of a float16 input asked for a float32 result (what
#: autocast's ``set_opt_dtype`` asks) run one fused kernel, ``_softmax(input, dim,
#: half_to_float=True)``: no float32 copy of the input is made, and the backward returns
#: the input's gradient in float16 (aten/src/ATen/native/SoftMax.cpp, ``softmax`` and
#: ``log_softmax`` with a dtype; bfloat16 is not on that path and is converted first).
_HALF_TO_FLOAT = {
    "softmax.int": torch.ops.aten._softmax.default,  # noqa: SLF001
    "log_softmax.int": torch.ops.aten._log_softmax.default,  # noqa: SLF001
}


def _kernel(op: Any, policy: str, name: str = "") -> Callable[..., Any]:
    """A Python ``AutocastCPU`` kernel for ``op`` applying CUDA's ``policy``."""
    names = [argument.name for argument in op._schema.arguments]  # noqa: SLF001
    if policy == "decompose":
        return op.decompose  # type: ignore[no-any-return]
    apply = _POLICIES[policy]
    fused = _HALF_TO_FLOAT.get(name)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        with torch._C._ExcludeDispatchKeyGuard(_CPU_AUTOCAST):  # noqa: SLF001
            if fused is not None and _half_to_float(names, args, kwargs):
                dim = args[1] if len(args) > 1 else kwargs["dim"]
                return fused(args[0], dim, True)  # noqa: FBT003 - half_to_float, positional in ATen
            args, kwargs = apply(names, args, kwargs)
            return op(*args, **kwargs)

    return kernel


def _half_to_float(names: list[str], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """A float16 input and no dtype asked: CUDA's fused half-to-float softmax runs.

    Only on data-free tensors (fake or meta: a trace): the CPU has no such kernel.
    """
    where = names.index("dtype")
    dtype = args[where] if where < len(args) else kwargs.get("dtype")
    first = args[0] if args else None
    return (
        dtype is None
        and isinstance(first, torch.Tensor)
        and first.dtype == torch.float16
        and (first.is_meta or isinstance(first, FakeTensor))
    )


@contextlib.contextmanager
def cuda_autocast_on_cpu() -> Iterator[None]:
    """While active, ``torch.autocast("cpu", ...)`` follows CUDA's op lists.

    Restored on exit. Outside an autocast region nothing changes.

    Example:
        >>> x = torch.randn(4, 8)
        >>> with cuda_autocast_on_cpu(), torch.autocast("cpu", dtype=torch.bfloat16):
        ...     torch.softmax(x.bfloat16(), -1).dtype
        torch.float32
        >>> with torch.autocast("cpu", dtype=torch.bfloat16):
        ...     torch.softmax(x.bfloat16(), -1).dtype
        torch.bfloat16
    """
    library = torch.library.Library("aten", "IMPL")  # type: ignore[no-untyped-call]
    policies = (
        [(name, "lower") for name in CUDA_LOWER_PRECISION]
        + [(name, "fp32") for name in CUDA_FP32]
        + [(name, "set_opt_dtype") for name in CUDA_FP32_SET_OPT_DTYPE]
        + [(name, "promote") for name in CUDA_PROMOTE]
        + [(name, "none") for name in CPU_ONLY]
        + [(name, "decompose") for name in CUDA_DECOMPOSED]
    )
    try:
        with warnings.catch_warnings():
            # Replacing CPU autocast's own kernels warns that a kernel is overridden.
            warnings.simplefilter("ignore")
            for name, policy in policies:
                kernel = _kernel(_op(name), policy, name)
                library.impl(name, kernel, "AutocastCPU")  # type: ignore[no-untyped-call]
        yield
    finally:
        library._destroy()  # type: ignore[no-untyped-call]  # noqa: SLF001 - unregisters all


@contextlib.contextmanager
def cuda_autocast_runs_on_cpu(entered: list[torch.dtype]) -> Iterator[None]:
    """While active, the step's own ``torch.autocast("cuda", ...)`` autocasts the CPU.

    A CUDA-target trace runs on CPU tensors, where ``torch.autocast("cuda")`` (and
    ``torch.cuda.amp.autocast``) does nothing but warn that CUDA is missing: the usual
    AMP loop would be traced in fp32. Here it becomes ``torch.autocast("cpu")`` with the
    same dtype (CUDA's default, float16, when none is given), which `cuda_autocast_on_cpu`
    gives CUDA's op lists. Each dtype entered is appended to ``entered``. Code that asks
    ``torch.is_autocast_enabled()`` (CUDA's, without an argument) is answered for the CPU
    autocast that stands in: PEFT's 4-bit LoRA layer casts its input to the adapter's
    dtype only outside autocast (peft/tuners/lora/bnb.py, ``Linear4bit.forward``).
    Restored on exit.

    Example:
        >>> seen = []
        >>> with cuda_autocast_runs_on_cpu(seen), torch.autocast("cuda"):
        ...     (torch.ones(2, 2) @ torch.ones(2, 2)).dtype, torch.is_autocast_enabled()
        (torch.float16, True)
        >>> seen
        [torch.float16]
    """
    autocast = torch.amp.autocast_mode.autocast
    original = autocast.__init__
    is_enabled = torch.is_autocast_enabled

    def enabled(device_type: str | None = None) -> bool:
        return is_enabled("cpu" if device_type in {None, "cuda"} else device_type)

    def init(
        self: Any,
        device_type: str,
        dtype: torch.dtype | None = None,
        enabled: bool = True,  # noqa: FBT001, FBT002 - torch.autocast's own signature
        cache_enabled: bool | None = None,  # noqa: FBT001
    ) -> None:
        if device_type == "cuda":
            dtype = torch.get_autocast_dtype("cuda") if dtype is None else dtype
            device_type = "cpu"
            if enabled:
                entered.append(dtype)
        original(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    autocast.__init__ = init  # type: ignore[method-assign]
    torch.is_autocast_enabled = enabled
    try:
        yield
    finally:
        autocast.__init__ = original  # type: ignore[method-assign]
        torch.is_autocast_enabled = is_enabled
