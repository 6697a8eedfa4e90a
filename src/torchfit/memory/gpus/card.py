"""`GPU`: one card's memory, bandwidth, precision support and tensor-core peaks.

The catalog (`torchfit.memory.gpus`) is made of these; `GPU.custom` makes one for a card
the catalog lacks. See `torchfit.memory.gpus` for what ``memory`` means.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, cast

from torchfit._core import checks
from torchfit._core.hardware import native_bf16, native_fp8
from torchfit._core.units import format_bytes, parse_bytes

__all__ = ["GPU"]

_FIELDS = (
    "name",
    "memory",
    "vendor",
    "architecture",
    "compute_capability",
    "bf16",
    "fp8",
    "memory_bandwidth_gb_s",
    "fp16_tflops",
    "bf16_tflops",
    "aliases",
    "source",
    "nvidia_smi_total",
    "sm_count",
)


def _positive_number(owner: str, field: str, value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{owner}: {field} must be a number or None; got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{owner}: {field} must be a finite number > 0 or None; got {value!r}")
    return float(value)


@dataclasses.dataclass(frozen=True)
class GPU:
    """One card: its memory and the figures that decide what fits and how fast.

    Attributes:
        name: Canonical name, e.g. ``"NVIDIA GeForce RTX 3060 12GB"``.
        memory: Total memory in bytes. Catalog cards: the nominal size, "N GB" read as
            N GiB (what ``nvidia-smi`` shows on most cards); from `current_gpu`: the
            ``total_memory`` torch reports (a few percent less). See the module docstring.
        vendor: ``"NVIDIA"``, ``"AMD"``, or ``"unknown"`` for a custom card.
        architecture: ``"Ampere"``, ``"Ada Lovelace"``, ``"CDNA 3"``, ...; None if unknown.
        compute_capability: CUDA ``(major, minor)``; None for AMD or when unknown.
        bf16: Native bf16 tensor-core math (NVIDIA: compute capability >= 8.0).
        fp8: Native fp8 tensor-core math (NVIDIA: compute capability >= 8.9).
        memory_bandwidth_gb_s: Peak memory bandwidth in decimal GB/s (1e9 B/s).
        fp16_tflops: Peak dense tensor-core TFLOPS, fp16 inputs, fp32 accumulation
            (the mode torch's fp16 matmuls use); None without tensor cores or a figure.
        bf16_tflops: The same for bf16 inputs; None without native bf16 or a figure.
        aliases: Other spellings that resolve to this card (torch's device name among them).
        source: The vendor document the figures come from, and how any were derived.
        nvidia_smi_total: The "Total" ``nvidia-smi`` shows, where it is published and less
            than ``memory`` (ECC on GDDR6 data-center cards); None elsewhere. `total` is
            what a plan compares its device total with.
        sm_count: Streaming multiprocessors (the vendor's CUDA cores / cores per SM);
            the CUDA context grows with it. None when unknown (and on AMD cards).

    Example:
        >>> card = GPU.custom("lab card", memory="20GiB", compute_capability=(8, 6))
        >>> card.memory, card.bf16, card.fp8
        (21474836480, True, False)
    """

    name: str
    memory: int
    vendor: str = "unknown"
    architecture: str | None = None
    compute_capability: tuple[int, int] | None = None
    bf16: bool = False
    fp8: bool = False
    memory_bandwidth_gb_s: float | None = None
    fp16_tflops: float | None = None
    bf16_tflops: float | None = None
    aliases: tuple[str, ...] = ()
    source: str = ""
    nvidia_smi_total: int | None = None
    sm_count: int | None = None

    @property
    def total(self) -> int:
        """Bytes ``nvidia-smi`` shows as the card's total: ``nvidia_smi_total``, else ``memory``.

        Example:
            >>> GPU.custom("lab card", memory="24GiB").total == 24 * 2**30
            True
        """
        return self.memory if self.nvidia_smi_total is None else self.nvidia_smi_total

    def __post_init__(self) -> None:
        """Check every field (types, positive sizes, flags against the compute capability)."""
        owner = f"GPU {self.name!r}"
        checks.fields(self, "vendor", "architecture")
        _check_text_fields(self, owner)
        smi = self.nvidia_smi_total
        if smi is not None and (
            isinstance(smi, bool) or not isinstance(smi, int) or not 0 < smi <= self.memory
        ):
            raise ValueError(
                f"{owner}: nvidia_smi_total must be bytes in (0, memory={self.memory}] or "
                f"None; got {smi!r}"
            )
        sms = self.sm_count
        if sms is not None and (isinstance(sms, bool) or not isinstance(sms, int) or sms <= 0):
            raise ValueError(f"{owner}: sm_count must be a positive int or None; got {sms!r}")
        for field in ("memory_bandwidth_gb_s", "fp16_tflops", "bf16_tflops"):
            object.__setattr__(self, field, _positive_number(owner, field, getattr(self, field)))
        _check_precision(self, owner)

    @classmethod
    @checks.arguments(memory=checks.parsed(parse_bytes, kinds=(str, float, int)))
    def custom(
        cls,
        name: str,
        *,
        memory: float | str,
        vendor: str = "unknown",
        architecture: str | None = None,
        compute_capability: tuple[int, int] | None = None,
        bf16: bool | None = None,
        fp8: bool | None = None,
        memory_bandwidth_gb_s: float | None = None,
        fp16_tflops: float | None = None,
        bf16_tflops: float | None = None,
        aliases: tuple[str, ...] = (),
        source: str = "user-defined (GPU.custom)",
        sm_count: int | None = None,
    ) -> GPU:
        """Describe a card that is not in the catalog.

        Args:
            name: What to call it.
            memory: Total memory: bytes, or a size such as ``"24GiB"`` or ``"16GB"``
                (parsed by `torchfit.parse_bytes`: GB = 1e9 bytes, GiB = 2**30).
            vendor: ``"NVIDIA"``, ``"AMD"``, ...
            architecture: Architecture name, if known.
            compute_capability: CUDA ``(major, minor)``, if known.
            bf16: Native bf16; derived from ``compute_capability`` (>= 8.0) when None.
            fp8: Native fp8; derived from ``compute_capability`` (>= 8.9) when None.
            memory_bandwidth_gb_s: Peak bandwidth in GB/s, if known.
            fp16_tflops: Dense fp16 tensor TFLOPS (fp32 accumulate), if known.
            bf16_tflops: Dense bf16 tensor TFLOPS, if known.
            aliases: Other names for it.
            source: Where the figures come from.
            sm_count: Streaming multiprocessors, if known (sizes the CUDA context).

        Raises:
            ValueError: ``memory`` is not a positive size, or the flags contradict the
                compute capability of an NVIDIA card.

        Example:
            >>> GPU.custom("my card", memory="12GiB").memory
            12884901888
            >>> GPU.custom("my card", memory="-3GB")  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ValueError: memory='-3GB': cannot read '-3GB' as a size...
        """
        try:
            size = parse_bytes(memory)
        except ValueError as error:
            raise ValueError(f"GPU.custom({name!r}): {error}") from error
        if size <= 0:
            raise ValueError(f"GPU.custom({name!r}): memory must be more than 0; got {memory!r}")
        cc = (
            None
            if compute_capability is None
            else cast("tuple[int, int]", tuple(compute_capability))
        )
        if bf16 is None:
            bf16 = native_bf16(cc)
        if fp8 is None:
            fp8 = native_fp8(cc)
        return cls(
            name=name,
            memory=size,
            vendor=vendor,
            architecture=architecture,
            compute_capability=cc,
            bf16=bf16,
            fp8=fp8,
            memory_bandwidth_gb_s=memory_bandwidth_gb_s,
            fp16_tflops=fp16_tflops,
            bf16_tflops=bf16_tflops,
            aliases=tuple(aliases),
            source=source,
            sm_count=sm_count,
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GPU:
        """Build a card from `to_dict` output or a catalog entry (memory may be ``"12GiB"``).

        Raises:
            ValueError: a key is unknown or ``name``/``memory`` is missing.
        """
        unknown = sorted(set(data) - set(_FIELDS))
        if unknown:
            raise ValueError(f"unknown GPU fields {unknown}; expected some of {list(_FIELDS)}")
        missing = [key for key in ("name", "memory") if key not in data]
        if missing:
            raise ValueError(f"a GPU needs {missing}; got the fields {sorted(data)}")
        fields = dict(data)
        for size in ("memory", "nvidia_smi_total"):
            if isinstance(fields.get(size), str):
                fields[size] = parse_bytes(fields[size])
        if fields.get("compute_capability") is not None:
            fields["compute_capability"] = tuple(fields["compute_capability"])
        fields["aliases"] = tuple(fields.get("aliases", ()))
        return cls(**fields)

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain JSON-ready values (tuples become lists)."""
        data = dataclasses.asdict(self)
        data["compute_capability"] = (
            None if self.compute_capability is None else list(self.compute_capability)
        )
        data["aliases"] = list(self.aliases)
        return data

    def __str__(self) -> str:
        """A short table: memory, architecture, precision support, bandwidth, peaks, source."""

        def number(value: float | None, unit: str) -> str:
            return "unknown" if value is None else f"{value:g} {unit}"

        arch = self.architecture or "unknown"
        if self.compute_capability is not None:
            arch += (
                f" (compute capability {self.compute_capability[0]}.{self.compute_capability[1]})"
            )
        rows = [
            ("memory", f"{format_bytes(self.memory)} ({self.memory} bytes)"),
            *(
                [("nvidia-smi total", f"{format_bytes(self.total)} ({self.total} bytes)")]
                if self.nvidia_smi_total is not None
                else []
            ),
            ("vendor", self.vendor),
            ("architecture", arch),
            ("SMs", "unknown" if self.sm_count is None else str(self.sm_count)),
            (
                "native bf16 / fp8",
                f"{'yes' if self.bf16 else 'no'} / {'yes' if self.fp8 else 'no'}",
            ),
            ("memory bandwidth", number(self.memory_bandwidth_gb_s, "GB/s")),
            ("fp16 tensor (dense)", number(self.fp16_tflops, "TFLOPS")),
            ("bf16 tensor (dense)", number(self.bf16_tflops, "TFLOPS")),
            ("source", self.source or "unknown"),
        ]
        width = max(len(label) for label, _ in rows)
        return "\n".join([self.name, *(f"  {label:<{width}}  {value}" for label, value in rows)])


def _check_text_fields(card: GPU, owner: str) -> None:
    """Name, memory, vendor, architecture, aliases and source have the documented types."""
    if not isinstance(card.name, str) or not card.name.strip():
        raise ValueError(f"a GPU needs a non-empty name; got {card.name!r}")
    if isinstance(card.memory, bool) or not isinstance(card.memory, int):
        raise TypeError(f"{owner}: memory must be an int of bytes; got {card.memory!r}")
    if card.memory <= 0:
        raise ValueError(f"{owner}: memory must be more than 0 bytes; got {card.memory}")
    if not isinstance(card.vendor, str) or not isinstance(card.source, str):
        raise TypeError(f"{owner}: vendor and source must be strings")
    if card.architecture is not None and not isinstance(card.architecture, str):
        raise TypeError(f"{owner}: architecture must be a string or None")
    if not isinstance(card.aliases, tuple) or not all(
        isinstance(alias, str) and alias.strip() for alias in card.aliases
    ):
        raise TypeError(f"{owner}: aliases must be a tuple of non-empty strings")


def _check_precision(card: GPU, owner: str) -> None:
    """Compute capability is (major, minor); bf16/fp8 agree with it on NVIDIA cards."""
    cc = card.compute_capability
    if cc is not None and not (
        isinstance(cc, tuple)
        and len(cc) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in cc)
    ):
        raise ValueError(f"{owner}: compute_capability must be (major, minor) or None; got {cc!r}")
    if not isinstance(card.bf16, bool) or not isinstance(card.fp8, bool):
        raise TypeError(f"{owner}: bf16 and fp8 must be True or False")
    if card.bf16_tflops is not None and not card.bf16:
        raise ValueError(f"{owner}: bf16_tflops is given but bf16 is False; drop one")
    if card.vendor.upper() != "NVIDIA" or cc is None:
        return
    if card.bf16 != native_bf16(cc):
        raise ValueError(
            f"{owner}: bf16={card.bf16} contradicts compute capability {cc}; NVIDIA cards "
            "have native bf16 from 8.0 (Ampere); leave bf16 unset to derive it"
        )
    if card.fp8 != native_fp8(cc):
        raise ValueError(
            f"{owner}: fp8={card.fp8} contradicts compute capability {cc}; NVIDIA cards "
            "have native fp8 from 8.9 (Ada); leave fp8 unset to derive it"
        )
