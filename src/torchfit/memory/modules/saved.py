"""What a model keeps for backward, layer by layer, from one meta-device pass.

`activation_bytes` runs the model's forward with ``torch.func.functional_call`` on
*meta* copies of its parameters and inputs — no memory is allocated and the model is
not modified — while ``torch.autograd.graph.saved_tensors_hooks`` records every tensor
autograd saves. That is exactly what backward will need, for any layer type (in-place
activations, max-pool indices, dropout masks, concatenations included), attributed to
the innermost module running when it was saved.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map

from torchfit._core.tensors import check_materialized
from torchfit._core.units import DType, format_bytes, parse_dtype
from torchfit.memory.modules.meta import sdpa_as_on_device, split_inputs, to_meta, training_flags
from torchfit.memory.result import LayerMemory

__all__ = ["ActivationReport", "LayerRecord", "activation_bytes"]


@dataclasses.dataclass(frozen=True)
class LayerRecord:
    """One leaf module in forward order: what it saved and the sizes around it."""

    name: str
    kind: str
    saved: int
    input_bytes: int
    output_bytes: int
    param_bytes: int
    detail: str
    input_requires_grad: bool = True
    input_shape: tuple[int, ...] = ()
    kernel: tuple[int, ...] = ()
    groups: int = 1
    out_channels: int = 0


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
        return tensor

    def pre(self, module: nn.Module, args: object) -> None:
        self.stack.append(module)
        name = self.names.get(id(module))
        if name is not None and not any(True for _ in module.children()):
            row = self.records.setdefault(name, {"kind": type(module).__name__, "in": 0, "out": 0})
            row["in"] = _nbytes(args)
            leaves = [t for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor)]
            row["grad"] = any(t.requires_grad for t in leaves)
            row["shape"] = tuple(leaves[0].shape) if leaves else ()
            if name not in self.order:
                self.order.append(name)

    def post(self, module: nn.Module, _args: object, output: object) -> None:
        name = self.names.get(id(module))
        if name in self.records:
            self.records[name]["out"] = _nbytes(output)
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


def activation_bytes(
    model: nn.Module,
    example_input: object,
    *,
    dtype: str | DType | None = None,
    training: bool = True,
    device: str = "cuda",
) -> ActivationReport:
    """Bytes autograd saves for backward in one forward pass, with a per-layer table.

    Nothing is allocated and ``model`` is left as it was (its parameters are replaced by
    meta tensors for the duration of the call; train/eval flags are restored). The input
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

    Raises:
        RuntimeError: the forward cannot run on the meta device (a data-dependent op, a
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
    convert = to_meta(torch_dtype)
    made: dict[int, nn.Parameter] = {}  # tied weights (an LM head): one meta tensor for all names
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
    args, kwargs = split_inputs(inputs)
    hooks = torch.autograd.graph.saved_tensors_hooks(recorder.pack, lambda t: t)
    sdpa = sdpa_as_on_device(device=device, training=training)
    with training_flags(model, training=training), _module_hooks(recorder), hooks, sdpa:
        try:
            output = torch.func.functional_call(model, tensors, args, kwargs, strict=False)
        except (RuntimeError, NotImplementedError, TypeError) as error:
            raise RuntimeError(
                f"activation_bytes could not run module {recorder.current()!r} on the meta "
                f"device: {error}. Use torchfit.memory.trace (fake tensors) or the analytic "
                "estimate(config, ...) for this model"
            ) from error
    per_module: dict[str, list[tuple[int, str]]] = {}
    for name, size, what in recorder.saved.values():
        per_module.setdefault(name, []).append((size, what))
    records = []
    for name in recorder.order:
        row = recorder.records[name]
        items = per_module.pop(name, [])
        module = dict(model.named_modules())[name]
        records.append(
            LayerRecord(
                name=name,
                kind=row["kind"],
                saved=sum(size for size, _ in items),
                input_bytes=row["in"],
                output_bytes=row["out"],
                param_bytes=sum(
                    _nbytes(params[f"{name}.{p}"]) for p, _ in module.named_parameters()
                ),
                detail=", ".join(sorted({what for _, what in items})),
                input_requires_grad=row.get("grad", True),
                input_shape=row.get("shape", ()),
                kernel=_kernel(module),
                groups=int(getattr(module, "groups", 1)),
                out_channels=int(getattr(module, "out_channels", 0)),
            )
        )
    for name, items in per_module.items():  # saved outside any leaf module (functional ops)
        records.append(
            LayerRecord(
                name,
                "functional",
                sum(s for s, _ in items),
                0,
                0,
                0,
                ", ".join(sorted({w for _, w in items})),
            )
        )
    return ActivationReport(
        total=sum(size for _, size, _ in recorder.saved.values()),
        input_bytes=_nbytes(inputs),
        output_bytes=_nbytes(output),
        records=tuple(records),
    )


# A constant seen in every oneDNN convolution backward measured here (22.8-24.4 KB,
# whatever the shape): its scratchpad.
def _kernel(module: nn.Module) -> tuple[int, ...]:
    size = getattr(module, "kernel_size", ())
    return tuple(size) if isinstance(size, tuple | list) else (int(size),) if size else ()
