"""`LoadMemory`: the host memory of getting a model loaded, predicted."""

from __future__ import annotations

import dataclasses
from typing import Any

from torchfit._core.units import format_bytes

__all__ = ["LoadMemory"]


@dataclasses.dataclass(frozen=True)
class LoadMemory:
    """The resident memory (RSS) a load adds to the process, by kind, in bytes.

    Linux counts two kinds of resident page. *Anonymous* pages are what the process
    allocated (tensors it copied or cast): they must fit in RAM. *File-backed* pages are
    a memory-mapped checkpoint's bytes once read: they count in RSS while mapped, but the
    kernel can drop them and read them again, so a load whose file pages do not all fit
    still completes, at disk speed.

    Attributes:
        peak: Peak RSS above the process's RSS before the load (`anon_at_peak` +
            `file_at_peak` + `transient` + `overhead`).
        anon_at_peak: Anonymous bytes held at the peak (the model's own copies so far,
            and a whole state dict where one is read into memory).
        file_at_peak: Checkpoint bytes read through a memory map and still mapped at the
            peak (transformers keeps every shard open until all are loaded).
        transient: Short-lived copies at the peak: one layer's quantization scratch, the
            bytes of a file read whole, a cast staged on the CPU.
        overhead: Code and Python objects a first load touches (measured, per tensor).
        after: RSS the loaded model holds when the call returns.
        in_use: RSS once every weight has been read at least once (a forward pass on
            the CPU): weights left as views of the mapped file are paged in then.
        mapped: Bytes of weights left as views of the mapped checkpoint (counted in
            `in_use`, not in `after`).
        on_device: Bytes of weights placed on the GPU (not host memory).
        method: The load path, in words.
        notes: The rules applied, in words.

    Example:
        >>> m = LoadMemory(peak=3 * 2**30, anon_at_peak=2**30, file_at_peak=2 * 2**30,
        ...                transient=0, overhead=0, after=2**30, in_use=2**30, mapped=0,
        ...                on_device=0, method="from_pretrained")
        >>> m.must_fit
        1073741824
    """

    peak: int
    anon_at_peak: int
    file_at_peak: int
    transient: int
    overhead: int
    after: int
    in_use: int
    mapped: int
    on_device: int
    method: str
    notes: tuple[str, ...] = ()

    @property
    def must_fit(self) -> int:
        """Bytes that cannot be paged out: the peak less the file-backed pages."""
        return self.peak - self.file_at_peak

    def to_dict(self) -> dict[str, Any]:
        """Every field, plus `must_fit`, as plain Python values."""
        data = dataclasses.asdict(self)
        data["notes"] = list(self.notes)
        data["must_fit"] = self.must_fit
        return data

    def __str__(self) -> str:
        """A small table: the peak by kind, then what stays."""
        rows = [
            ("peak RSS of the load", self.peak),
            ("  anonymous (must fit)", self.anon_at_peak),
            ("  file-backed (mapped)", self.file_at_peak),
            ("  transient", self.transient),
            ("  first-load overhead", self.overhead),
            ("after the load", self.after),
            ("once every weight was read", self.in_use),
        ]
        lines = [f"Host memory of loading ({self.method})"]
        lines += [f"  {name:<28} {format_bytes(value):>12}" for name, value in rows]
        if self.on_device:
            lines.append(f"  {'weights on the GPU':<28} {format_bytes(self.on_device):>12}")
        lines += [f"  - {note}" for note in self.notes]
        return "\n".join(lines)
