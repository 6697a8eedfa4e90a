"""Kernel scratch that a dispatch-level tracker cannot see: one small rule per CPU op.

A fake-tensor trace sees the outputs of every ATen op, not the buffers a CPU kernel
allocates inside itself (oneDNN reorders, per-thread partial sums, ``.contiguous()``
copies of its inputs). Each rule returns the bytes by which the op's real peak exceeds
its outputs: the tracker counts them as a transient allocation, alive together with the
outputs, freed when the op returns. The analytic module estimate asks the same rules,
with the same arguments, for the calls each layer makes (`torchfit.memory.kernels.calls`).

Every rule was found by measuring: a real step ran under ``torch.profiler`` with each
ATen op wrapped in a ``record_function``, and the allocator events inside each op were
compared with the op's outputs (torch 2.13.0+cpu, oneDNN with AVX-512, with AMX, and
capped to AVX2, 2 threads; `accuracy` states how exact each kind is). The
measured figures are quoted at the rules (`conv`, `norms`, `attention`, `embedding`,
`matmul`); the thread count, the oneDNN channel block and the ISA flags are read from
torch when the rules are built (`torchfit.memory.kernels.machine`), so the rules follow
the machine the step will run on.

CUDA kernels keep most of their scratch elsewhere (cuBLAS/cuDNN workspaces that persist
across steps); the CUDA target's per-op rules (the staging buffer of a reduction split
over thread blocks, the fused attention backward's accumulators) are
`torchfit.memory.kernels.cuda_reduce.CudaRules`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch

from torchfit.memory.kernels import attention, conv, embedding, matmul, norms
from torchfit.memory.kernels.cuda_reduce import CudaRules
from torchfit.memory.kernels.machine import CpuMachine, cpu_block, this_cpu

__all__ = ["CpuRules", "cpu_block", "has_rule", "workspace_rules"]

aten = torch.ops.aten

Rule = Callable[[CpuMachine, tuple[Any, ...], dict[str, Any], Any], int]

_RULES: dict[Any, Rule] = {
    aten.convolution.default: conv.conv_forward,
    aten.convolution_backward.default: conv.conv_backward,
    aten.native_layer_norm_backward.default: norms.layer_norm_backward,
    aten.native_group_norm_backward.default: norms.group_norm_backward,
    aten.native_batch_norm.default: norms.batch_norm,
    aten.native_batch_norm_backward.default: norms.batch_norm_backward,
    aten.embedding.default: embedding.embedding,
    aten.embedding_dense_backward.default: embedding.embedding_backward,
    aten._scaled_dot_product_flash_attention_for_cpu.default: attention.flash_forward,  # noqa: SLF001
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default: attention.flash_backward,  # noqa: SLF001
    aten._safe_softmax.default: attention.safe_softmax,  # noqa: SLF001
    aten.mm.default: matmul.mm,
    aten.bmm.default: matmul.matmul_rule(0),
    aten.addmm.default: matmul.matmul_rule(1),
    aten.baddbmm.default: matmul.matmul_rule(1),
}


@dataclasses.dataclass(frozen=True)
class CpuRules(CpuMachine):
    """The CPU workspace rules for one machine: call it as ``rules(func, args, kwargs, out)``.

    Example:
        >>> rules = CpuRules(threads=2, block=16)
        >>> x = torch.empty(4, 3136, device="meta")
        >>> mean = torch.empty(4, 1, device="meta")
        >>> w = torch.empty(3136, device="meta")
        >>> args = (x, x, [3136], mean, mean, w, w, [True, True, True])
        >>> rules(torch.ops.aten.native_layer_norm_backward.default, args, {}, None)
        50176
    """

    def __call__(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
        """Scratch bytes of one op call (0 when no rule applies)."""
        rule = _RULES.get(func)
        return 0 if rule is None else max(0, rule(self, args, kwargs, out))


def has_rule(func: Any) -> bool:
    """Whether some device's rules give ``func`` scratch (the calls worth recording).

    Example:
        >>> has_rule(torch.ops.aten.convolution.default), has_rule(torch.ops.aten.relu.default)
        (True, False)
    """
    return func in _RULES


@functools.cache
def _cpu_rules(machine: CpuMachine) -> CpuRules:
    return CpuRules(**dataclasses.asdict(machine))


def workspace_rules(device: str) -> CpuRules | CudaRules | None:
    """The per-op scratch rules for a target device (``None``: none apply).

    CUDA's are sized for `CudaRules`' reference card; a trace sizes them again for the
    card its estimate is placed on.

    Example:
        >>> workspace_rules("cpu").threads >= 1, workspace_rules("cuda").sm_count
        (True, 132)
    """
    if device == "cpu":
        return _cpu_rules(this_cpu())
    if device == "cuda":
        return CudaRules()
    return None
