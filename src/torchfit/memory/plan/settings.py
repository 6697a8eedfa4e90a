"""What a plan was asked for (`Settings`), and what the model tells about its own input."""

from __future__ import annotations

import dataclasses
from typing import Any

from torchfit.memory.step import Step

__all__ = [
    "STEP_FIELDS",
    "Settings",
    "config_of",
    "default_seq_len",
    "default_sequence",
    "max_positions",
    "transformer_spec",
]


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a plan judges: the model, the `Step`, and where the step runs.

    The step is described once, by its `Step`; the rest says how many cards it runs on,
    how it is spread over them and what CUDA stack runs it.

    Attributes:
        model: The model's name (or its class name).
        step: The planned step (its precision made concrete for the card).
        world_size: Cards the step runs on.
        strategy: ``"ddp"``, ``"zero1"``, ``"zero2"``, ``"fsdp"``, ``"hsdp"`` or None.
        offload_optimizer: Optimizer state and its step on the CPU.
        offload_params: Parameter and gradient shards on the CPU too.
        param_dtype: FSDP2's ``MixedPrecisionPolicy(param_dtype=...)``.
        gpus_per_node: GPUs per node (HSDP, host memory).
        cuda_version: The job's CUDA version (the context size depends on it).
        context_bytes: A measured CUDA context, instead of the model's.
    """

    model: str
    step: Step
    world_size: int = 1
    strategy: str | None = None
    offload_optimizer: bool = False
    offload_params: bool = False
    param_dtype: str | None = None
    gpus_per_node: int | None = None
    cuda_version: str | None = None
    context_bytes: int | None = None

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes``: `Step` fields go to the step, the others here.

        Example:
            >>> s = Settings("gpt2", Step(batch_size=8, precision="bf16-mixed"))
            >>> s.replace(batch_size=4, strategy="ddp", world_size=2).step.batch_size
            4
        """
        own = {k: v for k, v in changes.items() if k not in STEP_FIELDS}
        step = {k: v for k, v in changes.items() if k in STEP_FIELDS}
        changed = dataclasses.replace(self, **own)
        return dataclasses.replace(changed, step=self.step.replace(**step)) if step else changed

    @property
    def weights(self) -> str:
        """The weights' format: the 4/8-bit base, else the compute dtype (``"bf16"``)."""
        return str(self.step.numerics.weights.value)

    def device(self) -> dict[str, Any]:
        """The keyword arguments of `to_device` these settings stand for."""
        return {"cuda_version": self.cuda_version, "context_bytes": self.context_bytes}

    def to_dict(self) -> dict[str, Any]:
        """Plain Python values (the step's by `Step.to_dict`)."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {**data, "step": self.step.to_dict()}


#: The names `Settings.replace` hands to the step.
STEP_FIELDS = frozenset(f.name for f in dataclasses.fields(Step))


def config_of(model: Any) -> Any:
    """The transformers config behind ``model``, or None for a plain ``nn.Module``."""
    from torchfit.memory.catalog.resolve import resolve_model  # noqa: PLC0415

    return resolve_model(model).config


def transformer_spec(model: Any) -> Any:
    """The closed-form description of a text transformer; None for any other model."""
    from torchfit.memory.analytic.arch import has_closed_form, spec_from_config  # noqa: PLC0415
    from torchfit.memory.catalog.resolve import is_vision  # noqa: PLC0415

    config = config_of(model)
    if config is None or is_vision(config) or not has_closed_form(config):
        return None
    return spec_from_config(config)


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
        return settings.replace(input_shape=resolved.input_shape)
    if is_vision(config):
        return settings.replace(input_shape=vision_input_shape(config))
    return settings.replace(seq_len=default_sequence(config)[0])


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
    return limit or settings.step.seq_len or 1
