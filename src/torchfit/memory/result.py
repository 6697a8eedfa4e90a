"""`MemoryEstimate`: the one currency of torchfit's memory module.

Every estimator (analytic, traced) returns one, every decision (`fits`, batch-size
solving) consumes one, and every test compares one with a real `Measurement`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

from torchfit._core import checks
from torchfit._core.units import format_bytes
from torchfit.memory.outline import RecordedStep, StepOutline

__all__ = ["CATEGORIES", "AffineEstimate", "LayerMemory", "MemoryEstimate"]

#: The byte categories of an estimate, in the order tables print them.
CATEGORIES: tuple[str, ...] = (
    "weights",
    "gradients",
    "optimizer",
    "activations",
    "kv_cache",
    "workspace",
    "overhead",
)


@dataclasses.dataclass(frozen=True)
class LayerMemory:
    """One row of a per-module table: where the bytes are ("which layer eats my memory").

    Attributes:
        name: Module path in the model (``"layer1.0.conv1"``), or a label.
        kind: Module class name (``"Conv2d"``) or op name.
        activations: Bytes this module keeps alive for backward (or at the peak).
        detail: What those bytes are, in words (``"input fp32; max-pool indices int64"``).
    """

    name: str
    kind: str
    activations: int
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """Predicted memory of one step, in bytes, broken down at the moment of the peak.

    The seven categories add up to `total`, the predicted peak of allocated bytes
    (what ``torch.cuda.max_memory_allocated`` reports, or what `measure_peak` measures
    on CPU). `reserved` is the caching allocator's view of that peak (segments held),
    and `device_total` adds the CUDA `context`, which the allocator never sees: it is
    the figure ``nvidia-smi`` shows.

    Attributes:
        weights: Parameters and buffers (quantized weights with their scales).
        gradients: Gradients alive at the peak.
        optimizer: Optimizer state (moments, momentum, fp32 master weights).
        activations: Tensors saved for backward, inputs, outputs and loss logits.
        kv_cache: Keys and values cached for generation.
        workspace: Transient buffers: kernel scratch, attention scores in flight,
            optimizer temporaries, cuBLAS/cuDNN workspaces.
        overhead: Other allocated bytes (autocast weight copies, allocator rounding).
        reserved: Bytes the CUDA caching allocator holds at the peak; ``None`` when not
            modelled (CPU estimates).
        context: CUDA context and library handles outside the allocator (0 on CPU).
        device: ``"cuda"`` or ``"cpu"``: the device the rules were applied for.
        notes: The rules the estimator applied, in words (e.g. the SDPA backend chosen).
        layers: Optional per-module rows (`LayerMemory`) explaining `activations`.
        peak_at: Where the peak happens (a module path or phase such as ``"backward"``).
        outline: The step's tensors in step order (`StepOutline`), when the estimator
            knows them, or the events a trace recorded (`RecordedStep`): `to_device`
            replays them through the caching-allocator model.
        oom_line: The smallest allocator capacity the replayed step fits in (set by
            `to_device` from an outline; ``None`` when not replayed).

    Example:
        >>> e = MemoryEstimate(weights=4 * 2**20, activations=2**20)
        >>> e.total
        5242880
        >>> (e * 2).activations
        2097152
        >>> (e + e).weights == 2 * e.weights
        True
    """

    weights: int = 0
    gradients: int = 0
    optimizer: int = 0
    activations: int = 0
    kv_cache: int = 0
    workspace: int = 0
    overhead: int = 0
    reserved: int | None = None
    context: int = 0
    device: str = "cuda"
    notes: tuple[str, ...] = ()
    layers: tuple[LayerMemory, ...] = ()
    peak_at: str = ""
    outline: StepOutline | RecordedStep | None = dataclasses.field(
        default=None, repr=False, compare=False
    )
    oom_line: int | None = None

    def __post_init__(self) -> None:
        """Reject negative or non-integer byte counts."""
        for name in (*CATEGORIES, "context"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"MemoryEstimate.{name} must be an int of bytes; got {value!r}")
            if value < 0:
                raise ValueError(f"MemoryEstimate.{name} must be >= 0 bytes; got {value}")
        checks.fields(
            self,
            "reserved",
            "notes",
            "layers",
            "peak_at",
            "outline",
            "oom_line",
            device=checks.one_of("cuda", "cpu"),
        )

    @property
    def in_optimizer_step(self) -> bool:
        """The peak is in the optimizer step.

        The closed forms and meta-device passes say ``"optimizer step"``, a trace
        ``"optimizer [aten.op]"`` (the op running at its peak).

        Example:
            >>> MemoryEstimate(peak_at="optimizer [aten._foreach_sqrt]").in_optimizer_step
            True
        """
        return self.peak_at == "optimizer step" or self.peak_at.startswith("optimizer [")

    @property
    def total(self) -> int:
        """Predicted peak of allocated bytes: the sum of the seven categories."""
        return sum(getattr(self, name) for name in CATEGORIES)

    @property
    def model_states(self) -> int:
        """Weights + gradients + optimizer state: the part that does not scale with batch."""
        return self.weights + self.gradients + self.optimizer

    @property
    def device_total(self) -> int:
        """What ``nvidia-smi`` would show: reserved (or allocated) bytes plus the context."""
        held = self.total if self.reserved is None else max(self.reserved, self.total)
        return held + self.context

    @property
    def device_needed(self) -> int:
        """The smallest card the step runs on: the OOM line plus the context.

        Before it raises out of memory, the caching allocator frees the blocks it caches
        and tries again, so a step runs on a card smaller than `device_total`, down to
        `oom_line` (the smallest capacity the replayed step fits in) plus the CUDA context.
        Without a replay this is `device_total`. Verdicts (`fits`) decide on it.

        Example:
            >>> e = MemoryEstimate(weights=2**30, reserved=3 * 2**29, context=2**28)
            >>> e.device_needed == e.device_total
            True
            >>> e.replace(oom_line=2**30 + 2**20).device_needed // 2**20
            1281
        """
        if self.oom_line is None:
            return self.device_total
        return max(self.oom_line, self.total) + self.context

    def items(self) -> Iterator[tuple[str, int]]:
        """Yield ``(category, bytes)`` pairs in table order."""
        for name in CATEGORIES:
            yield name, getattr(self, name)

    def replace(self, **changes: Any) -> MemoryEstimate:
        """Return a copy with some fields changed (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)

    def __add__(self, other: MemoryEstimate) -> MemoryEstimate:
        """Add field by field; notes are concatenated without repeats."""
        if not isinstance(other, MemoryEstimate):
            return NotImplemented
        reserved = (
            None
            if self.reserved is None or other.reserved is None
            else self.reserved + other.reserved
        )
        notes = tuple(dict.fromkeys((*self.notes, *other.notes)))
        fields = {name: getattr(self, name) + getattr(other, name) for name in CATEGORIES}
        return MemoryEstimate(
            **fields,
            reserved=reserved,
            context=max(self.context, other.context),
            device=self.device,
            notes=notes,
            layers=(*self.layers, *other.layers),
            peak_at=self.peak_at or other.peak_at,
        )

    def __mul__(self, factor: float) -> MemoryEstimate:
        """Scale every byte category (not the context) by ``factor``, rounding up."""
        if isinstance(factor, bool) or not isinstance(factor, int | float):
            return NotImplemented
        if factor < 0 or not math.isfinite(factor):
            raise ValueError(
                f"an estimate can only be scaled by a finite factor >= 0; got {factor}"
            )
        fields = {name: math.ceil(getattr(self, name) * factor) for name in CATEGORIES}
        reserved = None if self.reserved is None else math.ceil(self.reserved * factor)
        layers = tuple(
            dataclasses.replace(row, activations=math.ceil(row.activations * factor))
            for row in self.layers
        )
        return MemoryEstimate(
            **fields,
            reserved=reserved,
            context=self.context,
            device=self.device,
            notes=self.notes,
            layers=layers,
            peak_at=self.peak_at,
        )

    def __rmul__(self, factor: float) -> MemoryEstimate:
        """``factor * estimate`` is ``estimate * factor``."""
        return self.__mul__(factor)

    def to_dict(self) -> dict[str, Any]:
        """Every figure plus ``total``, ``device_total`` and ``device_needed``, as plain values."""
        data = dataclasses.asdict(dataclasses.replace(self, outline=None))
        data.pop("outline")  # the schedule `to_device` replayed, not a figure
        data["notes"] = list(self.notes)
        data["layers"] = [dataclasses.asdict(row) for row in self.layers]
        data["total"] = self.total
        data["device_total"] = self.device_total
        data["device_needed"] = self.device_needed
        return data

    def __repr__(self) -> str:
        """One line: the device, the peak and where it is (``print`` for the table).

        Example:
            >>> MemoryEstimate(weights=3 * 2**30, activations=2**30, peak_at="forward")
            <MemoryEstimate (cuda): 4.00 GiB allocated at the peak (forward)>
            >>> MemoryEstimate(weights=2**30, reserved=2**31, context=2**28)
            <MemoryEstimate (cuda): 1.00 GiB allocated at the peak; 2.25 GiB on the device>
        """
        text = f"<MemoryEstimate ({self.device}): {format_bytes(self.total)} allocated at the peak"
        text += f" ({self.peak_at})" if self.peak_at else ""
        if self.reserved is not None or self.context:
            text += f"; {format_bytes(self.device_total)} on the device"
        return f"{text}>"

    def __str__(self) -> str:
        """A table in binary units, categories first, then the allocator and device view."""
        rows = [(name, value) for name, value in self.items() if value]
        rows.append(("total (allocated peak)", self.total))
        if self.reserved is not None:
            rows.append(("reserved (allocator)", self.reserved))
        if self.context:
            rows.append(("CUDA context", self.context))
        if self.reserved is not None or self.context:
            rows.append(("device total (nvidia-smi)", self.device_total))
        if self.oom_line is not None:
            rows.append(("needs on the card (OOM line)", self.device_needed))
        width = max(len(name) for name, _ in rows)
        lines = [f"MemoryEstimate ({self.device})"]
        lines += [f"  {name:<{width}}  {format_bytes(value):>12}" for name, value in rows]
        if self.peak_at:
            lines.append(f"  peak at: {self.peak_at}")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)

    def layer_table(self, top: int | None = None) -> str:
        """The per-module rows, largest first: which layer eats the memory."""
        rows = sorted(self.layers, key=lambda row: row.activations, reverse=True)[:top]
        if not rows:
            return "(no per-module rows in this estimate)"
        width = max(len(row.name) for row in rows)
        kind_width = max(len(row.kind) for row in rows)
        return "\n".join(
            f"{row.name:<{width}}  {row.kind:<{kind_width}}  "
            f"{format_bytes(row.activations):>12}  {row.detail}".rstrip()
            for row in rows
        )


@dataclasses.dataclass(frozen=True)
class AffineEstimate:
    """Memory as a function of batch size: ``fixed + batch_size * per_sample``.

    Activations, KV cache and most workspace grow linearly with the batch; model
    states do not. Batch-size solving inverts this line.

    Example:
        >>> line = AffineEstimate(MemoryEstimate(weights=1000), MemoryEstimate(activations=10))
        >>> line.at(8).total
        1080
        >>> line.batch_within(1500)
        50
    """

    fixed: MemoryEstimate
    per_sample: MemoryEstimate

    def __post_init__(self) -> None:
        """Refuse parts that are not `MemoryEstimate` objects."""
        checks.fields(self)

    @checks.arguments()
    def at(self, batch_size: int) -> MemoryEstimate:
        """The estimate at ``batch_size`` samples."""
        if batch_size < 0:
            raise ValueError(f"batch_size must be >= 0; got {batch_size}")
        return self.fixed + self.per_sample * batch_size

    @checks.arguments()
    def batch_within(self, budget_bytes: int) -> int:
        """The largest batch whose `total` stays within ``budget_bytes`` (0 if none fits).

        The whole budget, no margin kept: `torchfit.memory.max_batch_size` keeps one.
        """
        room = budget_bytes - self.fixed.total
        per = self.per_sample.total
        if room < 0:
            return 0
        if per <= 0:
            raise ValueError(
                "memory does not grow with batch size in this estimate, so any batch fits; "
                "check that the per-sample part was estimated"
            )
        return room // per
