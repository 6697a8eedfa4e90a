"""A frozen copy of the trace's tracker before the storage ledger (commit 71111e7).

`LegacyTracker` is ``torchfit/memory/tracing/tracker.py``'s ``Tracker`` and
`legacy_build_trace` is ``torchfit/memory/tracing/result.py``'s ``build_trace`` as they
were at commit 71111e7, before both were rebuilt on ``torchfit._core.ledger``. They are
kept, unchanged but for their names, only for the differential tests in
``tests/core``: the new code must count the same bytes on the same programs.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from torchfit.memory.result import LayerMemory, MemoryEstimate
from torchfit.memory.tracing.ops import (
    is_composite,
    match_cpu_layout,
    refuse_real_tensors,
    run_op,
)
from torchfit.memory.tracing.result import Trace, TracedStorage

#: Key under which a forward module path is stored in an autograd node's metadata.
_NODE_KEY = "torchfit.module"

#: A workspace rule: (op, args, kwargs, outputs) -> bytes of kernel scratch.
WorkspaceFn = Callable[[Any, tuple[Any, ...], dict[str, Any], Any], int]

_SKIP = frozenset({torch.ops.prim.device.default})


@dataclasses.dataclass
class StorageRecord:
    """What the tracker knows about one storage."""

    id: int
    nbytes: int
    raw: int
    category: str
    module: str
    phase: str
    op: str


class LegacyTracker(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts live storage bytes op by op; records events while `recording`."""

    def __init__(self, *, block: int = 1, workspace: WorkspaceFn | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.block = block
        self.workspace = workspace
        self.records: dict[int, StorageRecord] = {}  # by Python id of the storage
        self._refs: dict[int, weakref.ref[torch.UntypedStorage]] = {}
        self._pending: collections.deque[int] = collections.deque()
        self._next_id = 0
        self.live = 0
        self.recording = False
        self.events: list[tuple[Any, ...]] = []
        self.tags: list[tuple[int, int, str]] = []  # (event index, storage id, category)
        # id -> (raw bytes, category at allocation, module, phase, op), while recording
        self.history: dict[int, tuple[int, str, str, str, str]] = {}
        self.peak = 0
        self.peak_index = -1
        self.peak_where = ""
        self.module_stack: list[str] = []
        self.phase = "setup"
        self.ops = 0
        self.on_op: Callable[[], None] | None = None
        self.rule_hits: collections.Counter[str] = collections.Counter()

    # -- storages -----------------------------------------------------------------
    def _rounded(self, nbytes: int) -> int:
        return -(-nbytes // self.block) * self.block

    def _on_free(self, key: int, _ref: object) -> None:
        self._pending.append(key)

    def drain(self) -> None:
        while self._pending:
            key = self._pending.popleft()
            record = self.records.pop(key, None)
            self._refs.pop(key, None)
            if record is None:
                continue
            self.live -= record.nbytes
            if self.recording:
                self.events.append(("free", record.id))

    def _alloc(self, raw: int, category: str, module: str, op: str) -> StorageRecord:
        nbytes = self._rounded(raw)
        record = StorageRecord(self._next_id, nbytes, raw, category, module, self.phase, op)
        self._next_id += 1
        if self.recording:
            self.history[record.id] = (raw, category, module, self.phase, op)
        self.live += nbytes
        if self.recording:
            self.events.append(("alloc", record.id, nbytes))
            if self.live > self.peak:
                self.peak = self.live
                self.peak_index = len(self.events) - 1
                where = f"{self.phase}: {module}" if module else self.phase
                self.peak_where = f"{where} [{op}]" if op else where
        return record

    def register(
        self, storage: torch.UntypedStorage, category: str, *, module: str = "", op: str = ""
    ) -> StorageRecord | None:
        self.drain()
        key = id(storage)
        record = self.records.get(key)
        raw = storage.nbytes()
        if record is not None:
            if raw != record.raw:  # resized in place: a free and a new allocation
                self.records.pop(key)
                self.live -= record.nbytes
                if self.recording:
                    self.events.append(("free", record.id))
                record = self._alloc(raw, record.category, module, op)
                self.records[key] = record
            return record
        if raw == 0:
            return None
        record = self._alloc(raw, category, module, op)
        self.records[key] = record
        self._refs[key] = weakref.ref(storage, functools.partial(self._on_free, key))
        return record

    def tag(self, tensor: torch.Tensor, category: str) -> None:
        record = self.register(tensor.untyped_storage(), category)
        if record is not None and record.category != category:
            record.category = category
            if self.recording:
                self.tags.append((len(self.events), record.id, category))

    def transient(self, nbytes: int, module: str, op: str) -> None:
        if nbytes <= 0:
            return
        if self.recording:
            self.rule_hits[op] += 1
        record = self._alloc(nbytes, "workspace", module, f"{op} scratch")
        self.live -= record.nbytes
        if self.recording:
            self.events.append(("free", record.id))

    def start(self, baseline: Iterable[tuple[torch.Tensor, str, str]]) -> int:
        self.drain()
        keep: dict[int, StorageRecord] = {}
        for tensor, category, label in baseline:
            storage = tensor.untyped_storage()
            if id(storage) in keep:
                continue
            record = self.register(storage, category, module=label)
            if record is not None:
                record.category, record.module = category, label
                keep[id(storage)] = record
        dropped = 0
        for key in [key for key in self.records if key not in keep]:
            dropped += self.records.pop(key).nbytes
            self._refs.pop(key, None)
        self.live = sum(record.nbytes for record in self.records.values())
        self.events, self.tags, self.history = [], [], {}
        for record in self.records.values():
            self.events.append(("alloc", record.id, record.nbytes))
            self.history[record.id] = (record.raw, record.category, record.module, "start", "")
        self.recording = True
        self.peak, self.peak_index, self.peak_where = self.live, len(self.events) - 1, "start"
        self.rule_hits.clear()
        self.phase = "forward"
        return dropped

    def stop(self) -> None:
        self.drain()
        self.recording = False

    # -- where are we -------------------------------------------------------------
    def where(self) -> tuple[str, str]:
        node = torch._C._current_autograd_node()
        if node is not None:
            label = _metadata(node).get(_NODE_KEY, "")
            return "backward", f"{label} ({node.name()})" if label else node.name()
        if self.module_stack:
            return "forward", self.module_stack[-1]
        return self.phase, ""

    # -- the dispatch mode --------------------------------------------------------
    def __torch_dispatch__(
        self,
        func: Any,
        types: Iterable[type],
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        if func in _SKIP:
            return func(*args, **kwargs)
        refuse_real_tensors(func, args, kwargs)
        if is_composite(func):
            # Run the composite's own decomposition here, so that its intermediates
            # (which the real kernel allocates too) pass through this mode.
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        out = match_cpu_layout(func, args, run_op(func, args, kwargs))
        phase, module = self.where()
        saved_phase, self.phase = self.phase, phase
        try:
            op = str(func)
            category = "activations" if phase in {"forward", "loss"} else "workspace"
            for leaf in tree_leaves(out):
                if isinstance(leaf, torch.Tensor):
                    self.register(leaf.untyped_storage(), category, module=module, op=op)
            if self.workspace is not None:
                self.transient(self.workspace(func, args, kwargs, out), module, op)
        finally:
            self.phase = saved_phase
        self.ops += 1
        if self.on_op is not None:
            self.on_op()
        return out

    # -- hooks on the fake copies -------------------------------------------------
    def watch_module(self, root: nn.Module, *, prefix: str = "") -> list[Any]:
        handles: list[Any] = []
        for name, module in root.named_modules():
            path = ".".join(part for part in (prefix, name) if part) or type(module).__name__
            handles.append(
                module.register_forward_pre_hook(
                    functools.partial(self._enter, path), with_kwargs=True
                )
            )
            handles.append(
                module.register_forward_hook(functools.partial(self._leave, path), always_call=True)
            )
        return handles

    def _enter(self, path: str, _module: nn.Module, args: object, kwargs: object) -> None:
        # What was computed before this module ran belongs to its caller: label it first,
        # so that this module's post hook stops there.
        _label_graph((args, kwargs), self.module_stack[-1] if self.module_stack else "(input)")
        self.module_stack.append(path)

    def _leave(self, path: str, _module: nn.Module, _args: object, output: object) -> None:
        if self.module_stack and self.module_stack[-1] == path:
            self.module_stack.pop()
        if not self.module_stack and self.phase == "forward":
            self.phase = "loss"
        _label_graph(output, path)

    def watch_optimizer(self, optimizer: torch.optim.Optimizer) -> list[Any]:

        def pre(_opt: object, _args: object, _kwargs: object) -> None:
            self.phase = "optimizer"

        def post(_opt: object, _args: object, _kwargs: object) -> None:
            for state in optimizer.state.values():
                for value in state.values():
                    if isinstance(value, torch.Tensor):
                        self.tag(value, "optimizer")
            self.phase = "after step"

        return [optimizer.register_step_pre_hook(pre), optimizer.register_step_post_hook(post)]

    def watch_parameter(self, param: torch.Tensor) -> Any:

        def hook(p: torch.Tensor) -> None:
            if p.grad is not None:
                self.tag(p.grad, "gradients")

        return param.register_post_accumulate_grad_hook(hook)  # type: ignore[no-untyped-call]


def _metadata(node: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = node.metadata
    return metadata


def _label_graph(output: object, path: str) -> None:
    stack = [
        leaf.grad_fn
        for leaf in _leaves(output)
        if isinstance(leaf, torch.Tensor) and leaf.grad_fn is not None
    ]
    while stack:
        node = stack.pop()
        metadata = _metadata(node)
        if _NODE_KEY in metadata:
            continue
        metadata[_NODE_KEY] = path
        stack.extend(next_node for next_node, _ in node.next_functions if next_node is not None)


def _leaves(output: object) -> list[Any]:
    if isinstance(output, Mapping):
        return [leaf for value in output.values() for leaf in _leaves(value)]
    return tree_leaves(output)


_CATEGORY_FIELDS = ("weights", "gradients", "optimizer", "activations", "workspace")


def _live_at_peak(tracker: LegacyTracker) -> dict[int, str]:
    tags = collections.defaultdict(list)
    for index, storage_id, category in tracker.tags:
        tags[index].append((storage_id, category))
    live: dict[int, str] = {}
    for index, event in enumerate(tracker.events[: tracker.peak_index + 1]):
        for storage_id, category in tags.get(index, ()):
            if storage_id in live:
                live[storage_id] = category
        if event[0] == "alloc":
            live[event[1]] = tracker.history[event[1]][1]
        else:
            live.pop(event[1], None)
    return live


def _layers(
    tracker: LegacyTracker, live: dict[int, str], kinds: dict[str, str]
) -> tuple[LayerMemory, ...]:
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


def legacy_build_trace(
    tracker: LegacyTracker, *, device: str, notes: list[str], kinds: dict[str, str]
) -> Trace:
    live = _live_at_peak(tracker)
    by_category: collections.Counter[str] = collections.Counter()
    rounding = 0
    for storage_id, category in live.items():
        raw = tracker.history[storage_id][0]
        by_category[category] += raw
        rounding += tracker._rounded(raw) - raw
    fields = {name: by_category[name] for name in _CATEGORY_FIELDS}
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
            nbytes=tracker._rounded(raw),
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
    )
