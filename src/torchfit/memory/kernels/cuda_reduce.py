"""Which ops stage partial sums on CUDA, and the `Reduction` each one runs.

A fake-tensor trace sees a ``sum``'s output, not the staging buffer CUDA's reduction
kernel allocates when it splits each output's inputs over several thread blocks (the
buffer's size: `torchfit._core.reduction`). In a training step that is every bias
gradient (``grad.sum(0)`` over batch x sequence rows) and every weight gradient of a norm
written as ``weight * x`` (Llama's RMSNorm: a sum over all but the last dimension): on an
H200 (132 SMs) the bias gradient of a 3072-wide Linear over 12,608 rows stages 132 MiB,
as much as one of the step's activations. `CudaRules` sizes each buffer for a reference
card (`REFERENCE_SMS` SMs of `REFERENCE_THREADS` threads) and a trace records its
`Reduction`, so that `torchfit.memory.allocator.to_device` sizes it again for its card.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import torch

from torchfit._core.reduction import (
    REFERENCE_SMS,
    REFERENCE_THREADS,
    Reduction,
    output_vector,
    threads_per_sm,
)
from torchfit.memory.kernels.cuda import fused_attention_backward_bytes
from torchfit.memory.kernels.cudnn import convolution_workspaces

__all__ = [
    "REFERENCE_SMS",
    "REFERENCE_THREADS",
    "CudaRules",
    "Reduction",
    "reduction_of",
    "threads_per_sm",
]

aten = torch.ops.aten

#: The fused attention backwards a CUDA trace runs (`torchfit.memory.kernels.cuda.FusedSdpa`).
_FUSED_BACKWARD = frozenset(
    {
        aten._scaled_dot_product_flash_attention_for_cpu_backward.default,  # noqa: SLF001
        aten._scaled_dot_product_efficient_attention_backward.default,  # noqa: SLF001
    }
)

#: Reductions that run ``gpu_reduce_kernel`` and whether they take a ``dim`` argument.
_REDUCTIONS = {
    aten.sum.dim_IntList: True,
    aten.sum.default: False,
    aten.mean.dim: True,
    aten.mean.default: False,
}


def _dims(value: Any, ndim: int) -> set[int]:
    if value is None or (isinstance(value, Sequence) and len(value) == 0):
        return set(range(ndim))
    items = value if isinstance(value, Sequence) else [value]
    return {int(d) % ndim for d in items}


def reduction_of(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Reduction | None:
    """The `Reduction` of a ``sum``/``mean`` call, or None (another op, or nothing to sum).

    TensorIterator puts the summed dimensions first and the kept ones after, each group
    by increasing stride, and merges neighbours that are contiguous; the kernel then
    sees one fastest summed and one fastest kept dimension.

    Example:
        >>> grad = torch.empty(64, 197, 768, device="meta")
        >>> found = reduction_of(torch.ops.aten.sum.dim_IntList, (grad, [0, 1]), {})
        >>> found.outputs, found.inputs_per_output, found.along_fastest, found.vector
        (768, 12608, False, 4)
    """
    has_dims = _REDUCTIONS.get(func)
    if has_dims is None or not args or not isinstance(args[0], torch.Tensor):
        return None
    x = args[0]
    if not (x.is_floating_point() and x.ndim and x.numel()):
        return None
    given = (args[1] if len(args) > 1 else kwargs.get("dim")) if has_dims else None
    summed = _dims(given, x.ndim)
    keep = [
        (size, stride)
        for d, (size, stride) in enumerate(zip(x.shape, x.stride(), strict=True))
        if size > 1 and d not in summed
    ]
    gone = [
        (size, stride)
        for d, (size, stride) in enumerate(zip(x.shape, x.stride(), strict=True))
        if size > 1 and d in summed
    ]
    if not gone:
        return None
    outputs = math.prod(size for size, _ in keep)
    inputs = math.prod(size for size, _ in gone)
    fastest_gone = min(stride for _, stride in gone)
    fastest_kept = min((stride for _, stride in keep), default=None)
    along_fastest = fastest_kept is None or fastest_gone < fastest_kept
    vector = 1
    if not along_fastest and fastest_kept == 1:
        innermost = min(keep, key=lambda item: item[1])[0]
        others = [stride for _, stride in gone] + [s for _, s in keep if s != 1]
        vector = output_vector(innermost, *others)
    accumulator = 8 if x.element_size() == 8 else 4
    return Reduction(outputs, inputs, along_fastest, vector, accumulator)


@dataclasses.dataclass(frozen=True)
class CudaRules:
    """The CUDA target's kernel scratch: reduction staging, attention backward, cuDNN.

    The staging buffers are sized for one card; the fused attention backward's fp32
    accumulators (`fused_attention_backward_bytes`) and cuDNN's convolution workspaces
    (`torchfit.memory.kernels.cudnn`) do not depend on it. Called as the
    CPU rules are (``rules(func, args, kwargs, out)`` -> bytes); `scratch` gives the
    geometry behind a staging buffer too, so a trace can size it again for another card.

    Example:
        >>> grad = torch.empty(12608, 3072, device="meta")
        >>> CudaRules()(torch.ops.aten.sum.dim_IntList, (grad, [0], True), {}, None) // 2**20
        132
    """

    sm_count: int = REFERENCE_SMS
    threads: int = REFERENCE_THREADS

    def __call__(
        self,
        func: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        out: Any,
    ) -> int:
        """Scratch bytes of one op call on this card (0 when it stages nothing)."""
        workspaces = self.workspaces(func, args, out)
        return max(workspaces) if workspaces else self.scratch(func, args, kwargs)[0]

    def workspaces(self, func: Any, args: tuple[Any, ...], out: Any) -> tuple[int, ...]:
        """The library workspaces of one op call, in order (cuDNN's convolutions).

        Each is freed before the next; `torchfit.memory.kernels.cudnn` gives the rules.
        """
        return convolution_workspaces(func, args, out)

    def scratch(
        self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[int, Reduction | None]:
        """Scratch bytes of one op call on this card, and the `Reduction` behind them.

        The `Reduction` (None for scratch that does not depend on the card) is what a
        trace keeps to size the buffer again for another card.
        """
        if func in _FUSED_BACKWARD:  # the fused attention's backward, as the trace runs it
            return fused_attention_backward_bytes(args), None
        found = reduction_of(func, args, kwargs)
        if found is None:
            return 0, None
        return found.staging_bytes(self.sm_count, self.threads), found
