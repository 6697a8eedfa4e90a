"""Gradient checkpointing on a meta-device pass: each block keeps its input, one recomputes.

transformers checkpoints its decoder layers (``GradientCheckpointingLayer``,
transformers/modeling_layers.py: ``gradient_checkpointing_enable()`` wraps each one's
call in ``torch.utils.checkpoint``): a checkpointed layer saves its input hidden states
in forward instead of its own saved tensors, and backward recomputes one layer at a
time, whose saved tensors live while its backward runs. A pass without checkpointing
gives every module's saved tensors (`torchfit.memory.result.LayerMemory`); this turns
them into the checkpointed step's: what is saved outside the layers, plus one input per
layer, plus the largest layer's saved tensors.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from torchfit.memory.result import LayerMemory, MemoryEstimate

__all__ = ["checkpointed_layers", "layer_input_bytes", "with_checkpointing"]


def checkpointed_layers(model: nn.Module) -> list[str]:
    """Names of the modules ``gradient_checkpointing_enable()`` checkpoints, in order.

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> import torch
        >>> with torch.device("meta"):
        ...     m = LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, hidden_size=64,
        ...         intermediate_size=128, num_attention_heads=4, vocab_size=100))
        >>> checkpointed_layers(m)
        ['model.layers.0', 'model.layers.1']
    """
    from transformers.modeling_layers import GradientCheckpointingLayer  # noqa: PLC0415

    return [name for name, m in model.named_modules() if isinstance(m, GradientCheckpointingLayer)]


@contextlib.contextmanager
def layer_input_bytes(model: nn.Module, layer: str) -> Iterator[list[int]]:
    """Within it, ``[elements, bytes per element]`` of the hidden states ``layer`` gets.

    Filled once ``layer`` is called: the pass's own stream, in the pass's dtype.
    """
    seen: list[int] = []

    def record(_: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        hidden = args[0] if args else kwargs.get("hidden_states")
        if not seen and isinstance(hidden, torch.Tensor):
            seen.extend((hidden.numel(), hidden.element_size()))

    handle = model.get_submodule(layer).register_forward_pre_hook(record, with_kwargs=True)
    try:
        yield seen
    finally:
        handle.remove()


def with_checkpointing(
    found: MemoryEstimate, layers: list[str], *, input_bytes: int
) -> MemoryEstimate:
    """``found`` (a pass's start of backward) as a checkpointed step holds it.

    Two moments: the start of backward (what is saved outside the layers, the layers'
    inputs, ``found``'s workspace: the loss's gradients) and the backward of the layer
    with the most saved tensors, recomputed (what was saved before the layers, the
    inputs, that layer's tensors: the head's and the loss's are freed by then). The
    larger is returned.

    Args:
        found: A pass's estimate without checkpointing, its ``layers`` the saved tensors
            of each module in the order they ran.
        layers: The checkpointed modules (`checkpointed_layers`).
        input_bytes: Bytes of one layer's input hidden states (what each one keeps).

    Example:
        >>> rows = (LayerMemory("embed", "Embedding", 10), LayerMemory("layers.0.mlp", "MLP", 100),
        ...         LayerMemory("layers.1.mlp", "MLP", 120), LayerMemory("head", "Linear", 30))
        >>> done = with_checkpointing(MemoryEstimate(activations=260, layers=rows),
        ...                           ["layers.0", "layers.1"], input_bytes=8)
        >>> done.activations  # before the layers (10) + 2 inputs of 8 + the largest layer's
        146
    """
    if not layers:
        raise ValueError(
            "gradient_checkpointing=True, but this model has no layer transformers "
            "checkpoints (GradientCheckpointingLayer); leave gradient_checkpointing out, or "
            "trace the real step (torchfit.memory.trace)"
        )
    inside = dict.fromkeys(layers, 0)
    before: list[LayerMemory] = []
    after: list[LayerMemory] = []
    for row in found.layers:
        owner = next((n for n in layers if row.name == n or row.name.startswith(n + ".")), None)
        if owner is not None:
            inside[owner] += row.activations
        else:
            (after if any(inside.values()) else before).append(row)
    largest = max(inside, key=inside.__getitem__)
    inputs = len(layers) * input_bytes
    kept = LayerMemory(
        "checkpointed layers", "inputs", inputs, f"{len(layers)} x {input_bytes:,} B"
    )
    outside = max(0, found.activations - sum(inside.values()))
    start = found.replace(activations=outside + inputs, layers=(*before, kept, *after))
    early = sum(row.activations for row in before)
    recomputed = found.replace(
        activations=early + inputs + inside[largest],
        workspace=0,
        layers=(*before, kept, LayerMemory(largest, "recomputed in backward", inside[largest])),
        peak_at=f"backward of {largest} (recomputed)",
    )
    chosen = max(start, recomputed, key=lambda moment: moment.total)
    note = (
        f"gradient checkpointing: {len(layers)} layers keep their inputs "
        f"({math.ceil(inputs / 2**20):,} MiB), one at a time recomputed in backward"
    )
    return chosen.replace(notes=(*found.notes, note))
