"""Bytes of bitsandbytes-quantized layers, from the layout rules, and the `Footprint` result.

Everything here is pure arithmetic on shapes and dtypes: no bitsandbytes, no transformers.
The rules are read from bitsandbytes 0.50 (``functional.py``, ``_ops.py``, ``nn/modules.py``)
and checked to the byte against loaded models in ``tests/test_quantize.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from torchfit._core.units import format_bytes

__all__ = [
    "BLOCKSIZE",
    "CUDA_BLOCK",
    "NESTED_BLOCKSIZE",
    "Footprint",
    "FootprintRow",
    "held_bytes",
    "linear4bit_bytes",
    "linear4bit_tensors",
    "linear8bit_bytes",
    "summarize",
]

#: Weights per 4-bit block: bitsandbytes ``quantize_4bit`` uses 64 when no blocksize is
#: given, and transformers' ``Linear4bit`` never passes one (functional.py, nn/modules.py).
BLOCKSIZE = 64
#: Double quantization quantizes the fp32 absmax values again in blocks of 256
#: (``quantize_4bit(compress_statistics=True)`` calls ``quantize_blockwise(..., blocksize=256)``).
NESTED_BLOCKSIZE = 256
#: The CUDA caching allocator hands out blocks of at least 512 bytes, rounded up to a
#: multiple of 512 (kMinBlockSize, c10/cuda/CUDACachingAllocator.cpp): a 4-byte offset
#: holds 512 bytes of GPU memory.
CUDA_BLOCK = 512
_FP32 = 4
_BF16 = 2
#: The 4-bit code book (``get_4bit_type``): 16 fp32 values, a fresh tensor for every layer.
_CODE_4BIT = 16 * _FP32
#: The nested code book: the 256-value dynamic map, copied for every layer
#: (``quantize_blockwise`` stores ``code.to(device, copy=True)``).
_CODE_NESTED = 256 * _FP32


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def held_bytes(nbytes: int, device: str) -> int:
    """Bytes a tensor of ``nbytes`` really holds on ``device`` (``"cuda"`` rounds to 512).

    Example:
        >>> held_bytes(4, "cuda"), held_bytes(4, "cpu"), held_bytes(0, "cuda")
        (512, 4, 0)
    """
    if device == "cuda":
        return _ceil_div(nbytes, CUDA_BLOCK) * CUDA_BLOCK
    return nbytes


def linear4bit_tensors(
    numel: int,
    *,
    double_quant: bool,
    blocksize: int = BLOCKSIZE,
    cpu_packed: bool = False,
) -> tuple[int, tuple[int, ...]]:
    """Bytes of one 4-bit weight (NF4 or FP4) and of each tensor of its ``quant_state``.

    The packed weight holds two 4-bit codes per byte, the last byte padded when ``numel``
    is odd: ``(numel + 1) // 2`` bytes (bitsandbytes ``_ops.py``, fake ``quantize_4bit``).
    The flattened weight is cut into ``ceil(numel / blocksize)`` blocks, the last one
    padded, each with an fp32 absmax. Double quantization stores instead one uint8 per
    block, an fp32 offset (their mean), an fp32 absmax per 256 blocks and the 256-entry
    nested code book. Every layer also keeps its own 16-entry fp32 code book.

    ``cpu_packed`` is the layout after the first inference forward on a CPU with
    AVX512-BF16, where bitsandbytes repacks the layer for its fused kernel
    (``functional._convert_weight_packed_for_cpu``): the absmax is dequantized to one
    bf16 per block and the nested statistics are dropped; the offset stays referenced.

    Returns:
        ``(packed weight bytes, bytes of each quant_state tensor)``.

    Example:
        >>> linear4bit_tensors(65, double_quant=False)  # 33 bytes; 2 blocks, the last padded
        (33, (8, 64))
        >>> linear4bit_tensors(64 * 256, double_quant=True)
        (8192, (256, 4, 4, 1024, 64))
    """
    if numel < 0 or blocksize <= 0:
        raise ValueError(f"numel must be >= 0 and blocksize > 0; got {numel}, {blocksize}")
    weight = (numel + 1) // 2
    blocks = _ceil_div(numel, blocksize)
    if cpu_packed:
        offset = (_FP32,) if double_quant else ()
        return weight, (blocks * _BF16, _CODE_4BIT, *offset)
    if not double_quant:
        return weight, (blocks * _FP32, _CODE_4BIT)
    nested = _ceil_div(blocks, NESTED_BLOCKSIZE)
    return weight, (blocks, _FP32, nested * _FP32, _CODE_NESTED, _CODE_4BIT)


def linear4bit_bytes(
    numel: int,
    *,
    double_quant: bool,
    blocksize: int = BLOCKSIZE,
    cpu_packed: bool = False,
) -> tuple[int, int]:
    """Bytes of one 4-bit weight: ``(packed weight, scales)``; see `linear4bit_tensors`.

    Example:
        >>> linear4bit_bytes(4096 * 4096, double_quant=False)  # 4.5 bits per weight
        (8388608, 1048640)
        >>> weight, scales = linear4bit_bytes(4096 * 4096, double_quant=True)
        >>> round((weight + scales) * 8 / (4096 * 4096), 3)
        4.127
    """
    weight, scales = linear4bit_tensors(
        numel, double_quant=double_quant, blocksize=blocksize, cpu_packed=cpu_packed
    )
    return weight, sum(scales)


def linear8bit_bytes(out_features: int, in_features: int) -> tuple[int, int]:
    """Bytes of one LLM.int8 weight: ``(int8 weight, scales)``.

    One int8 per weight and one fp32 absmax per output row (``SCB``), from
    ``int8_vectorwise_quant`` (bitsandbytes ``_ops.py``: ``row_stats`` has
    ``numel // shape[-1]`` fp32 entries).

    Example:
        >>> linear8bit_bytes(4096, 4096)
        (16777216, 16384)
    """
    if out_features < 0 or in_features < 0:
        raise ValueError(f"a layer shape must be >= 0; got {out_features} x {in_features}")
    return out_features * in_features, out_features * _FP32


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
