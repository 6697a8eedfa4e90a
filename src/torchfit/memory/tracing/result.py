"""`Trace`: the full result of a traced step, and how it is built from the tracker."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

from torchfit._core.ledger import Event, round_up
from torchfit.memory.kernels.cuda_reduce import Reduction
from torchfit.memory.outline import RecordedStep
from torchfit.memory.result import LayerMemory, MemoryEstimate
from torchfit.memory.tracing.tracker import Tracker

__all__ = ["Event", "Trace", "TracedStorage", "build_trace"]

_CATEGORY_FIELDS = ("weights", "gradients", "optimizer", "activations", "workspace")


@dataclasses.dataclass(frozen=True)
class TracedStorage:
    """One storage of the traced step.

    Attributes:
        id: Its id in `Trace.events`.
        nbytes: Bytes as the target allocator counts them (rounded to 512 for CUDA).
        raw: The storage's own size.
        category: Its category at the peak (or when it was freed, if before):
            ``weights``, ``gradients``, ``optimizer``, ``activations`` or ``workspace``.
        module: The module that allocated it (``"(inputs)"``, ``"(weights)"`` ... for
            what existed before the step); in backward, the module and autograd node.
        phase: ``start``, ``forward``, ``loss``, ``backward``, ``optimizer`` or
            ``after step``.
        op: The ATen op that allocated it (``"<op> scratch"`` for modelled kernel scratch).
    """

    id: int
    nbytes: int
    raw: int
    category: str
    module: str
    phase: str
    op: str


@dataclasses.dataclass(frozen=True)
class Trace:
    """A traced step: the estimate, plus every allocation and free in time order.

    ``events`` is the list another tool can replay (`torchfit.memory.allocator.replay`
    takes it as it is): `Event` ``("alloc", id, nbytes)`` and ``("free", id, nbytes)``
    tuples, starting with one ``alloc`` per storage alive when the step starts
    (weights, gradients kept by ``set_to_none=False``, optimizer state, inputs). The
    running sum of live bytes peaks at `peak` (``== estimate.total``), reached at
    ``events[peak_index]``. Kernel scratch modelled by a rule appears as an ``alloc``
    immediately followed by its ``free``. Storages still alive at the end have no
    ``free``.

    ``warmup_events`` are the warm-up step's events in the same form, from the storages
    alive before it (weights, inputs) to the step's start: a storage the step starts
    with keeps its id, and what the step does not start with is freed at their end.
    `torchfit.memory.allocator.replay` takes them as ``warmup``: the step then runs in
    the segments the warm-up left, as a step measured after a warm-up does.

    Attributes:
        estimate: The `MemoryEstimate` at the peak.
        events: Allocation and free events, in order.
        storages: What each event id is (`TracedStorage`), in id order.
        peak: Peak live bytes of the step.
        peak_index: Index in ``events`` of the allocation that reached the peak
            (``-1`` when nothing was allocated).
        ops: ATen ops traced in the measured step.
        device: The target device (``"cpu"`` or ``"cuda"``).
        warmup_events: The warm-up steps' events, in order (empty without warm-up).
        resizable: ``(id, Reduction)`` of each kernel-scratch event whose size depends on
            the card (CUDA reduction staging buffers), sized in ``events`` for
            `CudaRules`' reference card; `to_device` sizes them for its card.
    """

    estimate: MemoryEstimate
    events: tuple[Event, ...]
    storages: tuple[TracedStorage, ...]
    peak: int
    peak_index: int
    ops: int
    device: str
    warmup_events: tuple[Event, ...] = ()
    resizable: tuple[tuple[int, Reduction], ...] = ()

    def __str__(self) -> str:
        """The estimate, then the modules holding the most bytes at the peak."""
        head = f"Trace ({self.device}): {self.ops} ops, {len(self.events)} events"
        table = self.estimate.layer_table(top=10)
        return f"{head}\n{self.estimate}\nat the peak, by module:\n{table}"

    def recorded(self) -> RecordedStep:
        """The step's events as a `RecordedStep`, what `to_device` replays."""
        return RecordedStep(
            warmup=self.warmup_events,
            events=self.events,
            training=any(storage.phase == "backward" for storage in self.storages),
            resizable=self.resizable,
        )

    def allocator_events(self) -> list[Event]:
        """The events as ``torchfit.memory.allocator.replay`` takes them: `events` itself."""
        return list(self.events)

    def to_dict(self) -> dict[str, Any]:
        """Plain Python values: the estimate, events as lists, storages as dicts."""
        return {
            "estimate": self.estimate.to_dict(),
            "events": [list(event) for event in self.events],
            "storages": [dataclasses.asdict(storage) for storage in self.storages],
            "peak": self.peak,
            "peak_index": self.peak_index,
            "ops": self.ops,
            "device": self.device,
            "warmup_events": [list(event) for event in self.warmup_events],
        }


def _live_at_peak(tracker: Tracker) -> dict[int, str]:
    """Storage id -> category, for the storages alive at the peak."""
    tags = collections.defaultdict(list)
    for index, storage_id, category in tracker.tags:
        tags[index].append((storage_id, category))
    live: dict[int, str] = {}
    for index, event in enumerate(tracker.events[: tracker.peak_index + 1]):
        for storage_id, category in tags.get(index, ()):
            if storage_id in live:
                live[storage_id] = category
        if event.kind == "alloc":
            live[event.id] = tracker.history[event.id][1]
        else:
            live.pop(event.id, None)
    return live


def _layers(
    tracker: Tracker, live: dict[int, str], kinds: dict[str, str]
) -> tuple[LayerMemory, ...]:
    """Activation bytes alive at the peak, grouped by the module that allocated them."""
    total: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    phases: dict[str, set[str]] = collections.defaultdict(set)
    for storage_id, category in live.items():
        if category != "activations":
            continue
        raw, _, module, phase, _ = tracker.history[storage_id]
        name = module or "(loss)"
        total[name] += raw
        count[name] += 1
        phases[name].add(phase)
    rows = []
    for name, nbytes in total.most_common():
        kind = kinds.get(name, "inputs" if name == "(inputs)" else "")
        detail = f"{count[name]} tensor(s) from {', '.join(sorted(phases[name]))}"
        rows.append(LayerMemory(name=name, kind=kind, activations=nbytes, detail=detail))
    return tuple(rows)


def build_trace(tracker: Tracker, *, device: str, notes: list[str], kinds: dict[str, str]) -> Trace:
    """Turn a finished tracker into a `Trace` (breakdown and module rows at the peak)."""
    live = _live_at_peak(tracker)
    by_category: collections.Counter[str] = collections.Counter()
    rounding = 0
    for storage_id, category in live.items():
        raw = tracker.history[storage_id][0]
        by_category[category] += raw
        rounding += round_up(raw, tracker.block) - raw
    fields: dict[str, Any] = {name: by_category[name] for name in _CATEGORY_FIELDS}
    estimate = MemoryEstimate(
        **fields,
        overhead=rounding,
        device=device,
        notes=tuple(notes),
        layers=_layers(tracker, live, kinds),
        peak_at=tracker.peak_where,
    )
    final = {storage_id: category for _, storage_id, category in tracker.tags}
    storages = tuple(
        TracedStorage(
            id=storage_id,
            nbytes=round_up(raw, tracker.block),
            raw=raw,
            category=live.get(storage_id, final.get(storage_id, category)),
            module=module,
            phase=phase,
            op=op,
        )
        for storage_id, (raw, category, module, phase, op) in sorted(tracker.history.items())
    )
    return Trace(
        estimate=estimate,
        events=tuple(tracker.events),
        storages=storages,
        peak=tracker.peak,
        peak_index=tracker.peak_index,
        ops=tracker.ops,
        device=device,
        warmup_events=tuple(tracker.warmup_events),
        resizable=tuple(sorted(tracker.resizable.items())),
    )
