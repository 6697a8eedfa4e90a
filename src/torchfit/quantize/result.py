"""`Footprint`: the bytes a quantized model holds, by module kind, predicted or measured."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from torchfit._core.units import format_bytes

__all__ = ["Footprint", "FootprintRow", "summarize"]


@dataclasses.dataclass(frozen=True)
class FootprintRow:
    """The bytes of all modules of one kind (``"Linear4bit"``, ``"Embedding"``, ...).

    Attributes:
        kind: Module class name after quantization.
        modules: How many modules of that kind the model has.
        parameters: Parameters they own (a quantized weight counts its original elements).
        quantized: Bytes of packed 4-bit or int8 weights.
        scales: Bytes of quantization statistics (absmax, nested absmax, offset, code
            books, LLM.int8 row scales).
        unquantized: Bytes of every other parameter and buffer, at its own dtype.
        quantized_parameters: The part of `parameters` held in quantized form.
    """

    kind: str
    modules: int
    parameters: int
    quantized: int
    scales: int
    unquantized: int
    quantized_parameters: int = 0

    @property
    def total(self) -> int:
        """All bytes of this kind."""
        return self.quantized + self.scales + self.unquantized


@dataclasses.dataclass(frozen=True)
class Footprint:
    """Bytes of a model's weights, split into quantized weights, scales and the rest.

    Attributes:
        quantized: Bytes of packed 4-bit or int8 weights.
        scales: Bytes of the quantization statistics kept beside them (``quant_state`` of
            4-bit layers, ``SCB`` of LLM.int8 layers): what ``get_memory_footprint()`` misses.
        unquantized: Bytes of every parameter and buffer left unquantized, at its own dtype.
        parameters: Parameters of the model (quantized weights count their original elements).
        quantized_parameters: Parameters held in quantized form.
        rows: One `FootprintRow` per module kind, largest first.
        method: What was applied, e.g. ``"nf4 + double quant"``, ``"int8"`` or ``"none"``.
        source: ``"predicted"`` (from shapes) or ``"measured"`` (from a model's tensors).
        device: ``"cuda"`` (tensors rounded to the allocator's 512-byte blocks) or ``"cpu"``.
        notes: Rules applied, in words.

    Example:
        >>> fp = Footprint(quantized=8, scales=8, unquantized=16, parameters=16,
        ...                quantized_parameters=16)
        >>> fp.total, fp.bits_per_parameter
        (32, 16.0)
    """

    quantized: int
    scales: int
    unquantized: int
    parameters: int
    quantized_parameters: int
    rows: tuple[FootprintRow, ...] = ()
    method: str = "none"
    source: str = "predicted"
    device: str = "cpu"
    notes: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        """All bytes: quantized weights + scales + unquantized parameters and buffers."""
        return self.quantized + self.scales + self.unquantized

    @property
    def bits_per_parameter(self) -> float:
        """Bits per parameter over the whole model, buffers included."""
        return self.total * 8 / self.parameters if self.parameters else 0.0

    @property
    def quantized_bits_per_parameter(self) -> float:
        """Bits per parameter of the quantized layers alone, scales included."""
        if not self.quantized_parameters:
            return 0.0
        return (self.quantized + self.scales) * 8 / self.quantized_parameters

    def to_dict(self) -> dict[str, Any]:
        """Every field, plus ``total`` and the bits per parameter, as plain Python values."""
        data = dataclasses.asdict(self)
        data["rows"] = [{**dataclasses.asdict(r), "total": r.total} for r in self.rows]
        data["notes"] = list(self.notes)
        data["total"] = self.total
        data["bits_per_parameter"] = self.bits_per_parameter
        data["quantized_bits_per_parameter"] = self.quantized_bits_per_parameter
        return data

    def __str__(self) -> str:
        """A table of module kinds with their bytes, then the totals."""
        head = ("kind", "modules", "parameters", "quantized", "scales", "unquantized", "total")
        body = [(r.kind, f"{r.modules:,}", f"{r.parameters:,}", *_sizes(r)) for r in self.rows]
        body.append(("total", "", f"{self.parameters:,}", *_sizes(self)))
        widths = [max(len(line[i]) for line in (head, *body)) for i in range(len(head))]
        lines = [f"Footprint ({self.source}, {self.device}, {self.method})"]
        for line in (head, *body):
            cells = [line[0].ljust(widths[0])] + [
                c.rjust(w) for c, w in zip(line[1:], widths[1:], strict=True)
            ]
            lines.append("  " + "  ".join(cells))
        lines.append(f"  bits per parameter: {self.bits_per_parameter:.3f}")
        if self.quantized_parameters:
            lines.append(
                f"  bits per quantized parameter (with scales): "
                f"{self.quantized_bits_per_parameter:.3f}"
            )
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _sizes(item: FootprintRow | Footprint) -> tuple[str, str, str, str]:
    return (
        format_bytes(item.quantized),
        format_bytes(item.scales),
        format_bytes(item.unquantized),
        format_bytes(item.total),
    )


def summarize(
    rows: Iterable[FootprintRow],
    *,
    method: str,
    source: str,
    device: str = "cpu",
    notes: tuple[str, ...] = (),
) -> Footprint:
    """Add rows of the same kind together and build the `Footprint`.

    Example:
        >>> rows = [FootprintRow("Linear4bit", 1, 64, 32, 24, 0, 64),
        ...         FootprintRow("Linear4bit", 1, 64, 32, 24, 0, 64)]
        >>> summarize(rows, method="nf4", source="predicted").rows[0].modules
        2
    """
    merged: dict[str, FootprintRow] = {}
    for row in rows:
        old = merged.get(row.kind)
        merged[row.kind] = (
            row
            if old is None
            else FootprintRow(
                row.kind,
                old.modules + row.modules,
                old.parameters + row.parameters,
                old.quantized + row.quantized,
                old.scales + row.scales,
                old.unquantized + row.unquantized,
                old.quantized_parameters + row.quantized_parameters,
            )
        )
    kept = sorted(
        (r for r in merged.values() if r.total or r.parameters),
        key=lambda r: (-r.total, r.kind),
    )
    quantized_params = sum(r.quantized_parameters for r in kept)
    return Footprint(
        quantized=sum(r.quantized for r in kept),
        scales=sum(r.scales for r in kept),
        unquantized=sum(r.unquantized for r in kept),
        parameters=sum(r.parameters for r in kept),
        quantized_parameters=quantized_params,
        rows=tuple(kept),
        method=method,
        source=source,
        device=device,
        notes=notes,
    )
