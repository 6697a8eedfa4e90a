"""What a model already built says about its step: PEFT's adapters, bitsandbytes' loading.

A ``PeftModel`` (or a transformers model with adapters injected) carries its
``LoraConfig`` in ``peft_config``; a model loaded with a ``BitsAndBytesConfig`` keeps it
as ``config.quantization_config``; and the frozen base's parameters have the dtype it was
loaded in, fp32 for the parts ``prepare_model_for_kbit_training`` cast. Estimated from its
config alone, such a model would be a full fine-tune of a 16-bit model: these are read
as the `Step` fields they mean (``lora``, ``quantization``, ``base_dtype``,
``kbit_prepare``), and a field the caller gives must agree (`merge_fields`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from torchfit._bnb.config import read_bitsandbytes_config
from torchfit.memory.step.description import Step
from torchfit.memory.step.fields import FieldsRead, StepFields, merge_fields

__all__ = ["built_fields", "with_built"]

_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def built_fields(model: Any) -> StepFields | None:
    """The step fields ``model`` itself says, or ``None`` when it says none.

    Raises:
        ValueError: PEFT adapters other than LoRA (the closed form has no such layers).

    Example:
        >>> from torch import nn
        >>> built_fields(nn.Linear(2, 2)) is None
        True
    """
    if not isinstance(model, nn.Module):
        return None
    read = FieldsRead()
    adapters = getattr(model, "peft_config", None)
    lora = None
    if isinstance(adapters, Mapping) and adapters:
        active = getattr(model, "active_adapter", None)
        name = active if isinstance(active, str) and active in adapters else next(iter(adapters))
        lora = adapters[name]
        if type(lora).__name__ != "LoraConfig":
            raise ValueError(
                f"the model carries PEFT {type(lora).__name__} adapters ({name!r}); torchfit "
                "models LoRA: trace this model instead (torchfit.memory.trace)"
            )
        read.set(f"its peft_config[{name!r}]", lora=lora)
    quantization = _bitsandbytes_config(model)
    if quantization is not None:
        read.set("its config.quantization_config", quantization=quantization)
    if lora is not None:
        embedding = _input_embedding(model)
        if quantization is not None and embedding is not None:
            prepared = embedding.dtype == torch.float32
            read.set(f"its embedding in {_DTYPES.get(embedding.dtype)}", kbit_prepare=prepared)
        elif quantization is None:
            frozen = _frozen_weight_dtype(model)
            if frozen in (torch.bfloat16, torch.float16):
                read.set(f"its frozen weights in {_DTYPES[frozen]}", base_dtype=_DTYPES[frozen])
    if not read.fields:
        return None
    return read.done(f"{type(model).__name__} given as the model")


def with_built(model: Any, step: Step | None, keywords: dict[str, Any]) -> dict[str, Any] | None:
    """`Step.of` keywords of ``step`` (or ``keywords``) with what ``model`` says read in.

    ``None`` when the model says nothing. A `Step` given whole counts each field it
    changes from `Step`'s default as given.

    Raises:
        ValueError: a given field that contradicts the model (both named).
    """
    read = built_fields(model)
    if read is None:
        return None
    given = keywords if step is None else _changed(step)
    merged = merge_fields(read if step is None else _native(read), given)
    if str(merged.get("mode", "train")).strip().lower() == "inference":
        # how a base trains (its fp32 casts, the dtype beside autocast) is training's
        for name in ("base_dtype", "kbit_prepare"):
            if name not in given:
                merged.pop(name, None)
    return merged


def _native(read: StepFields) -> StepFields:
    """``read`` with its ``BitsAndBytesConfig`` as the `Step` fields it sets.

    What a whole `Step` holds instead (``quantization``, ``double_quant``,
    ``quantize_head``), so that the two compare.
    """
    config = read.fields.get("quantization")
    if config is None or isinstance(config, str):
        return read
    found = read_bitsandbytes_config(config)
    where = read.read_from["quantization"]
    fields = {
        "quantization": found.weights.value,
        "double_quant": found.double_quant,
        "quantize_head": found.quantize_head,
    }
    return dataclasses.replace(
        read,
        fields={**read.fields, **fields},
        read_from={**read.read_from, **dict.fromkeys(fields, where)},
    )


def _changed(step: Step) -> dict[str, Any]:
    """The fields of ``step`` that differ from `Step`'s defaults."""
    default = Step()
    return {
        f.name: getattr(step, f.name)
        for f in dataclasses.fields(Step)
        if getattr(step, f.name) != getattr(default, f.name)
    }


def _bitsandbytes_config(model: nn.Module) -> Any:
    """The ``BitsAndBytesConfig`` (or its dict) the model was loaded with, if any.

    Raises:
        ValueError: another quantization (GPTQ, AWQ, ...): read as 16 bits it would be
            silently wrong.
    """
    config = getattr(model, "config", None)
    found = getattr(config, "quantization_config", None)
    if found is None:
        return None
    method = found.get("quant_method") if isinstance(found, Mapping) else found.quant_method
    method = str(getattr(method, "value", method))
    if "bitsandbytes" not in method:
        raise ValueError(
            f"the model is quantized with {method!r} (its config.quantization_config); "
            "torchfit models bitsandbytes' layout: pass its config with dtype='int4' for a "
            "4-bit estimate of the weights, or trace the loaded model (torchfit.memory.trace)"
        )
    return found


def _input_embedding(model: nn.Module) -> torch.Tensor | None:
    get = getattr(model, "get_input_embeddings", None)
    embedding = get() if callable(get) else None
    return getattr(embedding, "weight", None)


def _frozen_weight_dtype(model: nn.Module) -> torch.dtype | None:
    """The dtype of the first frozen Linear weight outside the adapters."""
    for name, module in model.named_modules():
        if type(module) is nn.Linear and "lora_" not in name and not module.weight.requires_grad:
            return module.weight.dtype
    return None
