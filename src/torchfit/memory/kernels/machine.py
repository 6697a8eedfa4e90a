"""The CPU a step will run on, as torch reports it: threads, oneDNN's channel block, ISA.

Every kernel-scratch rule depends on these facts and on nothing else about the machine:
the thread count sizes per-thread buffers, the channel block pads oneDNN's blocked
layouts, and the instruction set picks oneDNN's reduced-precision kernels. They are read
from torch (``torch.get_num_threads``, ``torch.backends.cpu.get_cpu_capability``,
``torch._C._cpu._get_cpu_capability``) when the rules are built, so an estimate follows
the machine it runs on, never the one the rules were measured on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

__all__ = ["CpuMachine", "cpu_block", "cpu_features", "this_cpu"]


def cpu_block() -> int:
    """The oneDNN channel block on this CPU: 16 with AVX-512, 8 with AVX2, else 1.

    oneDNN's blocked layouts (``nChw16c``/``nChw8c``) pad channels to this block; the
    ``ONEDNN_VERBOSE`` log of a convolution shows ``aBcd16b`` with AVX-512.

    Example:
        >>> cpu_block() in {1, 8, 16}
        True
    """
    capability = torch.backends.cpu.get_cpu_capability()
    if capability.startswith("AVX512"):
        return 16
    if capability == "AVX2":
        return 8
    return 1


def cpu_features() -> Mapping[str, object]:
    """The feature flags torch's cpuinfo reports (``amx_bf16``, ``avx512_bf16``, ...).

    ``torch._C._cpu._get_cpu_capability()`` (torch 2.13) returns them as a dict; an older
    or non-x86 build without it reports none, and every ISA-dependent rule then takes its
    plain AVX-512 / AVX2 branch.
    """
    query = getattr(torch._C._cpu, "_get_cpu_capability", None)  # noqa: SLF001 - cpuinfo's flags
    if query is None:
        return {}
    features = query()
    return features if isinstance(features, Mapping) else {}


@dataclasses.dataclass(frozen=True)
class CpuMachine:
    """The facts about a CPU that the kernel-scratch rules read.

    Attributes:
        threads: Threads the kernels split work over (``torch.get_num_threads()``).
        block: oneDNN's channel block (`cpu_block`).
        amx: AMX tiles with bf16 support (``amx_tile`` and ``amx_bf16``): oneDNN's bf16
            matmuls and convolutions then run its ``*_amx`` brgemm kernels.
        avx512_bf16: AVX512-BF16 dot products (``avx512_bf16``).
        l1: Per-core L1 data cache in bytes (``l1d_cache_size``; 0: unknown).
        l2: Per-core L2 cache in bytes (``l2_cache_size``; 0: unknown); oneDNN's AMX
            blocking heuristics size their buffers by both.
    """

    threads: int
    block: int
    amx: bool = False
    avx512_bf16: bool = False
    l1: int = 0
    l2: int = 0

    def pad(self, channels: int) -> int:
        """Channels rounded up to the oneDNN block.

        Example:
            >>> CpuMachine(threads=2, block=16).pad(24)
            32
        """
        return -(-channels // self.block) * self.block


def this_cpu() -> CpuMachine:
    """`CpuMachine` for this process: its thread count, block and ISA flags."""
    features = cpu_features()
    amx = bool(features.get("amx_tile")) and bool(features.get("amx_bf16"))
    return CpuMachine(
        threads=torch.get_num_threads(),
        block=cpu_block(),
        amx=amx,
        avx512_bf16=bool(features.get("avx512_bf16")),
        l1=_size(features.get("l1d_cache_size")),
        l2=_size(features.get("l2_cache_size")),
    )


def _size(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
