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
        kept: Anonymous bytes the loaded model holds when the call returns (with
            `overhead`): they must stay in RAM.
        stale: Checkpoint pages read during the load that stay mapped afterwards (their
            file is still mapped for weights left as views): counted in RSS, never read
            again, dropped first when memory runs short.
        mapped: Bytes of weights left as views of the mapped checkpoint: paged in when
            first used, and read again at every use.
        on_device: Bytes of weights placed on the GPU (not host memory).
        method: The load path, in words.
        notes: The rules applied, in words.

    Example:
        >>> m = LoadMemory(peak=3 * 2**30, anon_at_peak=2**30, file_at_peak=2 * 2**30,
        ...                transient=0, overhead=0, kept=2**30, stale=0, mapped=2**30,
        ...                on_device=0, method="from_pretrained")
        >>> m.must_fit, m.working_set
        (1073741824, 2147483648)
    """

    peak: int
    anon_at_peak: int
    file_at_peak: int
    transient: int
    overhead: int
    kept: int
    stale: int
    mapped: int
    on_device: int
    method: str
    notes: tuple[str, ...] = ()

    @property
    def must_fit(self) -> int:
        """Bytes of the peak that cannot be paged out: the peak less the file-backed pages."""
        return self.peak - self.file_at_peak

    @property
    def after(self) -> int:
        """RSS the call leaves (`kept` + `stale`)."""
        return self.kept + self.stale

    @property
    def in_use(self) -> int:
        """RSS once every weight was read at least once (`after` + `mapped`)."""
        return self.after + self.mapped

    @property
    def working_set(self) -> int:
        """What running the model on the CPU keeps reading: `kept` + `mapped`."""
        return self.kept + self.mapped

    def to_dict(self) -> dict[str, Any]:
        """Every field, plus `must_fit`, as plain Python values."""
        data = dataclasses.asdict(self)
        data["notes"] = list(self.notes)
        data.update(must_fit=self.must_fit, after=self.after, in_use=self.in_use,
                    working_set=self.working_set)  # fmt: skip
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
            ("  of which stale file pages", self.stale),
            ("once every weight was read", self.in_use),
        ]
        lines = [f"Host memory of loading ({self.method})"]
        lines += [f"  {name:<28} {format_bytes(value):>12}" for name, value in rows]
        if self.on_device:
            lines.append(f"  {'weights on the GPU':<28} {format_bytes(self.on_device):>12}")
        lines += [f"  - {note}" for note in self.notes]
        return "\n".join(lines)
