"""What a model keeps for backward, layer by layer, from one pass on data-free tensors.

`activation_bytes` runs the model's forward with ``torch.func.functional_call`` on
data-free copies of its parameters and inputs (fake CPU tensors for a CPU target, *meta*
tensors otherwise: `torchfit.memory.modules.meta.twins`) — no memory is allocated and the
model is not modified — while ``torch.autograd.graph.saved_tensors_hooks`` records every tensor
autograd saves. That is exactly what backward will need, for any layer type (in-place
activations, max-pool indices, dropout masks, concatenations included), attributed to
the innermost module running when it was saved.

With ``kernel_calls=True`` the same pass also keeps, per layer, the ATen calls that have a
kernel-scratch rule (`torchfit.memory.kernels.calls`), in the forward and, after a
backward on the same tensors, in the backward: the analytic estimate asks the rules the
tracer asks, with the same arguments.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map

from torchfit._core import checks
from torchfit._core.outputs import compute_loss
from torchfit._core.tensors import check_materialized
from torchfit._core.units import DType, format_bytes, parse_dtype
from torchfit.memory.kernels.calls import CallRecorder, KernelCall
from torchfit.memory.modules.meta import (
    autograd_label,
    label_graph,
    sdpa_as_on_device,
    split_inputs,
    training_flags,
    twins,
)
from torchfit.memory.result import LayerMemory

__all__ = ["ActivationReport", "LayerRecord", "activation_bytes"]


@dataclasses.dataclass(frozen=True)
class LayerRecord:
    """One leaf module in forward order: what it saved and the sizes around it.

    ``forward_calls`` and ``backward_calls`` are the ATen calls with a kernel-scratch rule
    that the layer made (`KernelCall`, on data-free tensors), when they were recorded.
    """

    name: str
    kind: str
    saved: int
    input_bytes: int
    output_bytes: int
    param_bytes: int
    detail: str
    input_requires_grad: bool = True
    input_shape: tuple[int, ...] = ()
    forward_calls: tuple[KernelCall, ...] = dataclasses.field(default=(), repr=False, compare=False)
    backward_calls: tuple[KernelCall, ...] = dataclasses.field(
        default=(), repr=False, compare=False
    )


@dataclasses.dataclass(frozen=True)
class ActivationReport:
    """Bytes autograd saves for backward, in total and per module.

    Attributes:
        total: Distinct saved storages (parameters excluded), in bytes.
        input_bytes: Bytes of the example input.
        output_bytes: Bytes of the output.
        records: Per-module rows in forward order (`LayerRecord`).
    """

    total: int
    input_bytes: int
    output_bytes: int
    records: tuple[LayerRecord, ...]

    def __int__(self) -> int:
        """The total in bytes."""
        return self.total

    @property
    def layers(self) -> tuple[LayerMemory, ...]:
        """The rows as `LayerMemory`, for `MemoryEstimate.layers`."""
        return tuple(LayerMemory(r.name, r.kind, r.saved, r.detail) for r in self.records)

    def __str__(self) -> str:
        """A per-layer table, largest first, then the total."""
        rows = sorted(self.records, key=lambda r: r.saved, reverse=True)
        width = max((len(r.name) for r in rows), default=5)
        kind = max((len(r.kind) for r in rows), default=4)
        lines = [f"{'layer':<{width}}  {'type':<{kind}}  {'saved':>12}  what"]
        lines += [
            f"{r.name:<{width}}  {r.kind:<{kind}}  {format_bytes(r.saved):>12}  {r.detail}"
            for r in rows
            if r.saved
        ]
        lines.append(f"{'total':<{width}}  {'':<{kind}}  {format_bytes(self.total):>12}")
        return "\n".join(lines)


def _storage_key(tensor: torch.Tensor) -> int:
    return int(tensor.untyped_storage()._cdata)  # noqa: SLF001 - storage identity on meta


def _nbytes(tree: object) -> int:
    leaves, _ = tree_flatten(tree)
    seen: dict[int, int] = {}
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            seen[_storage_key(leaf)] = leaf.untyped_storage().nbytes()
    return sum(seen.values())


def _describe_tensor(tensor: torch.Tensor) -> str:
    if tensor.dtype == torch.bool:
        return "mask (bool)"
    if tensor.dtype == torch.int64:
        return "indices (int64)"
    return str(tensor.dtype).removeprefix("torch.")


@dataclasses.dataclass
class _Recorder:
    names: dict[int, str]
    param_keys: set[int]
    stack: list[nn.Module] = dataclasses.field(default_factory=list)
    saved: dict[int, tuple[str, int, str]] = dataclasses.field(default_factory=dict)
    pinned: list[torch.Tensor] = dataclasses.field(default_factory=list)
    records: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    order: list[str] = dataclasses.field(default_factory=list)
    labels: bool = False

    def current(self) -> str:
        return self.names.get(id(self.stack[-1]), "") if self.stack else "(model)"

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        key = _storage_key(tensor)
        if key not in self.param_keys and key not in self.saved:
            self.saved[key] = (
                self.current(),
                tensor.untyped_storage().nbytes(),
                _describe_tensor(tensor),
            )
            self.pinned.append(tensor)  # keep the storage alive so its key stays unique
            self.seen(self.current())
        return tensor

    def seen(self, name: str) -> None:
        """Place ``name`` in forward order when it first holds something."""
        if name not in self.order:
            self.order.append(name)

    def pre(self, module: nn.Module, args: object) -> None:
        if self.labels:  # what was computed before this module belongs to its caller
            label_graph(args, self.current())
        self.stack.append(module)
        name = self.names.get(id(module))
        if name is not None and not any(True for _ in module.children()):
            row = self.records.setdefault(name, {"kind": type(module).__name__, "in": 0, "out": 0})
            row["in"] = _nbytes(args)
            leaves = [t for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor)]
            row["grad"] = any(t.requires_grad for t in leaves)
            row["shape"] = tuple(leaves[0].shape) if leaves else ()
            self.seen(name)

    def post(self, module: nn.Module, _args: object, output: object) -> None:
        name = self.names.get(id(module))
        if name in self.records:
            self.records[name]["out"] = _nbytes(output)
        if self.labels and name is not None:
            label_graph(output, name)
        if self.stack and self.stack[-1] is module:
            self.stack.pop()


@contextmanager
def _module_hooks(recorder: _Recorder) -> Iterator[None]:
    pre = nn.modules.module.register_module_forward_pre_hook(recorder.pre)
    post = nn.modules.module.register_module_forward_hook(recorder.post)
    try:
        yield
    finally:
        pre.remove()
        post.remove()


@checks.arguments(
    model=checks.model(), example_input=checks.inputs(), device=checks.one_of("cuda", "cpu")
)
def activation_bytes(
    model: nn.Module,
    example_input: object,
    *,
    dtype: str | DType | None = None,
    training: bool = True,
    device: str = "cuda",
    kernel_calls: bool = False,
) -> ActivationReport:
    """Bytes autograd saves for backward in one forward pass, with a per-layer table.

    Nothing is allocated and ``model`` is left as it was (its parameters are replaced by
    data-free twins for the duration of the call; train/eval flags are restored). The input
    is the caller's tensor: when a layer saves it, it is not counted in ``total`` (its size
    is ``input_bytes``).

    Args:
        model: Any ``nn.Module``.
        example_input: A tensor, a tuple (positional) or a dict (keyword arguments);
            only shapes and dtypes matter (meta tensors are fine).
        dtype: Run as if parameters and floating inputs had this dtype.
        training: Train-mode behaviour (dropout masks, batch statistics).
        device: The target device: which attention kernel ``scaled_dot_product_attention``
            would pick (``"cuda"``: flash / memory-efficient; ``"cpu"``: flash unless
            training with dropout).
        kernel_calls: Also keep each layer's ATen calls that have a kernel-scratch rule
            (`LayerRecord.forward_calls`, and ``backward_calls`` from a backward on the
            same tensors when ``training``).

    Raises:
        RuntimeError: the forward cannot run without data (a data-dependent op, a
            custom kernel); the message names the module and the op.

    Example:
        >>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(),
        ...                           torch.nn.MaxPool2d(2))
        >>> report = activation_bytes(net, torch.empty(2, 3, 32, 32, device="meta"))
        >>> [row.kind for row in report.records]
        ['Conv2d', 'ReLU', 'MaxPool2d']
        >>> report.total == 2 * 8 * 30 * 30 * 4 + 2 * 8 * 15 * 15 * 8  # ReLU output, indices
        True
        >>> report.input_bytes  # the conv saves the input too: yours, counted apart
        24576
    """
    check_materialized(model, what="the estimate")
    torch_dtype = None if dtype is None else parse_dtype(dtype).torch_dtype
    with twins(torch_dtype, device=device) as convert:
        return _saved_pass(
            model,
            example_input,
            convert,
            training=training,
            device=device,
            kernel_calls=kernel_calls,
        )


def _saved_pass(
    model: nn.Module,
    example_input: object,
    convert: Callable[[Any], Any],
    *,
    training: bool,
    device: str,
    kernel_calls: bool,
) -> ActivationReport:
    """`activation_bytes` on twins made by ``convert`` (under their mode)."""
    made: dict[int, nn.Parameter] = {}  # tied weights (an LM head): one twin for all names
    params = {
        name: made.setdefault(id(p), nn.Parameter(convert(p.detach()), p.requires_grad))
        for name, p in model.named_parameters(remove_duplicate=False)
    }
    tensors: dict[str, torch.Tensor] = {**params}
    tensors.update({name: convert(b) for name, b in model.named_buffers(remove_duplicate=False)})
    names = {id(m): name or type(m).__name__ for name, m in model.named_modules()}
    inputs = tree_map(convert, example_input)
    input_keys = {_storage_key(t) for t in tree_flatten(inputs)[0] if isinstance(t, torch.Tensor)}
    recorder = _Recorder(names, {_storage_key(t) for t in params.values()} | input_keys)
    recorder.labels = kernel_calls
    calls = CallRecorder(lambda: autograd_label(recorder.current()))
    args, kwargs = split_inputs(inputs)
    hooks = torch.autograd.graph.saved_tensors_hooks(recorder.pack, lambda t: t)
    sdpa = sdpa_as_on_device(device=device, training=training)
    watch = calls if kernel_calls else contextlib.nullcontext()
    with training_flags(model, training=training), _module_hooks(recorder), hooks, sdpa, watch:
        try:
            output = torch.func.functional_call(model, tensors, args, kwargs, strict=False)
        except (RuntimeError, NotImplementedError, TypeError) as error:
            raise RuntimeError(
                f"activation_bytes could not run module {recorder.current()!r} without data "
                f"(on {'fake CPU' if device == 'cpu' else 'meta'} tensors): {error}. Use "
                "torchfit.memory.trace (fake tensors) or the analytic estimate(config, ...) "
                "for this model"
            ) from error
    forward = {name: tuple(made) for name, made in calls.calls.items()}
    calls.calls = {}
    if kernel_calls and training:
        with calls:
            _backward(output)
    return ActivationReport(
        total=sum(size for _, size, _ in recorder.saved.values()),
        input_bytes=_nbytes(inputs),
        output_bytes=_nbytes(output),
        records=_records(recorder, model, params, forward, calls.calls),
    )


def _backward(output: object) -> None:
    """Backward on the twins from the step's loss, for the calls it makes.

    A model whose backward cannot run without data keeps the calls made so far: the estimate
    then lacks the kernel scratch of the rest (as it did before calls were recorded).
    """
    with contextlib.suppress(RuntimeError, NotImplementedError, ValueError, TypeError):
        loss = compute_loss(output)
        if loss.requires_grad:
            loss.backward()  # type: ignore[no-untyped-call]


def _records(
    recorder: _Recorder,
    model: nn.Module,
    params: dict[str, nn.Parameter],
    forward: dict[str, tuple[KernelCall, ...]],
    backward: dict[str, list[KernelCall]],
) -> tuple[LayerRecord, ...]:
    """One row per leaf module and per other module that saved or called something.

    Rows are in forward order: a leaf module where it started, another module (its own
    functional ops) where it first saved a tensor.
    """
    per_module: dict[str, list[tuple[int, str]]] = {}
    for name, size, what in recorder.saved.values():
        per_module.setdefault(name, []).append((size, what))
    modules = dict(model.named_modules())
    order = recorder.order + [n for n in (*forward, *backward) if n not in recorder.order]
    records = []
    for name in order:
        items = per_module.get(name, [])
        row = recorder.records.get(name)
        calls = forward.get(name, ()), tuple(backward.get(name, ()))
        if row is None and not (items or calls[0] or calls[1]):
            continue
        module = modules.get(name) if row is not None else None
        records.append(
            LayerRecord(
                name=name,
                kind="functional" if row is None else row["kind"],
                saved=sum(size for size, _ in items),
                input_bytes=0 if row is None else row["in"],
                output_bytes=0 if row is None else row["out"],
                param_bytes=0  # of the parameters that get a gradient (not a frozen base)
                if module is None
                else sum(
                    _nbytes(params[f"{name}.{p}"])
                    for p, _ in module.named_parameters()
                    if params[f"{name}.{p}"].requires_grad
                ),
                detail=", ".join(sorted({what for _, what in items})),
                input_requires_grad=True if row is None else row.get("grad", True),
                input_shape=() if row is None else row.get("shape", ()),
                forward_calls=calls[0],
                backward_calls=calls[1],
            )
        )
    return tuple(records)
