"""What a model keeps for backward, layer by layer, from one meta-device pass.

`activation_bytes` runs the model's forward with ``torch.func.functional_call`` on
*meta* copies of its parameters and inputs — no memory is allocated and the model is
not modified — while ``torch.autograd.graph.saved_tensors_hooks`` records every tensor
autograd saves. That is exactly what backward will need, for any layer type (in-place
activations, max-pool indices, dropout masks, concatenations included), attributed to
the innermost module running when it was saved.

`estimate_module` turns that into the peak of a training step with a backward sweep:
layers release their saved tensors in reverse order while gradients appear.
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from torchfit._core.step import Mode, OptimizerName, parse_mode, parse_optimizer
from torchfit._core.tensors import check_materialized
from torchfit._core.units import DType, format_bytes, parse_dtype
from torchfit.memory.analytic.formulas import FP32, model_state_bytes, sdpa_is_flash
from torchfit.memory.result import LayerMemory, MemoryEstimate

__all__ = [
    "ActivationReport",
    "LayerRecord",
    "activation_bytes",
    "estimate_module",
    "inference_peak",
]


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


@contextmanager
def _training_flags(model: nn.Module, *, training: bool) -> Iterator[None]:
    flags = {m: m.training for m in model.modules()}
    model.train(training)
    try:
        yield
    finally:
        for module, flag in flags.items():
            module.training = flag


@contextmanager
def _sdpa_as_on_device(*, device: str, training: bool) -> Iterator[None]:
    """Make meta-device SDPA take the kernel the target device would take.

    On meta, ``scaled_dot_product_attention`` decomposes into the math path (the s x s
    probabilities materialized). CPU runs ``_scaled_dot_product_flash_attention_for_cpu``
    unless training with dropout; CUDA's flash / memory-efficient kernels support dropout.
    Both keep the output and the log-sum-exp only, which the flash-for-CPU op (it has a
    meta kernel and a backward) reproduces. Restored on exit.
    """
    functional = torch.nn.functional
    original = functional.scaled_dot_product_attention

    def routed(  # noqa: PLR0917 - mirrors torch's positional signature
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,  # noqa: FBT001, FBT002 - torch's own signature
        scale: float | None = None,
        enable_gqa: bool = False,  # noqa: FBT001, FBT002
    ) -> torch.Tensor:
        flash = sdpa_is_flash(device=device, training=training, dropout=dropout_p)
        if not flash or query.device.type != "meta":
            return original(
                query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa=enable_gqa
            )
        if enable_gqa and key.shape[-3] != query.shape[-3]:
            repeat = query.shape[-3] // key.shape[-3]
            key = key.repeat_interleave(repeat, dim=-3)
            value = value.repeat_interleave(repeat, dim=-3)
        out: torch.Tensor = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(  # noqa: SLF001
            query, key, value, 0.0, is_causal, attn_mask=attn_mask, scale=scale
        )[0]
        return out

    functional.scaled_dot_product_attention = routed
    try:
        yield
    finally:
        functional.scaled_dot_product_attention = original


def _to_meta(dtype: torch.dtype | None) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        cast = dtype if dtype is not None and value.is_floating_point() else value.dtype
        meta = torch.empty_like(value, device="meta", dtype=cast)
        return meta.requires_grad_(value.requires_grad) if meta.is_floating_point() else meta

    return convert


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
    convert = _to_meta(torch_dtype)
    params = {
        name: nn.Parameter(convert(p.detach()), requires_grad=p.requires_grad)
        for name, p in model.named_parameters(remove_duplicate=False)
    }
    tensors: dict[str, torch.Tensor] = {**params}
    tensors.update({name: convert(b) for name, b in model.named_buffers(remove_duplicate=False)})
    names = {id(m): name or type(m).__name__ for name, m in model.named_modules()}
    inputs = tree_map(convert, example_input)
    input_keys = {_storage_key(t) for t in tree_flatten(inputs)[0] if isinstance(t, torch.Tensor)}
    recorder = _Recorder(names, {_storage_key(t) for t in params.values()} | input_keys)
    args, kwargs = (
        ((), inputs)
        if isinstance(inputs, dict)
        else (
            (tuple(inputs) if isinstance(inputs, tuple | list) else (inputs,)),
            {},
        )
    )
    hooks = torch.autograd.graph.saved_tensors_hooks(recorder.pack, lambda t: t)
    sdpa = _sdpa_as_on_device(device=device, training=training)
    with _training_flags(model, training=training), _module_hooks(recorder), hooks, sdpa:
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
_ONEDNN_SCRATCHPAD = 24 * 1024
_CONVS = {"Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d"}


def _backward_transient(record: LayerRecord, device: str) -> int:
    """Bytes a layer's backward holds beyond what is saved: gradients and scratch.

    The output gradient, the input gradient (only when the input requires grad), and for
    convolutions the kernel's own scratch, which no dispatch-level tracker sees. Measured
    on CPU (torch 2.13, x86 with AVX-512), single convolutions of 3-64 channels: oneDNN
    reorders the output gradient into a blocked layout padded to 16 channels, and the
    input into one padded to 8 (to 16 below 8 channels; not at all for a k>1 first layer
    of fewer than 8 channels): one output and one input more at 32 channels (FACTS.md),
    4x the output at 4 channels. ATen's im2col path (``slow_conv2d``) instead unfolds the
    input into (C_in/groups)·k·k·H_out·W_out columns.
    On CUDA, cuDNN's workspace depends on the algorithm; the oneDNN allowance is used.
    """
    grads = record.output_bytes + (record.input_bytes if record.input_requires_grad else 0)
    if record.kind not in _CONVS:
        return grads
    if device == "cpu" and _uses_im2col(record):
        columns = 0
        if math.prod(record.kernel) > 1:
            # one sample (the path is only taken for batch 1): C_in/g * k*k * H_out*W_out
            positions = record.output_bytes // max(1, record.out_channels)
            columns = record.input_shape[1] // record.groups * math.prod(record.kernel) * positions
        return grads + columns
    c_in = record.input_shape[1] if len(record.input_shape) > 1 else 1
    output = _blocked(record.output_bytes, record.out_channels, 16) + _ONEDNN_SCRATCHPAD
    if c_in < 8 and math.prod(record.kernel) > 1:
        return grads + output  # a first layer (RGB): oneDNN reads the plain input
    return grads + output + _blocked(record.input_bytes, c_in, 16 if c_in < 8 else 8)


def _blocked(nbytes: int, channels: int, block: int) -> int:
    """Bytes of a oneDNN blocked copy (nChw16c / nChw8c): channels padded to ``block``."""
    if channels <= 0:
        return nbytes
    return nbytes * (-(-channels // block) * block) // channels


def _kernel(module: nn.Module) -> tuple[int, ...]:
    size = getattr(module, "kernel_size", ())
    return tuple(size) if isinstance(size, tuple | list) else (int(size),) if size else ()


def _uses_im2col(record: LayerRecord) -> bool:
    """ATen's CPU backend choice (``use_mkldnn`` in ConvUtils.h), for float convolutions.

    oneDNN runs with more than one thread unless the input is a single small sample
    with a kernel of at most 3x3 and no groups; that case takes the im2col path.
    """
    shape = record.input_shape
    if len(shape) != 4 or not record.kernel:
        return False
    big_kernel = all(k > 3 for k in record.kernel)
    return not (record.groups > 1 or big_kernel or shape[0] > 1 or math.prod(shape) > 20480)


class _LiveBytes(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts the bytes of storages created under it while they live, and their peak.

    Storages are Python objects with a lifetime tied to the tensor data (PyObject
    preservation), so a weakref finalizer sees each free, also on the meta device.
    """

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.live = 0
        self.peak = 0
        self._seen: weakref.WeakSet[torch.UntypedStorage] = weakref.WeakSet()

    def exclude(self, tensors: object) -> None:
        """Storages that exist already (parameters, inputs): their views cost nothing."""
        for leaf in tree_flatten(tensors)[0]:
            if isinstance(leaf, torch.Tensor):
                self._seen.add(leaf.untyped_storage())

    def _free(self, nbytes: int) -> None:
        self.live -= nbytes

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        for leaf in tree_flatten(out)[0]:
            if isinstance(leaf, torch.Tensor):
                storage = leaf.untyped_storage()
                if storage not in self._seen:
                    self._seen.add(storage)
                    nbytes = storage.nbytes()
                    self.live += nbytes
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(storage, self._free, nbytes)
        return out


def inference_peak(
    model: nn.Module,
    example_input: object,
    *,
    dtype: str | DType | None = None,
    device: str = "cuda",
) -> int:
    """Peak bytes of tensors alive at once during a no-grad forward, on the meta device.

    The input and the parameters are not counted (they exist before the call); the
    output is (it is alive when the forward returns).
    """
    check_materialized(model, what="the estimate")
    torch_dtype = None if dtype is None else parse_dtype(dtype).torch_dtype
    convert = _to_meta(torch_dtype)
    tensors = {n: convert(p.detach()) for n, p in model.named_parameters(remove_duplicate=False)}
    tensors.update({n: convert(b) for n, b in model.named_buffers(remove_duplicate=False)})
    inputs = tree_map(convert, example_input)
    args, kwargs = (
        ((), inputs)
        if isinstance(inputs, dict)
        else (
            (tuple(inputs) if isinstance(inputs, tuple | list) else (inputs,)),
            {},
        )
    )
    counter = _LiveBytes()
    counter.exclude((tensors, inputs))
    sdpa = _sdpa_as_on_device(device=device, training=False)
    with _training_flags(model, training=False), torch.no_grad(), sdpa, counter:
        output = torch.func.functional_call(model, tensors, args, kwargs, strict=False)
        del output
    return counter.peak


def estimate_module(
    model: nn.Module,
    *,
    batch_size: int,
    input_shape: tuple[int, ...],
    dtype: str | DType = "fp32",
    mode: str = "train",
    optimizer: str | OptimizerName | None = "adamw",
    mixed_precision: bool | None = None,
    device: str = "cuda",
) -> MemoryEstimate:
    """`estimate` for any ``nn.Module`` taking one float tensor of ``(batch, *input_shape)``.

    Training peak: a backward sweep over the layers in reverse order. At layer k, the
    saved tensors of layers before k are still alive, the gradients of the layers after
    k exist, and the layer holds its output gradient and its new input gradient; the
    optimizer step holds all gradients plus its temporaries.
    """
    compute = parse_dtype(dtype)
    step = parse_mode(mode)
    training = step is Mode.TRAIN
    mixed = training and compute.bits == 16 if mixed_precision is None else mixed_precision
    example = torch.empty((batch_size, *input_shape), device="meta")
    report = activation_bytes(model, example, dtype=compute, training=training, device=device)
    params = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    states = model_state_bytes(
        params=params,
        trainable=trainable,
        dtype=compute,
        mixed_precision=mixed,
        optimizer=parse_optimizer(optimizer) if training else None,
        training=training,
        num_tensors=sum(1 for p in model.parameters() if p.requires_grad),
    )
    inputs = report.input_bytes
    if not training:
        return MemoryEstimate(
            weights=states.weights,
            activations=inference_peak(model, example, dtype=compute, device=device),
            overhead=inputs,
            device=device,
            notes=(states.note, "inference: peak of live tensors in a meta-device forward"),
            peak_at="forward",
        )
    remaining = report.total
    grads = 0
    scale = FP32 / compute.itemsize if mixed else 1.0
    best = (remaining + report.output_bytes, grads, "start of backward")
    for record in reversed(report.records):
        transient = _backward_transient(record, device)
        live = remaining + grads + transient
        if live > best[0] + best[1]:
            best = (remaining + transient, grads, record.name)
        remaining -= record.saved
        grads += math.ceil(record.param_bytes * scale)
    largest = max((p.numel() for p in model.parameters()), default=0) * FP32
    step_temp = 0
    if parse_optimizer(optimizer) in {OptimizerName.ADAM, OptimizerName.ADAMW}:
        step_temp = states.gradients if device == "cuda" else 2 * largest
    if states.gradients + step_temp > best[0] + best[1]:
        best = (0, states.gradients, "optimizer step")
        workspace = step_temp
    else:
        workspace = 0
    activations, gradients, where = best
    return MemoryEstimate(
        weights=states.weights,
        gradients=gradients,
        optimizer=states.optimizer,
        activations=activations,
        workspace=workspace,
        overhead=inputs + states.autocast_copies,
        device=device,
        notes=(states.note, "activations from a meta-device pass (saved_tensors_hooks)"),
        layers=report.layers,
        peak_at=where,
    )
