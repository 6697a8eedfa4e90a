"""How exact the CPU kernel rules are, per kind of CPU and torch version: one table.

The rules in this package were measured, call by call, against the real allocations of
torch 2.13.0+cpu (oneDNN v3.12), 2 threads, on three kinds of CPU (`CpuKind`):

* ``AVX512_AMX`` (Xeon with AMX-BF16): every float32 and autocast-bf16 step of the test
  zoo exact; the trace holds to 1%.
* ``AVX512`` (AMD EPYC with AVX-512, no AMX): float32 as on AMX; under CPU autocast
  oneDNN's ``avx512_core_bf16`` GEMM scratch is not modelled (worst measured -4.0%).
* ``AVX2`` (measured on that EPYC with ``ONEDNN_MAX_CPU_ISA=AVX2`` and
  ``ATEN_CPU_CAPABILITY=avx2``; ``ONEDNN_VERBOSE`` shows ``jit:avx2``, ``jit_1x1:avx2``,
  ``jit_dw:avx2`` and ``brgconv_strided:avx2``): dense NCHW convolutions (the strided
  1x1 ones with ``jit_1x1:avx2``'s reduce-to-unit-stride copy, `onednn_1x1`), NCHW
  depthwise ones and channels-last depthwise ones with ``kw > 3`` are modelled; a bias
  on ``jit_1x1:avx2`` backward-weights, grouped and the other channels-last AVX2
  kernels keep the reorders-only rule. The CNN zoo's traces are exact; a small ConvNeXt
  ([16, 32, 64] at 32 px) is -6.0%: its peak is the backward of a 2x2 strided
  downsampling conv on the channels-last tensor its LayerNorm leaves, not modelled.

A kind or torch version not in the table has no measured rules: `accuracy` returns that
kind's bounds (or the loosest) flagged ``measured=False``.
"""

from __future__ import annotations

import dataclasses

import torch

from torchfit.memory.kernels.machine import CpuKind, CpuMachine, this_cpu

__all__ = ["ACCURACY", "KindAccuracy", "accuracy", "rules_key"]


@dataclasses.dataclass(frozen=True)
class KindAccuracy:
    """The measured accuracy of the CPU rules on one kind of CPU and torch version.

    Attributes:
        kind: The kind of CPU (`CpuKind`).
        torch: The torch ``major.minor`` the rules were measured with.
        trace: Bound on the traced total's relative error for float32 steps with dense
            convolutions (steps without convolutions are exact on every kind).
        trace_grouped: The same with grouped, depthwise and channels-last convolutions.
        trace_autocast: The same under CPU autocast to bfloat16 (transformers).
        analytic: Bound on the analytic module estimate's relative error (CNNs).
        worst: The measured worst cases the bounds were set from.
        measured: Whether this kind and torch version were measured at all.
    """

    kind: CpuKind
    torch: str
    trace: float
    trace_grouped: float
    trace_autocast: float
    analytic: float
    worst: str
    measured: bool = True


_TORCH = "2.13"

ACCURACY: dict[tuple[str, CpuKind], KindAccuracy] = {
    (_TORCH, CpuKind.AVX512_AMX): KindAccuracy(
        CpuKind.AVX512_AMX, _TORCH, 0.01, 0.01, 0.01, 0.05, "zoo and random CNNs exact"
    ),
    (_TORCH, CpuKind.AVX512): KindAccuracy(
        CpuKind.AVX512,
        _TORCH,
        0.01,
        0.01,
        0.05,
        0.05,
        "fp32 as on AMX; bf16 autocast -4.0% (GPT-2)",
    ),
    # measured: the zoo's traces (tests/memory/modules/test_peak.py, benchmarks/accuracy.py
    # CNNs) exact, analytic worst -3.3% (-5.4% and trace -2.5% before the strided 1x1
    # copy of a bottleneck ResNet's shortcut was modelled); a ConvNeXt [16, 32, 64] at
    # 32 px -6.0% trace and analytic (peak in a channels-last 2x2 strided conv's backward,
    # an AVX2 kernel still on the reorders-only rule); random dense CNNs
    # (seeds 0-29) exact; random grouped/depthwise/channels-last CNNs (seeds 0-29 and
    # the property tests' seeds, measured before the 1x1 and NCHW depthwise rules)
    # -57.2% (seed 10000) .. +24.3%
    (_TORCH, CpuKind.AVX2): KindAccuracy(
        CpuKind.AVX2,
        _TORCH,
        0.07,
        0.60,
        0.05,
        0.07,
        "zoo exact (analytic -3.3%) but ConvNeXt [16,32,64] 32px -6.0%; grouped -57.2%..+24.3%",
    ),
}

_UNMEASURED = KindAccuracy(
    CpuKind.OTHER, "", 0.6, 0.6, 0.05, 0.6, "no rules measured", measured=False
)


def rules_key(machine: CpuMachine | None = None) -> tuple[str, CpuKind]:
    """The key the rules are measured under: (torch ``major.minor``, kind of CPU).

    Example:
        >>> rules_key(CpuMachine(threads=2, block=8))[1]
        <CpuKind.AVX2: 'avx2'>
    """
    version = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    return version, (machine or this_cpu()).kind


def accuracy(machine: CpuMachine | None = None) -> KindAccuracy:
    """The measured accuracy of the CPU rules on ``machine`` (default: this CPU).

    Example:
        >>> accuracy(CpuMachine(threads=2, block=16, amx=True)).trace
        0.01
    """
    version, kind = rules_key(machine)
    found = ACCURACY.get((version, kind))
    if found is not None:
        return found
    same_kind = next((a for (_, k), a in ACCURACY.items() if k is kind), None)
    if same_kind is None:
        return dataclasses.replace(_UNMEASURED, kind=kind, torch=version)
    return dataclasses.replace(same_kind, torch=version, measured=False)
