"""`training_arguments_fields`: the `Step` fields of a ``transformers.TrainingArguments``.

Sources: transformers 5.25, ``training_args.py`` (the fields, their defaults and
``__post_init__``), ``trainer_optimizer.py`` (what each ``optim`` builds) and ``trainer.py``
(how the Trainer applies checkpointing).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torchfit.memory.step.fields import StepFields

__all__ = ["TRANSFORMERS_OPTIMIZERS", "training_arguments_fields"]


#: transformers' ``TrainingArguments.optim`` names torchfit has a memory model for
#: (transformers 5.25, training_args.py ``OptimizerNames``; what each builds:
#: trainer_optimizer.py ``_OPTIMIZER_HANDLERS``). ``sgd`` is read with ``optim_args``.
TRANSFORMERS_OPTIMIZERS: Mapping[str, str] = {
    # ``_get_adamw_torch``: torch.optim.AdamW(params, lr, betas, eps), torch's default
    # implementation (foreach on CUDA); ``adamw_torch_fused`` adds fused=True. transformers
    # 5 defaults to it with torch >= 2.8 (``TrainingArguments.default_optim``).
    "adamw_torch": "adamw",
    "adamw_torch_fused": "adamw-fused",
    # ``_get_bitsandbytes_optimizer``: bitsandbytes.optim.AdamW / Lion with
    # optim_bits=8 when "8bit" is in the name, else 32, and is_paged when "paged" is.
    "adamw_bnb_8bit": "adamw-8bit",
    "adamw_8bit": "adamw-8bit",
    "paged_adamw_8bit": "paged-adamw-8bit",
    "paged_adamw_32bit": "paged-adamw",
    "lion_32bit": "lion",
    # ``_get_adafactor``: transformers.optimization.Adafactor(scale_parameter=False,
    # relative_step=False); see _ADAFACTOR_NOTE.
    "adafactor": "adafactor",
    # ``_get_sgd``: torch.optim.SGD(params, lr), momentum from ``optim_args``.
    "sgd": "sgd",
}

_ADAFACTOR_NOTE = (
    "optim='adafactor' is transformers' own Adafactor (transformers/optimization.py), "
    "counted as torch.optim.Adafactor: the same factored second moment (no first moment "
    "at its default beta1=None), but for fp16/bf16 parameters it holds that state in fp32 "
    "and makes fp32 copies of each parameter and gradient in the step (higher under "
    "precision='bf16-true')"
)


def _optim_args(text: str | None) -> dict[str, str]:
    """``optim_args`` as transformers parses it: ``"k=v,k=v"``, spaces dropped.

    transformers 5.25, trainer_optimizer.py ``_parse_optim_args``.
    """
    pairs = [item.split("=", 1) for item in (text or "").replace(" ", "").split(",") if item]
    return {pair[0]: pair[1] if len(pair) > 1 else "" for pair in pairs}


def _optimizer(args: Any, read: dict[str, Any]) -> None:
    """``optim`` (and SGD's momentum in ``optim_args``) into ``read``."""
    optim = str(getattr(args.optim, "value", args.optim))
    if optim not in TRANSFORMERS_OPTIMIZERS:
        names = ", ".join(TRANSFORMERS_OPTIMIZERS)
        read["unsupported"]["optimizer"] = (
            f"optim={optim!r} has no memory model in torchfit; the ones it has: {names}. "
            "Pass optimizer= the closest torchfit name (e.g. 'adamw-8bit'), or for "
            "trace/measure_step a factory: lambda params: torch.optim.RMSprop(params)"
        )
        return
    name, setting = TRANSFORMERS_OPTIMIZERS[optim], f"optim={optim!r}"
    if optim == "sgd":
        # optim_args is read by the SGD, Adagrad, RMSprop, GaLore, APOLLO, LOMO, AnyPrecision,
        # GrokAdamW, schedule-free and torchao handlers; the AdamW, bitsandbytes AdamW/Lion
        # and Adafactor ones above ignore it (trainer_optimizer.py, transformers 5.25).
        momentum = _optim_args(args.optim_args).get("momentum", "0")
        try:
            moving = float(momentum) != 0.0
        except ValueError:
            raise ValueError(
                f"optim_args momentum={momentum!r} is not a number; expected e.g. "
                "optim_args='momentum=0.9' (transformers reads it with float())"
            ) from None
        if moving:
            name, setting = "sgd-momentum", f"optim='sgd', optim_args momentum={momentum}"
    if optim == "adafactor":
        read["notes"].append(_ADAFACTOR_NOTE)
    read["fields"]["optimizer"], read["read_from"]["optimizer"] = name, setting


#: The precision of accelerate's ``mixed_precision`` as the Trainer sets it (transformers
#: 5.25, training_args.py ``__post_init__``: ``ACCELERATE_MIXED_PRECISION``, overridden by
#: ``fp16``/``bf16``), with the other names a caller may give: under autocast, a model
#: loaded in bf16 stays bf16 (``"bf16-true"``); without it, the model's dtype decides. A
#: model loaded in fp16 with ``fp16=True`` fails: the GradScaler refuses fp16 gradients
#: ("Attempting to unscale FP16 gradients.", torch/amp/grad_scaler.py).
_TRAINER_PRECISION = {
    "no": ("32-true", ("bf16-true", "16-true")),
    "bf16": ("bf16-mixed", ("bf16-true",)),
    "fp16": ("16-mixed", ()),
}


def _precision(args: Any, read: dict[str, Any]) -> None:
    """``mixed_precision`` (or ``bf16``/``fp16``) into ``read``."""
    mixed = getattr(args, "mixed_precision", None)
    flags = "bf16" if args.bf16 else "fp16" if args.fp16 else "no"
    if mixed is None:  # args without mixed_precision (older transformers): the flags
        mixed = flags
    setting = "bf16=True" if args.bf16 else "fp16=True" if args.fp16 else "bf16=False, fp16=False"
    if mixed != flags:
        setting = f"ACCELERATE_MIXED_PRECISION={mixed!r}"
    if mixed not in _TRAINER_PRECISION:
        read["unsupported"]["precision"] = (
            f"mixed_precision={mixed!r} ({setting}) has no torchfit precision; expected "
            "'no', 'bf16' or 'fp16'. Pass precision= the one to count (e.g. 'bf16-mixed')"
        )
        return
    precision, agrees = _TRAINER_PRECISION[mixed]
    read["fields"]["precision"], read["read_from"]["precision"] = precision, setting
    if agrees:
        read["agrees"]["precision"] = agrees


def _checkpointing(args: Any, read: dict[str, Any]) -> None:
    """``activation_checkpointing`` (or the older ``gradient_checkpointing``) into ``read``."""
    on = getattr(args, "activation_checkpointing", None)
    name = "activation_checkpointing"
    if on is None:  # older transformers: gradient_checkpointing only
        on, name = args.gradient_checkpointing, "gradient_checkpointing"
    read["fields"]["gradient_checkpointing"] = bool(on)
    read["read_from"]["gradient_checkpointing"] = f"{name}={bool(on)}"
    kwargs = getattr(args, "activation_checkpointing_kwargs", None)
    kwargs = kwargs or getattr(args, "gradient_checkpointing_kwargs", None) or {}
    if not on or not isinstance(kwargs, Mapping):
        return
    # use_reentrant (and the other torch.utils.checkpoint keywords) is not read: both
    # variants keep each checkpointed block's input only. every_n_layers and offload are
    # popped by the Trainer (trainer.py, transformers 5.25) and change what is kept.
    every = int(kwargs.get("every_n_layers", 1))
    if every != 1:
        read["notes"].append(
            f"every_n_layers={every}: one layer in {every} is checkpointed; the estimate "
            "counts every layer checkpointed (low)"
        )
    if kwargs.get("offload"):
        read["notes"].append(
            "offload=True: saved activations are held in pinned host memory; the estimate "
            "counts them on the device (high)"
        )


def training_arguments_fields(args: Any) -> StepFields:
    """The `Step` fields a ``transformers.TrainingArguments`` names (transformers 5.x).

    Read: ``per_device_train_batch_size`` (``batch_size``), ``gradient_accumulation_steps``,
    ``bf16``/``fp16`` as the Trainer applies them (``precision``: ``"bf16-mixed"``,
    ``"16-mixed"``, else ``"32-true"``), ``optim`` (``optimizer``, `TRANSFORMERS_OPTIMIZERS`;
    SGD's momentum from ``optim_args``), ``activation_checkpointing`` /
    ``gradient_checkpointing`` and their kwargs' ``every_n_layers`` and ``offload``.
    Noted, not modelled: ``torch_compile``, ``use_liger_kernel``, ``auto_find_batch_size``,
    ``fsdp``, ``deepspeed``. Left out knowingly: ``bf16_full_eval``/``fp16_full_eval``
    (evaluation only), ``tf32`` (matmul precision, not sizes), ``torch_empty_cache_steps``
    (empties the cache between steps; the step's peak is the same),
    ``optim_target_modules`` (GaLore and APOLLO only, which have no model here),
    ``use_cpu`` (the device is never read: see `torchfit.memory.step`),
    ``use_cache`` (not used by training forwards) and ``neftune_noise_alpha`` (one
    embeddings-sized temporary in the forward, integrations/neftune.py).

    Args:
        args: A ``transformers.TrainingArguments`` (or a subclass, such as TRL's configs).

    Returns:
        The fields, where each came from, and the notes; `merge_fields` joins them with
        the caller's.

    Raises:
        TypeError: ``args`` is not a ``TrainingArguments``.

    Example:
        >>> from transformers import TrainingArguments
        >>> args = TrainingArguments("out", per_device_train_batch_size=4, bf16=True,
        ...                          use_cpu=True, gradient_accumulation_steps=8, report_to=[])
        >>> read = training_arguments_fields(args)
        >>> read.fields["precision"], read.fields["optimizer"], read.fields["batch_size"]
        ('bf16-mixed', 'adamw-fused', 4)
    """
    if not any(c.__name__ == "TrainingArguments" for c in type(args).__mro__):
        raise TypeError(
            f"expected a transformers.TrainingArguments; got {type(args).__name__}: pass "
            "the Trainer's args (trainer.args), or use Step(...) for other loops"
        )
    read: dict[str, Any] = {"fields": {}, "read_from": {}, "agrees": {}, "unsupported": {}}
    read["notes"] = []
    for field, setting in (
        ("batch_size", "per_device_train_batch_size"),
        ("gradient_accumulation_steps", "gradient_accumulation_steps"),
    ):
        value = getattr(args, setting)
        read["fields"][field], read["read_from"][field] = value, f"{setting}={value}"
    _precision(args, read)
    _optimizer(args, read)
    _checkpointing(args, read)
    read["notes"] += _trainer_notes(args)
    return StepFields(source="TrainingArguments", **{**read, "notes": tuple(read["notes"])})


def _trainer_notes(args: Any) -> list[str]:
    """What ``args`` turns on that changes memory and is not modelled."""
    notes = []
    if args.torch_compile:
        notes.append("torch_compile=True: the estimate describes the eager step")
    if getattr(args, "use_liger_kernel", False):
        notes.append(
            "use_liger_kernel=True: Liger's kernels (fused linear cross-entropy: no "
            "logits kept) are not modelled; the estimate is for transformers' own (high)"
        )
    if args.auto_find_batch_size:
        notes.append(
            "auto_find_batch_size=True: the Trainer shrinks the batch after an "
            "out-of-memory error; batch_size is the first one it tries"
        )
    if args.fsdp or args.deepspeed:
        notes.append(
            "fsdp/deepspeed: a Step is one process's unsharded step; shard the estimate "
            "with torchfit.memory.sharding.shard_estimate (torchfit plan --gpus N --strategy)"
        )
    return notes
