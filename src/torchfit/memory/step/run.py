"""A `Step` as the keywords of a run of the user's own model (`trace`, `measure_step`).

The model and the batch are the user's there, so a `Step` gives the loop: mode,
optimizer, precision, ``zero_grad``, accumulation, the output kept (and cast to fp32),
the optimizer in backward, and the device to predict. Its fields that describe the model
(LoRA, a 4/8-bit base, the trainable parameters, attention, chunked loss, generation)
cannot apply to a model that is already built: a set one is refused, never ignored. Its
batch and sample, when set, must be the inputs'.

This module reads a `Step` by its fields only and imports no other part of torchfit, so
the lowest stages (`measure_step`) can take one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

__all__ = [
    "MODEL_FIELDS",
    "RUN_DEFAULTS",
    "check_step_device",
    "given_loop",
    "loop_alone",
    "loop_keywords",
    "run_keywords",
]

#: The loop keywords of `trace` and `measure_step` a `Step` gives, with their defaults.
RUN_DEFAULTS: dict[str, Any] = {
    "mode": "train",
    "optimizer": "adamw",
    "precision": None,
    "autocast_dtype": None,
    "set_to_none": True,
    "gradient_accumulation_steps": 1,
    "keep_output": False,
    "optimizer_in_backward": False,
    "fp32_output": False,
}

#: `Step` fields that describe the model, not the loop, and what to do instead.
MODEL_FIELDS = {
    "quantization": "load the model quantized (torchfit.quantize.load_quantized)",
    "base_dtype": "load the model in that dtype",
    "lora": "wrap the model with peft.get_peft_model",
    "lora_rank": "wrap the model with peft.get_peft_model",
    "lora_targets": "wrap the model with peft.get_peft_model",
    "lora_dropout": "wrap the model with peft.get_peft_model",
    "trainable_params": "freeze the parameters with requires_grad_(False)",
    "frozen_base": "freeze the parameters with requires_grad_(False)",
    "kbit_prepare": "call peft.prepare_model_for_kbit_training on the model",
    "quantize_head": "load the model quantized",
    "double_quant": "load the model quantized",
    "bitsandbytes_version": "load the model quantized",
    "attn_implementation": "load the model with attn_implementation=...",
    "loss_chunk_size": "compute the loss in chunks in loss_fn",
    "max_new_tokens": "trace your generate loop with trace_step",
    "use_cache": "pass use_cache in the inputs",
}


def given_loop(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The loop keywords among a caller's ``arguments`` (its ``locals()``) for `run_keywords`.

    `trace` and `measure_step` take `RUN_DEFAULTS`' names as keywords beside ``step=``;
    this picks them out, so neither restates the list.

    Example:
        >>> given_loop({"model": None, "mode": "train", "keep_output": True})
        {'mode': 'train', 'keep_output': True}
    """
    return {name: value for name, value in arguments.items() if name in RUN_DEFAULTS}


def loop_alone(step: Any) -> Any:
    """``step`` with the fields that describe the model (`MODEL_FIELDS`) at their defaults.

    For a run of a model built to carry them (its adapters, dtypes, attention, cache).
    """
    fields = dataclasses.fields(step)
    return step.replace(**{f.name: f.default for f in fields if f.name in MODEL_FIELDS})


def run_keywords(
    step: Any, model: Any, example_inputs: object, given: Mapping[str, Any], *, where: str
) -> dict[str, Any]:
    """The loop keywords ``step`` stands for, in place of the ``given`` ones.

    Args:
        step: A `torchfit.Step`.
        model: The model the run takes (checkpointing is its own setting).
        example_inputs: The batch the run takes (its leading size is the batch).
        given: The loop keywords the caller passed (`RUN_DEFAULTS`' names).
        where: The entry point, for messages.

    Raises:
        TypeError: a loop keyword was given beside the step, or ``step`` is no `Step`.
        ValueError: the step sets a field of the model, or a batch or sample the inputs
            do not have.

    Example:
        >>> import torch
        >>> from torchfit import Step
        >>> step = Step(batch_size=8, precision="bf16-mixed", gradient_accumulation_steps=2)
        >>> run = run_keywords(step, torch.nn.Linear(16, 4), torch.zeros(8, 16), {}, where="trace")
        >>> run["precision"], run["gradient_accumulation_steps"], run["device"]
        ('bf16-mixed', 2, 'cuda')
    """
    if type(step).__name__ != "Step" or not hasattr(step, "__dataclass_fields__"):
        raise TypeError(f"{where}: step= takes a torchfit.Step; got {type(step).__name__}")
    both = sorted(k for k, v in given.items() if k in RUN_DEFAULTS and v != RUN_DEFAULTS[k])
    if both:
        names = ", ".join(f"{k}=" for k in both)
        raise TypeError(
            f"{where}: a Step and loop keywords ({names}) together; put them in the step: "
            f"step.replace({names.replace('=', '=...')})"
        )
    if "device" in given and given["device"] != step.device:
        raise TypeError(
            f"{where}: device={given['device']!r} and Step(device={step.device!r}) together; "
            f"leave device= out, or pass step.replace(device={given['device']!r})"
        )
    changed = step.changed()
    for name, instead in MODEL_FIELDS.items():
        if name in changed:
            value = changed[name]
            raise ValueError(
                f"{where} runs your model as it is built, and Step({name}={value!r}) describes "
                f"the model, not the loop: {instead}, and leave {name} out of the step "
                f"(torchfit.estimate(model_name, step) plans it without a model)"
            )
    if step.gradient_checkpointing and not getattr(model, "is_gradient_checkpointing", False):
        raise ValueError(
            f"{where}: Step(gradient_checkpointing=True), but the model does not checkpoint; "
            "call model.gradient_checkpointing_enable() first (a transformers model), or "
            "leave gradient_checkpointing out of the step"
        )
    _check_batch(step, example_inputs, where=where)
    return {
        "mode": step.mode,
        "optimizer": step.optimizer if step.training else None,
        "precision": step.precision,
        "autocast_dtype": None,
        **loop_keywords(step),
        "device": step.device,
    }


def loop_keywords(step: Any) -> dict[str, Any]:
    """The training loop's keywords of `trace` and `measure_step` that ``step`` sets.

    ``zero_grad``'s ``set_to_none``, accumulation, the output kept and cast to fp32, the
    optimizer in backward: what `torchfit._core.step.Loop` holds.
    """
    return {
        "set_to_none": step.set_to_none,
        "gradient_accumulation_steps": step.gradient_accumulation_steps,
        "keep_output": step.keep_output,
        "optimizer_in_backward": step.optimizer_in_backward,
        "fp32_output": step.fp32_output,
    }


def _check_batch(step: Any, example_inputs: object, *, where: str) -> None:
    """A batch, sequence or sample shape the step sets is the inputs' own."""
    first = _first_tensor(example_inputs)
    if first is None or first.dim() == 0:
        return
    shape = tuple(first.shape)
    wanted = {"batch_size": (step.batch_size, shape[0], step.batch_size != 1)}
    if step.seq_len is not None and len(shape) >= 2 and not first.is_floating_point():
        wanted["seq_len"] = (step.seq_len, shape[1], True)
    if step.input_shape is not None:
        wanted["input_shape"] = (tuple(step.input_shape), shape[1:], True)
    for name, (value, actual, named) in wanted.items():
        if named and value != actual:
            raise ValueError(
                f"{where}: Step({name}={value!r}) but the inputs have {actual!r} "
                f"(shape {list(shape)}); make them agree, e.g. step.replace({name}={actual!r})"
            )


def _first_tensor(inputs: object) -> Any:
    """The first tensor of a tensor, a tuple or list, or a dict (``input_ids`` first)."""
    if hasattr(inputs, "shape") and hasattr(inputs, "dim"):
        return inputs
    if isinstance(inputs, Mapping):
        ordered = [inputs["input_ids"]] if "input_ids" in inputs else []
        return next(
            (t for t in map(_first_tensor, [*ordered, *inputs.values()]) if t is not None), None
        )
    if isinstance(inputs, (tuple, list)):
        return next((t for t in map(_first_tensor, inputs) if t is not None), None)
    return None


def check_step_device(model: Any, device: str, *, where: str) -> None:
    """A `Step`'s device is where the model's parameters are (where a measured step runs)."""
    param = next(iter(model.parameters()), None)
    actual = None if param is None else param.device.type
    if actual is not None and actual != device:
        raise ValueError(
            f"{where}: Step(device={device!r}) but the model is on {actual!r}: a measured "
            f"step runs where the model is; pass step.replace(device={actual!r}) or move "
            "the model"
        )
