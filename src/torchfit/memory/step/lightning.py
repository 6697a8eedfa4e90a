"""`lightning_fields`: the `Step` fields of a Lightning ``Trainer``, ``Fabric`` or precision.

Sources: lightning 2.6, ``fabric/plugins/precision/precision.py`` (the precision inputs),
``fabric/connector.py`` (how they resolve) and ``fabric/plugins/precision/bitsandbytes.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torchfit._core.step import parse_precision_name
from torchfit.memory.step.fields import StepFields

__all__ = ["LIGHTNING_ALIASES", "lightning_fields"]


#: Lightning's legacy precision inputs (lightning 2.6, fabric/plugins/precision/precision.py
#: ``_PRECISION_INPUT_STR_ALIAS_CONVERSION``; ints are read as their strings by
#: fabric/connector.py ``_convert_precision_to_unified_args``).
LIGHTNING_ALIASES: Mapping[str, str] = {
    "64": "64-true",
    "32": "32-true",
    "16": "16-mixed",
    "bf16": "bf16-mixed",
}
#: Lightning's precision names (``_PRECISION_INPUT_STR``) with no `Step` precision.
_LIGHTNING_UNSUPPORTED = {
    "64-true": "fp64 weights and compute",
    "transformer-engine": "NVIDIA Transformer Engine's fp8 layers",
    "transformer-engine-float16": "NVIDIA Transformer Engine's fp8 layers",
}
#: ``BitsandbytesPrecision``'s layer classes by mode (lightning 2.6,
#: fabric/plugins/precision/bitsandbytes.py ``mode_to_cls``): (quantization, double quant).
_BNB_LAYERS = {
    "_NF4Linear": ("nf4", False),
    "_NF4DQLinear": ("nf4", True),
    "_FP4Linear": ("fp4", False),
    "_FP4DQLinear": ("fp4", True),
    "_Int8LinearInference": ("int8", None),  # has_fp16_weights=False: frozen int8 weights
}
_PREFIX = {"torch.bfloat16": "bf16", "torch.float16": "16", "torch.float32": "32"}


def _lightning_name(value: str | int) -> str:
    """A Lightning precision input as Lightning resolves it (``16`` -> ``"16-mixed"``)."""
    key = str(value)  # Lightning reads int flags as their strings
    name = LIGHTNING_ALIASES.get(key, key)
    known = {*LIGHTNING_ALIASES.values(), *_LIGHTNING_UNSUPPORTED, "16-true", "bf16-true"}
    if isinstance(value, bool) or name not in known:
        raise ValueError(
            f"{value!r} is not a Lightning precision; expected one of {sorted(known)} "
            f"(or the legacy {sorted(LIGHTNING_ALIASES)}, 64, 32, 16)"
        )
    return name


def _plugin_fields(plugin: Any, read: dict[str, Any]) -> None:
    """A Lightning precision plugin's precision (and quantization) into ``read``."""
    names = [c.__name__ for c in type(plugin).__mro__]
    if "BitsandbytesPrecision" not in names:
        _precision_name(str(plugin.precision), read, setting=f"precision={plugin.precision!r}")
        return
    # BitsandbytesPrecision keeps the Precision base's "32-true": its mode and dtype decide.
    layer = getattr(getattr(plugin, "_linear_cls", None), "__name__", "an unknown layer")
    if layer not in _BNB_LAYERS:
        read["unsupported"]["quantization"] = (
            f"BitsandbytesPrecision with {layer} ('int8-training': fp16 weights beside int8 "
            "ones) has no memory model; pass quantization= the format to count"
        )
        return
    fmt, double_quant = _BNB_LAYERS[layer]
    setting = f"BitsandbytesPrecision({layer}, dtype={plugin.dtype})"
    # convert_module replaces every Linear outside ignore_modules, the head included, and
    # quantizes from torch.half (fabric/plugins/precision/bitsandbytes.py, lightning 2.6).
    fields: dict[str, Any] = {
        "quantization": fmt,
        "precision": f"{_PREFIX[str(plugin.dtype)]}-true",
        "base_dtype": "fp16",
    }
    if double_quant is not None:
        fields["double_quant"] = double_quant
    if not plugin.ignore_modules:
        fields["quantize_head"] = True
    else:
        read["notes"].append(
            f"ignore_modules={sorted(plugin.ignore_modules)}: the Linears under them stay "
            "16-bit; torchfit keeps only the output head 16-bit (quantize_head=False, the "
            "default) and counts every other Linear quantized"
        )
    read["fields"].update(fields)
    read["read_from"].update(dict.fromkeys(fields, setting))


def _precision_name(name: str, read: dict[str, Any], *, setting: str) -> None:
    """A Lightning precision name into ``read``, or the reason it has no `Step` value."""
    if name in _LIGHTNING_UNSUPPORTED:
        read["unsupported"]["precision"] = (
            f"{setting} ({_LIGHTNING_UNSUPPORTED[name]}) has no torchfit precision; expected "
            "'32-true', '16-mixed', 'bf16-mixed', '16-true' or 'bf16-true'. Pass "
            "precision= the one to count instead"
        )
        return
    read["fields"]["precision"] = parse_precision_name(name).value
    read["read_from"]["precision"] = setting


def _accumulation(trainer: Any, read: dict[str, Any]) -> None:
    """``accumulate_grad_batches``, or the largest factor of a ``GradientAccumulationScheduler``.

    The callback sets ``trainer.accumulate_grad_batches`` at each epoch's start and refuses
    a Trainer whose own value is not 1 (lightning 2.6,
    pytorch/callbacks/gradient_accumulation_scheduler.py); gradients stay alive across
    micro-batches whenever the factor is above 1, so the largest one decides memory.
    """
    steps = trainer.accumulate_grad_batches
    setting = f"accumulate_grad_batches={steps}"
    for callback in getattr(trainer, "callbacks", ()):
        if any(c.__name__ == "GradientAccumulationScheduler" for c in type(callback).__mro__):
            steps = max(callback.scheduling.values())
            setting = f"GradientAccumulationScheduler({callback.scheduling}): largest {steps}"
    read["fields"]["gradient_accumulation_steps"] = steps
    read["read_from"]["gradient_accumulation_steps"] = setting


def _strategy_note(trainer_or_fabric: Any, read: dict[str, Any]) -> None:
    """A strategy other than one device: a `Step` is one process's unsharded step."""
    strategy = type(trainer_or_fabric.strategy).__name__
    if strategy != "SingleDeviceStrategy":
        read["notes"].append(
            f"strategy {strategy}: a Step is one process's unsharded step; shard the "
            "estimate with torchfit.memory.sharding.shard_estimate"
        )


def lightning_fields(trainer_or_precision: Any) -> StepFields:
    """The `Step` fields of a Lightning ``Trainer``, precision plugin or precision input.

    A ``Trainer`` gives its precision plugin's precision and ``accumulate_grad_batches``
    (``gradient_accumulation_steps``; with a ``GradientAccumulationScheduler``, its largest
    factor); a ``Fabric`` its precision and ``fp32_output=True`` (the module
    ``fabric.setup`` returns hands its floating outputs back in fp32, so the loss over them
    runs in fp32); a ``BitsandbytesPrecision`` plugin gives the quantized format,
    ``f"{dtype}-true"`` and ``base_dtype="fp16"``. A precision input is
    read as Lightning reads it: ``16`` and ``"16"`` are ``"16-mixed"``, ``"bf16"`` is
    ``"bf16-mixed"``, ``32`` is ``"32-true"``. ``"64-true"`` and ``"transformer-engine"``
    have no `Step` precision: `merge_fields` refuses them unless ``precision=`` is given.
    A strategy other than one device (DDP, FSDP, DeepSpeed) is noted: a `Step` is one
    process's unsharded step.

    Args:
        trainer_or_precision: A ``lightning.Trainer`` (or ``pytorch_lightning``'s), a
            ``lightning.Fabric``, a precision plugin, or a precision as
            ``Trainer(precision=...)`` takes it.

    Returns:
        The fields, where each came from, and the notes.

    Raises:
        ValueError: a string or int that is not a Lightning precision.
        TypeError: anything else.

    Example:
        >>> lightning_fields(16).fields
        {'precision': '16-mixed'}
        >>> lightning_fields("bf16-true").read_from
        {'precision': "precision='bf16-true'"}
    """
    read: dict[str, Any] = {"fields": {}, "read_from": {}, "unsupported": {}, "notes": []}
    value = trainer_or_precision
    if isinstance(value, (str, int)):
        _precision_name(_lightning_name(value), read, setting=f"precision={value!r}")
        source = "Lightning precision"
    elif hasattr(value, "precision_plugin") and hasattr(value, "accumulate_grad_batches"):
        _plugin_fields(value.precision_plugin, read)
        _accumulation(value, read)
        _strategy_note(value, read)
        source = "Lightning Trainer"
    elif any(c.__name__ == "Fabric" for c in type(value).__mro__):
        _plugin_fields(value.strategy.precision, read)
        # every precision plugin's convert_output casts what fabric.setup's module returns
        # to the default dtype (fabric/wrappers.py _FabricModule.forward, lightning 2.6)
        read["fields"]["fp32_output"] = True
        read["read_from"]["fp32_output"] = "Fabric: setup(model) returns fp32 outputs"
        _strategy_note(value, read)
        source = "Lightning Fabric"
    elif any(c.__name__ == "Precision" for c in type(value).__mro__):
        _plugin_fields(value, read)
        source = f"Lightning {type(value).__name__}"
    else:
        raise TypeError(
            f"expected a lightning.Trainer or Fabric, a precision plugin or a precision such as "
            f"'bf16-mixed'; got {type(value).__name__} {value!r}"
        )
    return StepFields(source=source, **{**read, "notes": tuple(read["notes"])})
