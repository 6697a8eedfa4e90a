"""Running a module's forward on the meta device as the target device would run it."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_leaves

from torchfit.memory.analytic.formulas import sdpa_is_flash

__all__ = [
    "autograd_label",
    "label_graph",
    "sdpa_as_on_device",
    "split_inputs",
    "to_meta",
    "training_flags",
    "twins",
]

#: Key under which a layer name is stored in an autograd node's metadata.
_NODE_KEY = "torchfit.layer"


def split_inputs(inputs: object) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Positional and keyword arguments from an example input: a dict is keywords."""
    if isinstance(inputs, dict):
        return (), inputs
    return (tuple(inputs) if isinstance(inputs, tuple | list) else (inputs,)), {}


@contextmanager
def training_flags(model: nn.Module, *, training: bool) -> Iterator[None]:
    """Put ``model`` in train or eval mode; restore every module's own flag on exit."""
    flags = {m: m.training for m in model.modules()}
    model.train(training)
    try:
        yield
    finally:
        for module, flag in flags.items():
            module.training = flag


@contextmanager
def sdpa_as_on_device(*, device: str, training: bool) -> Iterator[None]:
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
        grouped = enable_gqa and key.shape[-3] != query.shape[-3]
        flash = sdpa_is_flash(
            device=device,
            training=training,
            dropout=dropout_p,
            fp32_grouped=grouped and query.dtype == torch.float32,
        )
        # heads broadcast without enable_gqa (Falcon's multi-query keys), or values of
        # another width than the queries (DeepSeek's latent attention): the CPU flash
        # kernel takes neither and the math path runs (measured on CPU: the probabilities
        # are saved); its meta kernel would give the output the queries' width
        broadcast = not enable_gqa and key.shape[-3] != query.shape[-3]
        broadcast |= value.shape[-1] != query.shape[-1]
        if not flash or broadcast or query.device.type != "meta":
            return original(
                query,
                key,
                value,
                attn_mask,
                dropout_p,
                is_causal,
                scale=scale,
                enable_gqa=enable_gqa,
            )
        if enable_gqa and key.shape[-3] != query.shape[-3]:
            repeat = query.shape[-3] // key.shape[-3]
            key = key.repeat_interleave(repeat, dim=-3)
            value = value.repeat_interleave(repeat, dim=-3)
        if attn_mask is not None and attn_mask.requires_grad:
            # a learned bias (T5's relative positions): the fused kernels take it and give
            # its gradient; the CPU flash op stands in for them, so it gets the values only
            attn_mask = attn_mask.detach()
        out: torch.Tensor = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(  # noqa: SLF001
            query, key, value, 0.0, is_causal, attn_mask=attn_mask, scale=scale
        )[0]
        return out

    functional.scaled_dot_product_attention = routed
    try:
        yield
    finally:
        functional.scaled_dot_product_attention = original


@contextmanager
def twins(dtype: torch.dtype | None, *, device: str) -> Iterator[Callable[[Any], Any]]:
    """Run a pass as on ``device``: yield a converter to data-free twins of tensors.

    For ``"cpu"`` the twins are fake CPU tensors (``FakeTensorMode``, active inside): ATen's
    composite ops then take their CPU branches (``group_norm`` keeps a channels-last input
    channels-last on CPU and copies it to the plain layout on any other device,
    ``aten/src/ATen/native/group_norm.cpp``), and convolutions pick their CPU backend and
    output layout, as in the real step. Otherwise they are meta tensors (`to_meta`).
    Either way nothing is allocated.

    Example:
        >>> with twins(torch.bfloat16, device="cpu") as convert:
        ...     x = convert(torch.ones(2, 3).t())
        ...     (x * 2).device.type, x.dtype, x.stride()
        ('cpu', torch.bfloat16, (1, 3))
    """
    if device != "cpu":
        yield to_meta(dtype)
        return
    mode = FakeTensorMode(allow_non_fake_inputs=True)

    def convert(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        cast = dtype if dtype is not None and value.is_floating_point() else value.dtype
        with mode:
            fake = torch.empty_strided(
                tuple(value.shape), tuple(value.stride()), dtype=cast, device="cpu"
            )
        return fake.requires_grad_(value.requires_grad) if fake.is_floating_point() else fake

    with mode:
        yield convert


def to_meta(dtype: torch.dtype | None) -> Callable[[Any], Any]:
    """A converter from a tensor to its meta twin (floating ones cast to ``dtype``)."""

    def convert(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        cast = dtype if dtype is not None and value.is_floating_point() else value.dtype
        meta = torch.empty_like(value, device="meta", dtype=cast)
        return meta.requires_grad_(value.requires_grad) if meta.is_floating_point() else meta

    return convert


def _tensors(output: object) -> list[torch.Tensor]:
    """Tensors in a module output: pytree leaves, and the values of mapping-like outputs."""
    if isinstance(output, Mapping):
        return [leaf for value in output.values() for leaf in _tensors(value)]
    return [leaf for leaf in tree_leaves(output) if isinstance(leaf, torch.Tensor)]


def label_graph(output: object, name: str) -> None:
    """Label the autograd nodes behind ``output`` with ``name``, up to labelled ones.

    Called when a module's forward returns (and, with its caller's name, when one starts),
    it gives each node the innermost module that created it: inner modules label first.

    Example:
        >>> x = torch.ones(2, requires_grad=True)
        >>> y = (x * 2).sum()
        >>> label_graph(y, "head")
        >>> nodes = [y.grad_fn, y.grad_fn.next_functions[0][0]]
        >>> [node.name() + ": " + node.metadata["torchfit.layer"] for node in nodes]
        ['SumBackward0: head', 'MulBackward0: head']
    """
    stack = [t.grad_fn for t in _tensors(output) if t.grad_fn is not None]
    while stack:
        node = stack.pop()
        metadata = _metadata(node)
        if _NODE_KEY in metadata:
            continue
        metadata[_NODE_KEY] = name
        stack.extend(following for following, _ in node.next_functions if following is not None)


def autograd_label(default: str) -> str:
    """The layer name of the autograd node running now (`label_graph`), else ``default``."""
    node = torch._C._current_autograd_node()  # noqa: SLF001 - no public equivalent
    if node is None:
        return default
    return str(_metadata(node).get(_NODE_KEY, default))


def _metadata(node: Any) -> dict[str, object]:
    """An autograd node's metadata dict (a property at runtime; a method in the stubs)."""
    metadata: dict[str, object] = node.metadata
    return metadata
