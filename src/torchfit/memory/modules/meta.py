"""Running a module's forward on the meta device as the target device would run it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from torchfit.memory.analytic.formulas import sdpa_is_flash

__all__ = ["sdpa_as_on_device", "split_inputs", "to_meta", "training_flags"]


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
        flash = sdpa_is_flash(device=device, training=training, dropout=dropout_p)
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


def to_meta(dtype: torch.dtype | None) -> Callable[[Any], Any]:
    """A converter from a tensor to its meta twin (floating ones cast to ``dtype``)."""

    def convert(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        cast = dtype if dtype is not None and value.is_floating_point() else value.dtype
        meta = torch.empty_like(value, device="meta", dtype=cast)
        return meta.requires_grad_(value.requires_grad) if meta.is_floating_point() else meta

    return convert
