"""`recipe_fields`: the `Step` fields of a torchtune or LitGPT fine-tuning config.

Both projects describe a run in a YAML file (torchtune's ``recipes/configs``, copied with
``tune cp``; LitGPT's ``config_hub/finetune``, passed with ``--config``), and their
defaults differ from the Hugging Face Trainer's: the model trained in bf16 without
autocast, the loss taken in chunks, a 4-bit base that keeps its embeddings and norms
16-bit. Read from their code (torchtune at bd2a0fc, April 2026: ``recipes/*.py``,
``torchtune/modules/loss``, ``torchtune/models/*/_component_builders.py``; LitGPT at
2685705, June 2026: ``litgpt/finetune/{lora,full}.py``, ``litgpt/args.py``,
``litgpt/utils.py``).

- **torchtune**: ``dtype`` is the model's dtype, no autocast (``bf16`` -> ``"bf16-true"``);
  ``CEWithChunkedOutputLoss`` and ``LinearCrossEntropyLoss`` split the tokens into
  ``num_output_chunks`` (8) chunks, the output head run per chunk; the recipe deletes the
  model's output before backward; a ``qlora_*`` builder (or ``quantize_base: True``)
  stores each block Linear as torchao's ``NF4Tensor`` (4-bit codes, an int8 scaler per 64
  weights, counted as bitsandbytes' double-quantized nf4, which is within 16 bits per 16,384
  weights of it) and keeps the embeddings, norms and head in ``dtype``.
- **LitGPT**: ``precision`` is Lightning's; ``quantize: bnb.nf4[-dq]`` converts every
  Linear, the head included, with Fabric's ``BitsandbytesPrecision`` from fp16, and trains
  with ``bitsandbytes.optim.PagedAdamW``; LoRA runs the head 128 positions at a time
  (``lm_head_chunk_size=128``) and keeps the logits referenced through
  ``fabric.backward``, in fp32 (Fabric's wrapped model casts its outputs to the default
  dtype: every precision plugin's ``convert_output``); the accumulation is
  ``global_batch_size // devices // micro_batch_size``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torchfit._core import checks
from torchfit._core.imports import require
from torchfit.memory.step.fields import FieldsRead, StepFields
from torchfit.memory.step.unsloth import unsloth_fields

__all__ = ["NAMED_RECIPES", "TORCHTUNE_OPTIMIZERS", "config_mapping", "recipe_fields"]

#: Recipes written in code, not a config file, by name: ``Step.from_recipe("unsloth")``.
NAMED_RECIPES = {"unsloth": unsloth_fields}

#: torchtune's ``optimizer._component_`` values torchfit has a model for (torch's AdamW
#: takes ``fused``/``foreach`` from the config's other keys).
TORCHTUNE_OPTIMIZERS: Mapping[str, str] = {
    "torch.optim.AdamW": "adamw",
    "torch.optim.Adam": "adam",
    "torch.optim.SGD": "sgd",
    "bitsandbytes.optim.AdamW8bit": "adamw-8bit",
    "bitsandbytes.optim.PagedAdamW8bit": "paged-adamw-8bit",
    "bitsandbytes.optim.PagedAdamW": "paged-adamw",
    "bitsandbytes.optim.PagedAdamW32bit": "paged-adamw",
}
#: torchtune's losses that run the head and the cross-entropy in chunks of the tokens.
_CHUNKED_LOSSES = ("CEWithChunkedOutputLoss", "LinearCrossEntropyLoss")
#: torchtune's ``lora_attn_modules`` names, as the roles `Step.lora_targets` takes.
_TORCHTUNE_ROLES = {
    "q_proj": "query",
    "k_proj": "key",
    "v_proj": "value",
    "output_proj": "projection",
}
_TORCHTUNE_DTYPES = {"bf16": "bf16-true", "fp32": "32-true"}
#: LitGPT's ``lora_*`` switches (litgpt/finetune/lora.py ``setup``) and their defaults.
_LITGPT_ROLES = {
    "lora_query": ("query", True),
    "lora_key": ("key", False),
    "lora_value": ("value", True),
    "lora_projection": ("projection", False),
    "lora_mlp": ("mlp", False),
    "lora_head": ("head", False),
}
#: LitGPT's ``--quantize`` (Fabric ``BitsandbytesPrecision`` modes): format, double quant.
_LITGPT_QUANTIZE = {
    "bnb.nf4": ("nf4", False),
    "bnb.nf4-dq": ("nf4", True),
    "bnb.fp4": ("fp4", False),
    "bnb.fp4-dq": ("fp4", True),
}


@checks.arguments(seq_len=checks.whole(at_least=1))
def recipe_fields(config: Any, *, seq_len: int | None = None) -> StepFields:
    """The `Step` fields of a torchtune or LitGPT config (a mapping or a YAML file).

    Args:
        config: The config as a mapping (an OmegaConf ``DictConfig`` too) or the path of
            its YAML file. torchtune's has ``model._component_``; LitGPT's a ``train``
            section or ``lora_r``/``precision``/``quantize``. Or the name of a recipe
            written in code (`NAMED_RECIPES`: ``"unsloth"``, its README's QLoRA).
        seq_len: The caller's sequence length where the config leaves it open: torchtune's
            chunked losses cut the tokens into a number of chunks, so their size needs it.

    Returns:
        The fields, the setting each was read from, and the settings not modelled.

    Raises:
        ValueError: a config that is neither torchtune's nor LitGPT's; a ``seq_len``
            below 1 or not finite.
        TypeError: neither a mapping nor a path; a ``seq_len`` that is not a number.
        ImportError: a YAML path without PyYAML.

    Example:
        >>> read = recipe_fields({"model": {"_component_":
        ...     "torchtune.models.llama3_1.qlora_llama3_1_8b", "lora_rank": 8,
        ...     "lora_attn_modules": ["q_proj", "v_proj"], "apply_lora_to_mlp": True},
        ...     "dtype": "bf16", "batch_size": 2, "gradient_accumulation_steps": 8,
        ...     "enable_activation_checkpointing": True,
        ...     "optimizer": {"_component_": "torch.optim.AdamW", "fused": True},
        ...     "loss": {"_component_": "torchtune.modules.loss.LinearCrossEntropyLoss"}},
        ...     seq_len=2048)
        >>> read.fields["quantization"], read.fields["lora_targets"], read.fields["loss_chunk_size"]
        ('nf4', ('query', 'value', 'mlp'), 256)
    """
    if isinstance(config, str) and config.strip().lower() in NAMED_RECIPES:
        if Path(config).exists():
            raise ValueError(
                f"{config!r} names both a file here and the {config.strip()} recipe; pass "
                f"'./{config}' for the file"
            )
        return NAMED_RECIPES[config.strip().lower()](seq_len=seq_len)
    data = config_mapping(config)
    model = data.get("model")
    if isinstance(model, Mapping) and "_component_" in model:
        return _torchtune(data, seq_len=seq_len)
    if isinstance(data.get("train"), Mapping) or data.keys() & {"lora_r", "precision", "quantize"}:
        return _litgpt(data, seq_len=seq_len)
    raise ValueError(
        f"the config (keys {sorted(data)}) is neither torchtune's (model._component_) nor "
        "LitGPT's (a train: section, lora_r, precision or quantize); expected one of their "
        "fine-tuning YAML files or its contents as a dict"
    )


def config_mapping(config: Any) -> Mapping[str, Any]:
    """``config`` as a plain mapping: a dict, a DictConfig, or a YAML file read.

    Raises:
        TypeError: neither a mapping nor a path.
        ValueError: a file that is not YAML.
        OSError: a path that cannot be read.
    """
    if isinstance(config, (str, os.PathLike)):
        yaml = require("yaml", feature="reading a recipe's YAML file")
        with Path(config).open(encoding="utf-8") as handle:
            try:
                config = yaml.safe_load(handle)
            except yaml.YAMLError as error:
                first = str(error).strip().splitlines()[0]
                raise ValueError(f"{str(config)!r} is not a YAML file ({first})") from None
    to_container = getattr(config, "to_container", None)  # omegaconf.DictConfig
    if callable(to_container) and not isinstance(config, Mapping):
        config = to_container()
    if not isinstance(config, Mapping):
        raise TypeError(
            f"expected a config mapping or the path of its YAML file; got "
            f"{type(config).__name__} {config!r}"
        )
    return config


def _cap(read: FieldsRead, key: str, cap: Any, given: int | None) -> int:
    """The sequence length under a config's cap: the caller's if within it, else the cap.

    Both projects truncate longer samples to the cap and pad a batch to its longest
    sample, so a shorter ``seq_len=`` (the data's longest) agrees with the config, and a
    longer one is left for `merge_fields` to refuse.
    """
    cap = int(cap)
    length = given if given is not None and given <= cap else cap
    read.set(f"{key}: {cap} (samples are cut to it)", seq_len=length)
    return length


# -- torchtune ---------------------------------------------------------------------------


def _torchtune(data: Mapping[str, Any], *, seq_len: int | None) -> StepFields:
    read = FieldsRead()
    dtype = str(data.get("dtype", "bf16"))
    if dtype in _TORCHTUNE_DTYPES:
        read.set(f"dtype: {dtype}", precision=_TORCHTUNE_DTYPES[dtype])
    else:
        read.unsupported["precision"] = (
            f"dtype: {dtype} has no torchfit precision (torchtune trains in bf16 or fp32 "
            "without autocast); pass precision= the one to count, e.g. 'bf16-true'"
        )
    for key, name in (
        ("batch_size", "batch_size"),
        ("gradient_accumulation_steps", "gradient_accumulation_steps"),
    ):
        if data.get(key) is not None:
            read.set(f"{key}: {data[key]}", **{name: int(data[key])})
    checkpointing = bool(data.get("enable_activation_checkpointing", False))
    read.set(
        f"enable_activation_checkpointing: {checkpointing}", gradient_checkpointing=checkpointing
    )
    if data.get("optimizer_in_bwd"):
        read.set("optimizer_in_bwd: True", optimizer_in_backward=True)
    read.set("the recipe's `del outputs` before backward", keep_output=False)
    tokenizer = data.get("tokenizer")
    if isinstance(tokenizer, Mapping) and tokenizer.get("max_seq_len") is not None:
        cap = tokenizer["max_seq_len"]
        dataset = data.get("dataset")
        if isinstance(dataset, Mapping) and dataset.get("packed"):
            # PackedDataset fills every sample to max_seq_len: the length, not a cap
            seq_len = int(cap)
            read.set(f"dataset.packed: True, tokenizer.max_seq_len: {cap}", seq_len=seq_len)
        else:
            seq_len = _cap(read, "tokenizer.max_seq_len", cap, seq_len)
    _torchtune_optimizer(data.get("optimizer"), read)
    _torchtune_loss(data.get("loss"), seq_len, read)
    _torchtune_model(data["model"], read)
    if data.get("enable_activation_offloading"):
        read.notes.append(
            "enable_activation_offloading: True moves saved activations to CPU memory; "
            "torchfit keeps them on the card (an upper bound)"
        )
    if data.get("compile"):
        read.notes.append(
            "compile: True (torch.compile's fused kernels use less memory than eager); "
            "torchfit counts the eager step (an upper bound)"
        )
    if any(key.startswith("fsdp") for key in data):
        read.notes.append(
            "a distributed recipe's config (fsdp_*): a Step is one process's unsharded step; "
            "shard the estimate with torchfit.memory.sharding.shard_estimate"
        )
    return read.done("torchtune config")


def _component(section: Any) -> str:
    """A config section's ``_component_`` (``""`` when the section or key is missing)."""
    return str(section.get("_component_", "")) if isinstance(section, Mapping) else ""


def _torchtune_optimizer(section: Any, read: FieldsRead) -> None:
    component = _component(section)
    name = TORCHTUNE_OPTIMIZERS.get(component)
    if name is None:
        read.unsupported["optimizer"] = (
            f"optimizer._component_: {component or '(none)'} has no memory model in "
            f"torchfit; the ones it has: {', '.join(TORCHTUNE_OPTIMIZERS)}. Pass optimizer= "
            "the closest torchfit name"
        )
        return
    options = [f"{k}: {section[k]}" for k in ("fused", "foreach", "momentum") if k in section]
    if name in {"adamw", "adam"} and section.get("fused"):
        name += "-fused"
    elif name in {"adamw", "adam"} and section.get("foreach") is False:
        name += "-for-loop"
    elif name == "sgd" and float(section.get("momentum", 0) or 0) != 0.0:
        name = "sgd-momentum"
    read.set(", ".join([f"optimizer._component_: {component}", *options]), optimizer=name)


def _torchtune_loss(section: Any, seq_len: int | None, read: FieldsRead) -> None:
    component = _component(section)
    leaf = component.rpartition(".")[2]
    if leaf not in _CHUNKED_LOSSES:
        if leaf not in {"CrossEntropyLoss", ""}:
            read.notes.append(
                f"loss._component_: {component} is counted as one cross-entropy over the "
                "whole logits"
            )
        return
    chunks = int(section.get("num_output_chunks", 8))
    setting = f"loss._component_: {leaf} ({chunks} chunks)"
    if seq_len is None:
        read.unsupported["loss_chunk_size"] = (
            f"{setting} cuts each batch's tokens into {chunks} chunks, and neither "
            "tokenizer.max_seq_len nor seq_len= gives their length; pass seq_len= (or "
            "loss_chunk_size=)"
        )
        return
    read.set(setting, loss_chunk_size=math.ceil(seq_len / chunks))


def _torchtune_model(section: Mapping[str, Any], read: FieldsRead) -> None:
    component = str(section["_component_"])
    builder = component.rpartition(".")[2]
    if not builder.startswith(("lora_", "qlora_")) and "lora_rank" not in section:
        return  # a full fine-tune: every parameter trains
    setting = f"model._component_: {component}"
    targets = []
    for module in section.get("lora_attn_modules", ()):
        if module not in _TORCHTUNE_ROLES:
            read.unsupported["lora_targets"] = (
                f"model.lora_attn_modules names {module!r}; expected some of "
                f"{sorted(_TORCHTUNE_ROLES)}. Pass lora_targets= the Linears to adapt"
            )
            return
        targets.append(_TORCHTUNE_ROLES[module])
    if section.get("apply_lora_to_mlp"):
        targets.append("mlp")
    if section.get("apply_lora_to_output"):
        targets.append("head")
    read.set(
        f"{setting}, lora_attn_modules, apply_lora_to_mlp/output",
        lora_targets=tuple(targets),
    )
    if section.get("lora_rank") is not None:
        read.set(f"model.lora_rank: {section['lora_rank']}", lora_rank=int(section["lora_rank"]))
    # the builders' default dropout is 0.0 (torchtune/models/*/_component_builders.py)
    dropout = float(section.get("lora_dropout", 0.0))
    read.set(f"model.lora_dropout: {dropout}", lora_dropout=dropout)
    if builder.startswith("qlora_") or section.get("quantize_base"):
        # torchao NF4Tensor on the block Linears; embeddings, norms and head stay in dtype
        read.set(setting, quantization="nf4", double_quant=True, kbit_prepare=False)


# -- LitGPT ------------------------------------------------------------------------------


def _litgpt(data: Mapping[str, Any], *, seq_len: int | None) -> StepFields:
    read = FieldsRead()
    section = data.get("train")
    train: Mapping[str, Any] = section if isinstance(section, Mapping) else {}
    lora = "lora_r" in data or any(key in data for key in _LITGPT_ROLES)
    quantize = data.get("quantize")
    precision = data.get("precision")
    if precision is None:
        read.unsupported["precision"] = (
            "precision is not set: LitGPT then picks 'bf16-true' on a card with bf16, else "
            "'16-true'; pass precision= the one the run uses"
        )
    elif quantize and "mixed" in str(precision):
        raise ValueError(
            f"precision: {precision} with quantize: {quantize}: LitGPT refuses quantization "
            "with mixed precision ('Quantization and mixed precision is not supported.'); "
            "use 'bf16-true' or '16-true'"
        )
    else:
        read.set(f"precision: {precision}", precision=str(precision))
    micro = int(train.get("micro_batch_size") or 1)
    devices = int(data.get("devices") or 1) * int(data.get("num_nodes") or 1)
    per_rank = int(train.get("global_batch_size") or 16) // devices
    read.set(f"train.micro_batch_size: {micro}", batch_size=micro)
    read.set(
        f"train.global_batch_size: {per_rank * devices} over {devices} device(s)",
        gradient_accumulation_steps=max(1, per_rank // micro),
    )
    if train.get("max_seq_length") is not None:
        _cap(read, "train.max_seq_length", train["max_seq_length"], seq_len)
    read.set("fabric.backward(loss) with the logits still referenced", keep_output=True)
    read.set("Fabric's wrapped model returns the logits in fp32", fp32_output=True)
    if lora:
        _litgpt_lora(data, read)
    else:
        read.notes.append(
            "the full fine-tune computes the cross-entropy 128 rows at a time over the "
            "whole logits; torchfit counts one cross-entropy over them (an upper bound)"
        )
    if quantize:
        _litgpt_quantize(str(quantize), read)
    else:
        _litgpt_optimizer(data.get("optimizer", "AdamW"), read)
    if devices > 1:
        read.notes.append(
            f"devices x num_nodes = {devices}: LitGPT shards the model (FSDP, with "
            "activation checkpointing for full fine-tuning); a Step is one process's "
            "unsharded step: shard the estimate with torchfit.memory.sharding.shard_estimate"
        )
    return read.done("LitGPT config")


def _litgpt_lora(data: Mapping[str, Any], read: FieldsRead) -> None:
    targets = tuple(role for key, (role, on) in _LITGPT_ROLES.items() if data.get(key, on))
    read.set("lora_query/key/value/projection/mlp/head", lora_targets=targets)
    read.set(f"lora_r: {data.get('lora_r', 8)}", lora_rank=int(data.get("lora_r", 8)))
    dropout = float(data.get("lora_dropout", 0.05))
    read.set(f"lora_dropout: {dropout}", lora_dropout=dropout)
    # model(input_ids, lm_head_chunk_size=128), then chunked_cross_entropy per chunk
    read.set("finetune/lora.py: lm_head_chunk_size=128", loss_chunk_size=128)


def _litgpt_quantize(quantize: str, read: FieldsRead) -> None:
    if quantize not in _LITGPT_QUANTIZE:
        read.unsupported["quantization"] = (
            f"quantize: {quantize} (int8 training keeps fp16 weights beside int8 ones) has no "
            f"memory model; expected one of {sorted(_LITGPT_QUANTIZE)}, or pass quantization="
        )
        return
    fmt, double_quant = _LITGPT_QUANTIZE[quantize]
    # BitsandbytesPrecision converts every Linear from torch.half; no PEFT preparation
    setting = f"quantize: {quantize}"
    read.set(
        setting,
        quantization=fmt,
        double_quant=double_quant,
        quantize_head=True,
        base_dtype="fp16",
        kbit_prepare=False,
    )
    read.set(f"{setting}: bitsandbytes.optim.PagedAdamW", optimizer="paged-adamw")


def _litgpt_optimizer(value: Any, read: FieldsRead) -> None:
    path = str(value.get("class_path", "")) if isinstance(value, Mapping) else str(value)
    leaf = path.rpartition(".")[2]
    names = {"AdamW": "adamw", "Adam": "adam", "SGD": "sgd"}
    if leaf not in names:
        read.unsupported["optimizer"] = (
            f"optimizer: {path} has no memory model in torchfit; pass optimizer= the "
            "closest torchfit name (e.g. 'adamw')"
        )
        return
    name = names[leaf]
    init = value.get("init_args", {}) if isinstance(value, Mapping) else {}
    if name == "sgd" and float(init.get("momentum", 0) or 0) != 0.0:
        name = "sgd-momentum"
    read.set(f"optimizer: {path}", optimizer=name)
