"""The CPU a step will run on, as oneDNN and torch see it: threads, ISA, channel block.

Every kernel-scratch rule depends on these facts and on nothing else about the machine:
the thread count sizes per-thread buffers, the channel block pads oneDNN's blocked
layouts, and the instruction set picks oneDNN's kernels. They are read when the rules
are built, so an estimate follows the machine it runs on, never the one the rules were
measured on.

The instruction set is the one *oneDNN* will dispatch to, which is not always what the
CPU has: oneDNN takes the best ISA the CPU reports (``torch._C._cpu._get_cpu_capability``,
cpuinfo's flags) capped by ``ONEDNN_MAX_CPU_ISA`` (or its older name ``DNNL_MAX_CPU_ISA``),
read once when oneDNN first dispatches (oneDNN's "CPU Dispatcher Control",
https://uxlfoundation.github.io/oneDNN/dev_guide_cpu_dispatcher_control.html).
ATen's own vector kernels follow ``ATEN_CPU_CAPABILITY`` instead
(``torch.backends.cpu.get_cpu_capability``); a process can cap one and not the other,
so both are read.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Mapping

import torch

__all__ = [
    "CpuKind",
    "CpuMachine",
    "cpu_block",
    "cpu_features",
    "onednn_isa",
    "this_cpu",
]

# oneDNN's ISA names (``ONEDNN_MAX_CPU_ISA`` values, ``dnnl::cpu_isa``, oneDNN v3.12) in
# dispatch order, with the cpuinfo flags each needs on top of the previous one.
_ISAS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("SSE41", ("sse4_1",)),
    ("AVX", ("avx",)),
    ("AVX2", ("avx2", "fma3")),
    ("AVX2_VNNI", ("avx_vnni",)),
    ("AVX512_CORE", ("avx512_f", "avx512_bw", "avx512_vl", "avx512_dq")),
    ("AVX512_CORE_VNNI", ("avx512_vnni",)),
    ("AVX512_CORE_BF16", ("avx512_bf16",)),
    ("AVX512_CORE_AMX", ("amx_tile", "amx_bf16", "amx_int8")),
)
# Newer spellings of the same caps (oneDNN v3.3+ names AVX-512 parts AVX10.1/512).
_ALIASES = {
    "AVX10_1_512": "AVX512_CORE_BF16",
    "AVX512_CORE_FP16": "AVX512_CORE_BF16",
    "AVX10_1_512_AMX": "AVX512_CORE_AMX",
    "AVX10_1_512_AMX_FP16": "AVX512_CORE_AMX",
    "AVX512_CORE_AMX_FP16": "AVX512_CORE_AMX",
    "AVX10_2_512": "AVX512_CORE_BF16",
    "AVX10_2_512_AMX_2": "AVX512_CORE_AMX",
    "AVX2_VNNI_2": "AVX2_VNNI",
}
_ORDER = [name for name, _ in _ISAS]


class CpuKind(enum.StrEnum):
    """The kinds of CPU whose oneDNN kernels differ in what they allocate.

    ``AVX2``: 8-channel blocks, ``jit:avx2`` / ``jit_1x1:avx2`` / ``brgconv_strided:avx2``
    convolutions (AMD EPYC before Zen 4, Intel before Skylake-SP). ``AVX512``: 16-channel
    blocks, ``jit:avx512_core`` / ``brgconv*:avx512_core`` kernels (Xeon Skylake-SP on,
    EPYC Zen 4 on). ``AVX512_AMX``: the same plus AMX tiles, which oneDNN's bf16 matmuls
    and convolutions use (Xeon Sapphire Rapids on). ``OTHER``: anything else (no rules
    measured: SSE4.1, AVX, non-x86).
    """

    AVX2 = "avx2"
    AVX512 = "avx512"
    AVX512_AMX = "avx512_amx"
    OTHER = "other"


def cpu_features() -> Mapping[str, object]:
    """The feature flags torch's cpuinfo reports (``amx_bf16``, ``avx512_bf16``, ...).

    ``torch._C._cpu._get_cpu_capability()`` (torch 2.13) returns them as a dict; an older
    or non-x86 build without it reports none, and every ISA-dependent rule then takes its
    plain branch.
    """
    query = getattr(torch._C._cpu, "_get_cpu_capability", None)  # noqa: SLF001 - cpuinfo's flags
    if query is None:
        return {}
    features = query()
    return features if isinstance(features, Mapping) else {}


def _isa_cap(environ: Mapping[str, str]) -> str | None:
    """The ISA named by ``ONEDNN_MAX_CPU_ISA`` (or ``DNNL_MAX_CPU_ISA``), None: no cap."""
    raw = environ.get("ONEDNN_MAX_CPU_ISA") or environ.get("DNNL_MAX_CPU_ISA") or ""
    name = raw.strip().upper()
    name = _ALIASES.get(name, name)
    return name if name in _ORDER else None


def onednn_isa(
    features: Mapping[str, object] | None = None, environ: Mapping[str, str] | None = None
) -> str:
    """The ISA oneDNN dispatches to: the CPU's best, capped by ``ONEDNN_MAX_CPU_ISA``.

    Args:
        features: cpuinfo's flags (default: `cpu_features` of this CPU).
        environ: The environment to read the cap from (default: ``os.environ``).

    Returns:
        One of oneDNN's ISA names (``"AVX2"``, ``"AVX512_CORE_BF16"``, ...), or ``""``
        where the CPU has none of them (a non-x86 CPU).

    Example:
        >>> avx512 = dict.fromkeys(["sse4_1", "avx", "avx2", "fma3", "avx512_f",
        ...     "avx512_bw", "avx512_vl", "avx512_dq"], True)
        >>> onednn_isa(avx512, {}), onednn_isa(avx512, {"ONEDNN_MAX_CPU_ISA": "avx2"})
        ('AVX512_CORE', 'AVX2')
    """
    flags = cpu_features() if features is None else features
    env = os.environ if environ is None else environ
    best = ""
    for name, needs in _ISAS:
        if not all(flags.get(flag) for flag in needs):
            if name == "AVX2_VNNI":  # a side branch: AVX-512 does not need it
                continue
            break
        best = name
    cap = _isa_cap(env)
    if best and cap is not None and _ORDER.index(cap) < _ORDER.index(best):
        return cap
    return best


def _block_of(isa: str) -> int:
    """The oneDNN channel block for an ISA: 16 from AVX-512 on, 8 for AVX2 (and AVX)."""
    if not isa:
        return 1
    return 16 if _ORDER.index(isa) >= _ORDER.index("AVX512_CORE") else 8


def cpu_block() -> int:
    """The oneDNN channel block on this CPU: 16 with AVX-512, 8 with AVX2, else 1.

    oneDNN's blocked layouts (``nChw16c``/``nChw8c``) pad channels to this block; the
    ``ONEDNN_VERBOSE`` log of a convolution shows ``aBcd16b`` with AVX-512, ``aBcd8b``
    with AVX2 (also under ``ONEDNN_MAX_CPU_ISA=AVX2`` on an AVX-512 CPU).

    Example:
        >>> cpu_block() in {1, 8, 16}
        True
    """
    isa = onednn_isa()
    if isa and _ORDER.index(isa) < _ORDER.index("AVX2"):
        return 1
    return _block_of(isa)


@dataclasses.dataclass(frozen=True)
class CpuMachine:
    """The facts about a CPU that the kernel-scratch rules read.

    Attributes:
        threads: Threads the kernels split work over (``torch.get_num_threads()``).
        block: oneDNN's channel block (`cpu_block`): 16 on AVX-512, 8 on AVX2.
        amx: AMX tiles with bf16 support that oneDNN may use (``amx_tile`` and
            ``amx_bf16``, not capped away): its bf16 matmuls and convolutions then run
            its ``*_amx`` brgemm kernels.
        avx512_bf16: AVX512-BF16 dot products that oneDNN may use (``avx512_bf16``).
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

    @property
    def kind(self) -> CpuKind:
        """Which measured set of rules applies (`CpuKind`).

        Example:
            >>> CpuMachine(threads=2, block=8).kind, CpuMachine(threads=2, block=16).kind
            (<CpuKind.AVX2: 'avx2'>, <CpuKind.AVX512: 'avx512'>)
        """
        if self.block == 16:
            return CpuKind.AVX512_AMX if self.amx else CpuKind.AVX512
        return CpuKind.AVX2 if self.block == 8 else CpuKind.OTHER

    def pad(self, channels: int) -> int:
        """Channels rounded up to the oneDNN block.

        Example:
            >>> CpuMachine(threads=2, block=16).pad(24)
            32
        """
        return -(-channels // self.block) * self.block


def this_cpu() -> CpuMachine:
    """`CpuMachine` for this process: its thread count, and what oneDNN will use."""
    features = cpu_features()
    isa = onednn_isa(features)
    rank = _ORDER.index(isa) if isa else -1
    return CpuMachine(
        threads=torch.get_num_threads(),
        block=cpu_block(),
        amx=rank >= _ORDER.index("AVX512_CORE_AMX") and bool(features.get("amx_bf16")),
        avx512_bf16=rank >= _ORDER.index("AVX512_CORE_BF16"),
        l1=_size(features.get("l1d_cache_size")),
        l2=_size(features.get("l2_cache_size")),
    )


def _size(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
