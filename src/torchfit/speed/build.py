"""The module a step runs, built on the meta device, and the batch it runs on.

Whatever names the model goes through `torchfit.memory`'s one resolver. A transformers
language model is built from its config by its own class (causal LM for decoders,
masked LM for BERT-style encoders) with the attention implementation asked for; an
image model or any ``nn.Module`` takes images of ``input_shape`` and, when it returns
class scores, the cross-entropy loss of `torchfit.memory.measure_step`'s image recipes.
LoRA adapters are PEFT's own layers on the meta model, so what trains and what autograd
keeps is exactly what PEFT does.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from torchfit._core.imports import require
from torchfit.memory.catalog.build import checkpointing_on
from torchfit.memory.catalog.resolve import (
    build_model,
    is_vision,
    resolve_model,
    vision_input_shape,
)

__all__ = ["Built", "build_step_model"]

#: The attention names `estimate` takes -> transformers' ``attn_implementation``.
#: "flash" is FlashAttention-2, the kernel SDPA itself runs for 16-bit inputs on CUDA.
_ATTENTION = {"sdpa": "sdpa", "eager": "eager", "flash": "sdpa"}
_ENCODERS = frozenset({"bert", "roberta", "xlm-roberta", "camembert", "distilbert"})


@dataclasses.dataclass
class Built:
    """A model on the meta device with the inputs and loss of its step.

    Attributes:
        module: The model (PEFT-wrapped when adapters train).
        inputs: A tensor, tuple or dict for ``module(...)``.
        loss_fn: ``loss_fn(output) -> loss`` for models without ``output.loss``.
        tokens: Tokens per sample (language models), else None.
        config: The transformers config, or None for a plain module.
        name: What to call the model in tables.
        causal: For a transformers language model: whether its attention is causal
            (a decoder) or not (an encoder); None for other models. The batch has no
            padding, so the mask transformers builds is only this.
    """

    module: nn.Module
    inputs: Any
    loss_fn: Callable[[Any], torch.Tensor] | None
    tokens: int | None
    config: Any
    name: str
    causal: bool | None = None


def _name(model: Any, config: Any, module: nn.Module | None) -> str:
    if isinstance(model, str):
        return model
    if config is not None:
        return str(getattr(config, "name_or_path", "") or config.model_type)
    return type(module).__name__


def _classification_loss(output: Any) -> torch.Tensor:
    """Cross-entropy against class 0 when the output is ``(batch, classes)``, else a sum."""
    logits = getattr(output, "logits", output)
    if isinstance(logits, torch.Tensor) and logits.dim() == 2 and logits.is_floating_point():
        labels = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
        return F.cross_entropy(logits, labels)
    if isinstance(logits, torch.Tensor):
        return logits.float().sum()
    raise ValueError(
        f"cannot make a loss from a model output of type {type(output).__name__}; "
        "time the step with a model that returns a tensor or an object with .logits/.loss"
    )


def _language_model(config: Any, dtype: torch.dtype, attention: str) -> nn.Module:
    transformers = require("transformers", feature="timing a transformers model")
    config = copy.deepcopy(config)
    config._attn_implementation = _ATTENTION[attention]  # noqa: SLF001 - transformers' own knob
    if getattr(config, "model_type", "") in _ENCODERS:
        classes = [transformers.AutoModelForMaskedLM]
    else:
        classes = [transformers.AutoModelForCausalLM, transformers.AutoModel]
    last: Exception | None = None
    for cls in classes:
        try:
            with torch.device("meta"):
                built = cls.from_config(config, dtype=dtype)
        except ValueError as e:  # this Auto class has no mapping for the config
            last = e
            continue
        if cls is transformers.AutoModelForCausalLM and getattr(built, "loss_type", "") is None:
            # transformers 5 falls back to ForCausalLM for a class whose name does not say
            # it (GPT2LMHeadModel) and logs "loss_type=None ... unrecognized" on the way;
            # naming the same loss on a model torchfit built keeps that line off the screen
            built.loss_type = "ForCausalLM"
        return built  # type: ignore[no-any-return]
    raise ValueError(
        f"transformers cannot build model_type {config.model_type!r} as a language model: "
        f"{last}; pass the nn.Module itself with input_shape="
    ) from last


def build_step_model(
    model: Any,
    *,
    batch_size: int,
    seq_len: int | None,
    input_shape: tuple[int, ...] | None,
    dtype: torch.dtype,
    attention: str,
    train: bool,
    checkpointing: bool,
    channels_last: bool = False,
) -> Built:
    """Build ``model`` on meta in ``dtype`` with its step's batch (see the module notes).

    ``channels_last`` puts an image model's 4-D weights and its images in
    ``torch.channels_last`` (NHWC) memory format, as ``model.to(memory_format=...)`` does.

    Raises:
        ValueError: a token model given ``input_shape``, a module without one, or a
            sequence longer than the model's positions.
    """
    resolved = resolve_model(model)
    config = resolved.config
    if config is not None and not is_vision(config):
        if input_shape is not None:
            raise ValueError(
                f"input_shape={input_shape!r} is the shape of one image, but model_type "
                f"{config.model_type!r} takes tokens; give seq_len= instead"
            )
        limit = getattr(config, "max_position_embeddings", None) or getattr(
            config, "n_positions", None
        )
        seq = int(seq_len or limit or 0)
        if seq < 1:
            raise ValueError("seq_len= is needed: the config records no maximum length")
        if limit is not None and seq > limit:
            raise ValueError(
                f"seq_len={seq} is beyond the model's {limit} positions; pass seq_len<={limit}"
            )
        module = _language_model(config, dtype, attention)
        if train and hasattr(module, "config"):
            module.config.use_cache = False  # type: ignore[union-attr]
        if checkpointing:
            checkpointing_on(module)
        ids = torch.zeros(batch_size, seq, dtype=torch.long, device="meta")
        inputs: Any = {"input_ids": ids, "labels": ids} if train else {"input_ids": ids}
        causal = getattr(config, "model_type", "") not in _ENCODERS
        return Built(module, inputs, None, seq, config, _name(model, config, None), causal)
    module, shape, name = _image_model(
        model, config, resolved, dtype=dtype, input_shape=input_shape, checkpointing=checkpointing
    )
    images = torch.zeros(batch_size, *shape, dtype=dtype, device="meta")
    if channels_last and images.dim() == 4:  # on a copy: named models are cached, shared
        module = copy.deepcopy(module).to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        images = images.contiguous(memory_format=torch.channels_last)
    return Built(module, images, _classification_loss, None, config, name)


def _image_model(
    model: Any,
    config: Any,
    resolved: Any,
    *,
    dtype: torch.dtype,
    input_shape: tuple[int, ...] | None,
    checkpointing: bool,
) -> tuple[nn.Module, tuple[int, ...], str]:
    """An image model (or any module) on meta, one sample's shape, and its name."""
    if config is not None:  # an image model of transformers
        return (
            build_model(config, device="meta", dtype=dtype),
            input_shape or vision_input_shape(config),
            _name(model, config, None),
        )
    if resolved.module is None:
        raise TypeError(f"cannot build a module from {type(model).__name__}")
    shape = input_shape or resolved.input_shape
    if shape is None:
        raise ValueError("an nn.Module needs input_shape=(...) of one sample, e.g. (3, 224, 224)")
    if checkpointing:
        raise ValueError(
            "gradient_checkpointing=True is modelled for transformers language models; "
            "for your own module, apply torch.utils.checkpoint in it and leave this False"
        )
    return resolved.module.to(dtype), tuple(shape), _name(model, None, resolved.module)
