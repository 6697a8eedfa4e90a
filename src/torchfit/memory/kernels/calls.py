"""The ATen calls a model makes, recorded on data-free tensors for the kernel-scratch rules.

The tracer asks the rules op by op while it runs a step on fake tensors. The analytic
module estimate runs the model's forward and backward once on data-free tensors instead
(fake CPU tensors for a CPU target), and `CallRecorder` keeps each call that has a rule
(`has_rule`), with the name of the layer that made it; `scratch_of` then asks the rules
of the target device for those calls, with the very arguments the tracer would pass
(shapes, strides, dtypes, groups, masks).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

from torchfit.memory.kernels.cpu import has_rule, workspace_rules
from torchfit.memory.kernels.layout import cpu_layout

__all__ = ["CallRecorder", "KernelCall", "scratch_of"]


@dataclasses.dataclass(frozen=True)
class KernelCall:
    """One ATen call as a rule sees it: the op, its arguments and its outputs.

    Attributes:
        func: The ATen overload (``torch.ops.aten.convolution_backward.default``).
        args: Positional arguments (fake or meta tensors where the call took tensors).
        kwargs: Keyword arguments.
        out: What the call returned.
    """

    func: Any
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    out: Any


def scratch_of(calls: Iterable[KernelCall], device: str) -> int:
    """The largest scratch of ``calls`` under the rules for ``device`` (0 without rules).

    The calls of one layer run one after another, each freeing its scratch on return,
    so the layer's scratch peak is the largest one.

    Example:
        >>> import torch
        >>> x = torch.empty(8, 24, device="meta")
        >>> call = KernelCall(torch.ops.aten.native_batch_norm.default, (x,), {}, None)
        >>> scratch_of([call], "cpu"), scratch_of([call], "cuda")
        (384, 0)
    """
    rules = workspace_rules(device)
    if rules is None:
        return 0
    return max((rules(c.func, c.args, dict(c.kwargs), c.out) for c in calls), default=0)


class CallRecorder(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Keeps every call that has a kernel-scratch rule, under the label ``where()`` gives.

    Outputs take the layout the CPU kernel gives them (`cpu_layout`), so that the calls
    after them see the strides a real CPU step has.

    Example:
        >>> import torch
        >>> recorder = CallRecorder(lambda: "conv")
        >>> x, w = torch.empty(2, 3, 8, 8, device="meta"), torch.empty(4, 3, 3, 3, device="meta")
        >>> with recorder:
        ...     _ = torch.nn.functional.relu(torch.nn.functional.conv2d(x, w))
        >>> [str(call.func) for call in recorder.calls["conv"]]
        ['aten.convolution.default']
    """

    def __init__(self, where: Callable[[], str]) -> None:
        """Record under the label ``where()`` returns when each call runs."""
        super().__init__()  # type: ignore[no-untyped-call]
        self.where = where
        self.calls: dict[str, list[KernelCall]] = {}

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        """Run ``func``; keep the call when a rule may give it scratch."""
        kwargs = kwargs or {}
        out = cpu_layout(func, args, func(*args, **kwargs))
        if has_rule(func):
            call = KernelCall(func, tuple(args), dict(kwargs), out)
            self.calls.setdefault(self.where(), []).append(call)
        return out
