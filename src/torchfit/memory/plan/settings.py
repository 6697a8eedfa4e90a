"""What a plan was asked for (`Settings`), and what the model tells about its own input."""

from __future__ import annotations

import dataclasses
from typing import Any

from torchfit._core.units import parse_dtype

__all__ = [
    "Settings",
    "config_of",
    "default_seq_len",
    "default_sequence",
    "max_positions",
    "transformer_spec",
]


@dataclasses.dataclass(frozen=True)
class Settings:
    """What was planned: the arguments of one estimate."""

    model: str
    mode: str
    dtype: str
    batch_size: int
    seq_len: int | None
    input_shape: tuple[int, ...] | None
    optimizer: str
    gradient_checkpointing: bool
    attn_implementation: str
    trainable_params: int | None = None
    strategy: str | None = None
    world_size: int = 1
    offload_optimizer: bool = False
    offload_params: bool = False
    param_dtype: str | None = None
    gpus_per_node: int | None = None
    precision: str | None = None
    gradient_accumulation_steps: int = 1
    set_to_none: bool = True
    keep_output: bool = False
    optimizer_in_backward: bool = False
    cuda_version: str | None = None
    context_bytes: int | None = None
    loss_chunk_size: int | None = None
    max_new_tokens: int | None = None
    lora_rank: int | None = None
    lora_targets: tuple[str, ...] | None = None
    lora_dropout: float | None = None
    bitsandbytes_version: str | None = None
    double_quant: bool = True
    quantize_head: bool = False
    base_dtype: str | None = None

    def device(self) -> dict[str, Any]:
        """The keyword arguments of `to_device` these settings stand for."""
        return {"cuda_version": self.cuda_version, "context_bytes": self.context_bytes}

    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments of `estimate` these settings stand for."""
        return {
            "precision": self.precision,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "set_to_none": self.set_to_none,
            "keep_output": self.keep_output,
            "optimizer_in_backward": self.optimizer_in_backward,
            "loss_chunk_size": self.loss_chunk_size,
            "max_new_tokens": self.max_new_tokens,
            "lora_rank": self.lora_rank,
            "lora_targets": self.lora_targets,
            "lora_dropout": self.lora_dropout,
            "bitsandbytes_version": self.bitsandbytes_version,
            "double_quant": self.double_quant,
            "quantize_head": self.quantize_head,
            "base_dtype": self.base_dtype,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "input_shape": self.input_shape,
            # with a precision, a float dtype is the one it computes in: precision says it
            "dtype": None
            if self.precision and not parse_dtype(self.dtype).is_quantized
            else self.dtype,
            "mode": self.mode,
            "optimizer": None if self.optimizer == "none" else self.optimizer,
            "gradient_checkpointing": self.gradient_checkpointing,
            "attn_implementation": self.attn_implementation,
            "trainable_params": self.trainable_params,
        }


def config_of(model: Any) -> Any:
    """The transformers config behind ``model``, or None for a plain ``nn.Module``."""
    from torchfit.memory.catalog.resolve import resolve_model  # noqa: PLC0415

    return resolve_model(model).config


def transformer_spec(model: Any) -> Any:
    """The closed-form description of a text transformer; None for any other model."""
    from torchfit.memory.analytic.arch import describe, has_closed_form  # noqa: PLC0415
    from torchfit.memory.catalog.resolve import is_vision  # noqa: PLC0415

    config = config_of(model)
    if config is None or is_vision(config) or not has_closed_form(config):
        return None
    return describe(config)


def default_seq_len(model: Any, settings: Settings) -> Settings:
    """Fill in what one sample is: the model's longest sequence, or its image."""
    from torchfit.memory.catalog.resolve import (  # noqa: PLC0415
        is_vision,
        resolve_model,
        vision_input_shape,
    )

    resolved = resolve_model(model)
    config = resolved.config
    if config is None:
        if resolved.input_shape is None:
            raise ValueError(
                "an nn.Module needs input_shape=(...) of one sample, e.g. (3, 224, 224)"
            )
        return dataclasses.replace(settings, input_shape=resolved.input_shape)
    if is_vision(config):
        return dataclasses.replace(settings, input_shape=vision_input_shape(config))
    return dataclasses.replace(settings, seq_len=default_sequence(config)[0])


def default_sequence(config: Any) -> tuple[int, str]:
    """The sequence planned when none is given, and what it is in words.

    Example:
        >>> from transformers import GPT2Config, T5Config
        >>> default_sequence(GPT2Config())
        (1024, "the model's maximum")
        >>> default_sequence(T5Config())[1]
        'the length T5 was pre-trained with (its config sets no maximum)'
    """
    from torchfit.memory.catalog.inputs import DEFAULT_SEQUENCE, sequence_limit  # noqa: PLC0415

    limit = sequence_limit(config)
    if limit:
        return limit, "the model's maximum"
    return DEFAULT_SEQUENCE, "the length T5 was pre-trained with (its config sets no maximum)"


def max_positions(model: Any, settings: Settings) -> int:
    """The longest sequence the model takes (the planned one when it sets no limit)."""
    from torchfit.memory.catalog.inputs import sequence_limit  # noqa: PLC0415

    config = config_of(model)
    limit = None if config is None else sequence_limit(config)
    return limit or settings.seq_len or 1
