"""The dispatch-level allocation tracker behind `torchfit.memory.trace`.

`Tracker` is a ``TorchDispatchMode`` stacked above a ``FakeTensorMode``: it sees every
ATen op that runs below autograd, registers each new storage its outputs hold (an
allocation) and learns of each free through a weak reference on the storage object.
PyTorch keeps one Python object per storage while the storage lives, so the weak
reference dies exactly when the storage does (the same mechanism as
``torch.distributed._tools.mem_tracker``; here owned and tested by torchfit).

The counting itself (one storage once, frees queued and applied before the next
lookup, in-place resizes as a free and an allocation, the event list) is
`torchfit._core.ledger.Ledger`'s; the tracker labels what it counts.

Gradients several nodes send to one input are summed as autograd's engine sums real
tensors, in place where it may (`torchfit.memory.tracing.accumulate`).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from torchfit._core.ledger import Entry, Event, Ledger, storage_key
from torchfit.memory.kernels.cuda_reduce import CudaRules, Reduction
from torchfit.memory.tracing.accumulate import GradientMakers
from torchfit.memory.tracing.ops import (
    UntraceableOpError,
    is_composite,
    match_cpu_layout,
    refuse_real_tensors,
    run_op,
)

__all__ = ["StorageRecord", "Tracker", "UntraceableOpError"]

#: Key under which a forward module path is stored in an autograd node's metadata.
_NODE_KEY = "torchfit.module"

#: A workspace rule: (op, args, kwargs, outputs) -> bytes of kernel scratch.
WorkspaceFn = Callable[[Any, tuple[Any, ...], dict[str, Any], Any], int]

_SKIP = frozenset({torch.ops.prim.device.default})


@dataclasses.dataclass
class StorageRecord:
    """What the tracker knows about one storage.

    Attributes:
        id: The storage's id in the event list.
        nbytes: Bytes counted (rounded up to the allocator block for CUDA).
        raw: The storage's own size in bytes, before rounding.
        category: ``weights``, ``gradients``, ``optimizer``, ``activations`` or
            ``workspace`` (its latest category).
        module: Module path (forward) or module path + autograd node (backward).
        phase: ``forward``, ``loss``, ``backward``, ``optimizer``, ``setup``.
        op: The ATen op that allocated it (``""`` for storages that existed before).
    """

    id: int
    nbytes: int
    raw: int
    category: str
    module: str
    phase: str
    op: str


class Tracker(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts live storage bytes op by op; records events while `recording`.

    The counting is a `Ledger`'s; the tracker adds what each storage is (category,
    module, phase, op), the categories' changes (`tags`) and where the peak happened.
    """

    def __init__(self, *, block: int = 1, workspace: WorkspaceFn | None = None) -> None:
        """Set up an empty tracker.

        Args:
            block: Round every storage up to this many bytes (512 for CUDA).
            workspace: Per-op kernel-scratch rules, or ``None``.
        """
        super().__init__()  # type: ignore[no-untyped-call]
        self.ledger = Ledger(block=block)
        self.workspace = workspace
        self.records: dict[int, StorageRecord] = {}  # by allocation id
        self.tags: list[tuple[int, int, str]] = []  # (event index, storage id, category)
        self.warmup_events: list[Event] = []  # recorded before the last `start`
        # id -> (raw bytes, category at allocation, module, phase, op), while recording
        self.history: dict[int, tuple[int, str, str, str, str]] = {}
        self.peak_where = ""
        self._frozen: tuple[int, int] | None = (0, -1)  # (peak, index) outside start..stop
        self.module_stack: list[str] = []
        self.phase = "setup"
        self.ops = 0
        self.on_op: Callable[[], None] | None = None
        self.rule_hits: collections.Counter[str] = collections.Counter()
        # scratch id -> the reduction behind it, to size it again for another card
        self.resizable: dict[int, Reduction] = {}
        self.makers = GradientMakers()  # which backward node allocated each storage

    # -- the ledger's figures -------------------------------------------------------------
    @property
    def block(self) -> int:
        """The rounding block (512 for CUDA, 1 for CPU)."""
        return self.ledger.block

    @property
    def recording(self) -> bool:
        """Whether allocations and frees are recorded as events."""
        return self.ledger.recording

    @recording.setter
    def recording(self, value: bool) -> None:
        self.ledger.recording = value

    @property
    def events(self) -> list[Event]:
        """The recorded allocations and frees, in order."""
        return self.ledger.events

    @property
    def live(self) -> int:
        """Bytes alive now."""
        return self.ledger.live

    @property
    def peak(self) -> int:
        """Peak live bytes of the recorded step: from `start` to `stop` (0 before)."""
        return self.ledger.peak if self._frozen is None else self._frozen[0]

    @property
    def peak_index(self) -> int:
        """Index in `events` of the allocation that reached `peak` (-1 before `start`)."""
        return self.ledger.peak_index if self._frozen is None else self._frozen[1]

    # -- storages -----------------------------------------------------------------
    def drain(self) -> None:
        """Apply the frees queued by weak-reference callbacks."""
        self.ledger.drain()

    def _new_record(self, entry: Entry, category: str, module: str, op: str) -> StorageRecord:
        record = StorageRecord(entry.id, entry.nbytes, entry.raw, category, module, self.phase, op)
        self.records[entry.id] = record
        if self.recording:
            self.history[entry.id] = (entry.raw, category, module, self.phase, op)
        return record

    def _note_peak(self, alloc_index: int, module: str, op: str) -> None:
        """Remember where we are if the allocation at ``events[alloc_index]`` set the peak."""
        if self.recording and self.ledger.peak_index == alloc_index:
            where = f"{self.phase}: {module}" if module else self.phase
            self.peak_where = f"{where} [{op}]" if op else where

    def _register(
        self, storage: torch.UntypedStorage, category: str, module: str, op: str
    ) -> tuple[Entry, StorageRecord] | None:
        entry, fresh = self.ledger.add(storage)
        if not entry.nbytes:
            return None
        if not fresh:
            return entry, self.records[entry.id]
        previous = self.records.get(entry.previous)
        if previous is not None:  # resized in place: the new allocation keeps its category
            category = previous.category
        record = self._new_record(entry, category, module, op)
        self._note_peak(len(self.events) - 1, module, op)
        return entry, record

    def register(
        self, storage: torch.UntypedStorage, category: str, *, module: str = "", op: str = ""
    ) -> StorageRecord | None:
        """Count ``storage`` as allocated now (once); return its record (None if empty)."""
        found = self._register(storage, category, module, op)
        return None if found is None else found[1]

    def tag(self, tensor: torch.Tensor, category: str) -> None:
        """Give the storage behind ``tensor`` a new category (e.g. ``gradients``)."""
        record = self.register(tensor.untyped_storage(), category)
        if record is not None and record.category != category:
            record.category = category
            if self.recording:
                self.tags.append((len(self.events), record.id, category))

    def transient(self, nbytes: int, module: str, op: str) -> int | None:
        """Kernel scratch: allocated and freed within one op. Returns its id (None: none)."""
        if nbytes <= 0:
            return None
        if self.recording:
            self.rule_hits[op] += 1
        entry = self.ledger.transient(nbytes)
        if self.recording:
            label = f"{op} scratch"
            self.history[entry.id] = (entry.raw, "workspace", module, self.phase, label)
            self._note_peak(len(self.events) - 2, module, label)
        return entry.id

    def _kernel_scratch(
        self,
        rules: WorkspaceFn,
        call: tuple[Any, tuple[Any, ...], dict[str, Any], Any],
        module: str,
        op: str,
    ) -> None:
        """Count an op call's kernel scratch; keep a CUDA staging buffer's `Reduction`."""
        func, args, kwargs, out = call
        reduction = None
        if isinstance(rules, CudaRules):
            for workspace in rules.workspaces(func, args, out):
                self.transient(workspace, module, op)
            nbytes, reduction = rules.scratch(func, args, kwargs)
        else:
            nbytes = rules(func, args, kwargs, out)
        scratch = self.transient(nbytes, module, op)
        if scratch is not None and reduction is not None:
            self.resizable[scratch] = reduction

    def start(self, baseline: Iterable[tuple[torch.Tensor, str, str]]) -> int:
        """Begin recording the measured step from the live ``baseline`` tensors.

        Args:
            baseline: ``(tensor, category, label)`` for what the step starts with (model
                states, optimizer state, inputs); the first category given for a storage
                wins.

        When recording already (the warm-up was recorded from its own `start`), the
        events so far become `warmup_events`, ending with a ``free`` of each storage
        ignored from now on: replayed, they leave what the step starts with, under the
        ids the step's events give it.

        Returns:
            Bytes of other storages still alive from the warm-up, now ignored (a
            measurement does not count them either).
        """
        self.drain()
        keep: dict[int, tuple[Entry, StorageRecord]] = {}  # by storage key
        for tensor, category, label in baseline:
            key = storage_key(tensor)
            if key is None or key in keep:
                continue
            found = self._register(tensor.untyped_storage(), category, label, "")
            if found is not None:
                found[1].category, found[1].module = category, label
                keep[key] = found
        before = self.events if self.recording else []
        dropped = self.ledger.restart(entry for entry, _ in keep.values())
        self.warmup_events = before
        self.records = {record.id: record for _, record in keep.values()}
        self.tags, self.history = [], {}
        for entry in self.ledger.entries():
            record = self.records[entry.id]
            self.history[entry.id] = (record.raw, record.category, record.module, "start", "")
        self.peak_where = "start"
        self.makers.clear()
        self._frozen = None
        self.rule_hits.clear()
        self.phase = "forward"
        return dropped

    def stop(self) -> None:
        """Apply pending frees and stop recording; `peak` keeps the recorded step's."""
        self.drain()
        self.recording = False
        self.makers.clear()
        if self._frozen is None:
            self._frozen = (self.ledger.peak, self.ledger.peak_index)

    # -- where are we -------------------------------------------------------------
    def where(self, node: Any) -> tuple[str, str]:
        """(phase, module path) of the op running now, in backward ``node`` (else None)."""
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
        """Run ``func`` on fake tensors and count the storages its outputs hold."""
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
        node = torch._C._current_autograd_node()  # noqa: SLF001 - no public equivalent
        if node is not None and self.makers.sums_in_place(func, node, args, kwargs, self.ledger):
            out = run_op(torch.ops.aten.add_.Tensor, args, kwargs)
        else:
            out = match_cpu_layout(func, args, run_op(func, args, kwargs))
        phase, module = self.where(node)
        saved_phase, self.phase = self.phase, phase
        try:
            op = str(func)
            category = "activations" if phase in {"forward", "loss"} else "workspace"
            for leaf in tree_leaves(out):
                if isinstance(leaf, torch.Tensor):
                    record = self.register(leaf.untyped_storage(), category, module=module, op=op)
                    if node is not None and record is not None:
                        self.makers.note(record.id, node)
            if self.workspace is not None:
                self._kernel_scratch(self.workspace, (func, args, kwargs, out), module, op)
        finally:
            self.phase = saved_phase
        self.ops += 1
        if self.on_op is not None:
            self.on_op()
        return out

    # -- hooks on the fake copies -------------------------------------------------
    def watch_module(self, root: nn.Module, *, prefix: str = "") -> list[Any]:
        """Hooks on every submodule: a module stack, and autograd nodes labelled by module."""
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
        """Phase hooks around ``step`` and a category for the state it creates."""

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
        """Categorize the gradient as ``gradients`` once it is accumulated into ``.grad``."""

        def hook(p: torch.Tensor) -> None:
            if p.grad is not None:
                self.tag(p.grad, "gradients")

        return param.register_post_accumulate_grad_hook(hook)  # type: ignore[no-untyped-call]


def _metadata(node: Any) -> dict[str, Any]:
    """The node's metadata dict (a property at runtime; typed as a method in the stubs)."""
    metadata: dict[str, Any] = node.metadata
    return metadata


def _label_graph(output: object, path: str) -> None:
    """Label the autograd nodes a module's forward created (inner modules labelled first)."""
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
    """Tensors in a module output: pytree leaves, plus the values of mapping-like outputs."""
    if isinstance(output, Mapping):
        return [leaf for value in output.values() for leaf in _leaves(value)]
    return tree_leaves(output)
