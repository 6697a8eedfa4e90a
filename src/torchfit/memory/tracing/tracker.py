"""The dispatch-level allocation tracker behind `torchfit.memory.trace`.

`Tracker` is a ``TorchDispatchMode`` stacked above a ``FakeTensorMode``: it sees every
ATen op that runs below autograd, registers each new storage its outputs hold (an
allocation) and learns of each free through a weak reference on the storage object.
PyTorch keeps one Python object per storage while the storage lives, so the weak
reference dies exactly when the storage does (the same mechanism as
``torch.distributed._tools.mem_tracker``; here owned and tested by torchfit).

Frees are queued by the weak-reference callbacks and applied before the next lookup,
so that a callback firing in the middle of an update cannot corrupt the counts, and a
freed storage's Python id is never mistaken for a live one.
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
    """Counts live storage bytes op by op; records events while `recording`."""

    def __init__(self, *, block: int = 1, workspace: WorkspaceFn | None = None) -> None:
        """Set up an empty tracker.

        Args:
            block: Round every storage up to this many bytes (512 for CUDA).
            workspace: Per-op kernel-scratch rules, or ``None``.
        """
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
        """Apply the frees queued by weak-reference callbacks."""
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
        """Count ``storage`` as allocated now (once); return its record (None if empty)."""
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
        """Give the storage behind ``tensor`` a new category (e.g. ``gradients``)."""
        record = self.register(tensor.untyped_storage(), category)
        if record is not None and record.category != category:
            record.category = category
            if self.recording:
                self.tags.append((len(self.events), record.id, category))

    def transient(self, nbytes: int, module: str, op: str) -> None:
        """Kernel scratch: allocated and freed within one op."""
        if nbytes <= 0:
            return
        if self.recording:
            self.rule_hits[op] += 1
        record = self._alloc(nbytes, "workspace", module, f"{op} scratch")
        self.live -= record.nbytes
        if self.recording:
            self.events.append(("free", record.id))

    def start(self, baseline: Iterable[tuple[torch.Tensor, str, str]]) -> int:
        """Begin recording the measured step from the live ``baseline`` tensors.

        Args:
            baseline: ``(tensor, category, label)`` for what the step starts with (model
                states, optimizer state, inputs); the first category given for a storage
                wins.

        Returns:
            Bytes of other storages still alive from the warm-up, now ignored (a
            measurement does not count them either).
        """
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
        """Apply pending frees and stop recording."""
        self.drain()
        self.recording = False

    # -- where are we -------------------------------------------------------------
    def where(self) -> tuple[str, str]:
        """(phase, module path) of the op running now."""
        node = torch._C._current_autograd_node()  # noqa: SLF001 - no public equivalent
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
