"""Running one ATen op for the tracer: decompositions, and ops that cannot be faked."""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    UnsupportedOperatorException,
)
from torch.utils._pytree import tree_leaves

from torchfit.memory.kernels.layout import cpu_layout

__all__ = [
    "UntraceableOpError",
    "is_composite",
    "match_cpu_layout",
    "refuse_real_tensors",
    "run_op",
]


class UntraceableOpError(RuntimeError):
    """Raised inside the tracker when an op cannot run on fake tensors (internal)."""

    def __init__(self, op: str, reason: str, *, custom: bool = False) -> None:
        """Keep the op name and why it failed."""
        super().__init__(untraceable_message(op, reason, custom=custom))
        self.op = op


def untraceable_message(op: str, reason: str, *, custom: bool = False) -> str:
    """The user-facing message for an op that fake tensors cannot run."""
    fix = (
        "give the op a fake implementation (torch.library.register_fake), or use"
        if custom
        else "remove the op from the traced code (guard a data-dependent check with a flag), or use"
    )
    return (
        f"cannot trace the step: {op} {reason}, so the memory it needs is unknown without "
        f"real data. To fix, {fix} the analytic estimator instead: "
        "torchfit.memory.estimate(model, batch_size=..., ...)"
    )


@functools.cache
def _mutates(func: Any) -> bool:
    """Whether the op writes to one of its arguments (in-place and ``out=`` variants)."""
    return any(
        argument.alias_info is not None and argument.alias_info.is_write
        for argument in func._schema.arguments  # noqa: SLF001 - the op's own schema
    )


def refuse_real_tensors(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Stop before an op writes to a real tensor the fake copy could not reach.

    Such a tensor is a global or a closure variable of the user's code. FakeTensorMode
    runs ops whose tensor arguments are all real for real (constant propagation), so
    without this check ``G.add_(1)`` under ``FakeTensorMode()`` increments the user's
    ``G`` (torch 2.13). Ops that only read real tensors are left to FakeTensorMode, which
    refuses a mix of real and fake tensors (see `run_op`).
    """
    if not _mutates(func):
        return
    for leaf in tree_leaves((args, kwargs)):
        if isinstance(leaf, torch.Tensor) and not isinstance(leaf, FakeTensor):
            raise _real_tensor_error(func)


def _real_tensor_error(func: Any) -> RuntimeError:
    return RuntimeError(
        f"cannot trace the step: {func} uses a real tensor that is not reachable from the "
        "model, optimizer or inputs (a global or closure variable), and tracing must not "
        "touch it; pass it as an input or register it as a module buffer"
    )


def run_op(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run one op on fake tensors; an op that needs real data raises UntraceableOpError."""
    try:
        return func(*args, **kwargs)
    except DynamicOutputShapeException as e:
        raise UntraceableOpError(str(func), "has an output shape that depends on data") from e
    except DataDependentOutputException as e:
        raise UntraceableOpError(
            str(func), "reads tensor values (e.g. .item() or Python control flow on a tensor)"
        ) from e
    except UnsupportedOperatorException as e:
        raise UntraceableOpError(
            str(func), "has no fake-tensor (meta) implementation", custom=True
        ) from e
    except AssertionError as e:
        if "convert all Tensors to FakeTensors" in str(e):
            raise _real_tensor_error(func) from e
        raise


def match_cpu_layout(func: Any, args: tuple[Any, ...], out: Any) -> Any:
    """Give a fake op's output the memory layout the CPU kernel gives it, where they differ.

    The rule is `torchfit.memory.kernels.layout.cpu_layout`, shared with the analytic
    estimate's pass on data-free tensors. The replacement happens before the output is counted,
    so only one storage is.
    """
    return cpu_layout(func, args, out)


@functools.cache
def is_composite(func: Any) -> bool:
    """True for ops whose CPU kernel is their CompositeImplicitAutograd decomposition."""
    name = func.name()
    keys = torch._C.DispatchKey  # noqa: SLF001 - no public alias exists
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key  # noqa: SLF001
    return bool(has_kernel(name, keys.CompositeImplicitAutograd)) and not has_kernel(name, keys.CPU)
