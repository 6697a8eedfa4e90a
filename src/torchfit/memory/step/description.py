# ruff: noqa: RUF009 - step_field is dataclasses.field with the flag and help as metadata
"""`Step`: one training or inference step, described once, checked where it is made.

Precision has one vocabulary, Lightning's (``"32-true"``, ``"bf16-mixed"``, ``"16-mixed"``,
``"bf16-true"``, ``"16-true"``), plus ``quantization`` (a 4/8-bit base) and ``base_dtype``
(a frozen or quantized base's). Each field carries its ``torchfit plan`` flag and help.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from torchfit._core import checks
from torchfit._core.optimizers import parse_optimizer
from torchfit._core.step import (
    Mode,
    Numerics,
    TrainingPrecision,
    parse_mode,
    parse_precision_name,
)
from torchfit._core.units import DType, parse_dtype
from torchfit.memory import knobs
from torchfit.memory.step.fields import made_from, step_field
from torchfit.memory.step.lightning import lightning_fields
from torchfit.memory.step.plain import plain, short_repr
from torchfit.memory.step.recipes import recipe_fields
from torchfit.memory.step.spellings import AUTO, read_spellings
from torchfit.memory.step.training_arguments import training_arguments_fields

__all__ = ["AUTO", "FIELD_NAMES", "Step"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Step:
    """One training or inference step: what decides its memory, checked once.

    Build one with keywords (``Step(batch_size=8, seq_len=2048, precision="bf16-mixed")``),
    from a ``peft.LoraConfig`` and a ``BitsAndBytesConfig`` (`Step.from_peft`), a
    framework's settings (`Step.from_training_arguments`, `from_lightning`, `from_recipe`
    for torchtune and LitGPT), or `estimate`'s keyword spellings (`Step.of`). Change one
    with `replace`. Pass it to `torchfit.estimate`.

    Example:
        >>> step = Step(batch_size=4, seq_len=2048, quantization="nf4", lora_rank=16,
        ...             gradient_checkpointing=True)
        >>> step.precision, step.numerics.weights.value, step.compute.value, step.kbit_prepared
        ('bf16-mixed', 'nf4', 'bf16', True)
        >>> Step.of(dtype="bf16", mode="inference").precision
        'bf16-true'
        >>> Step(precision="bf16-mixed", kbit_prepare=True)
        Traceback (most recent call last):
        ...
        ValueError: kbit_prepare=True describes peft.prepare_model_for_kbit_training of ...
    """

    # what one step processes
    batch_size: int = step_field(
        default=1, flag="--batch", kind="count", help="samples per step (default 1)"
    )
    seq_len: int | None = step_field(
        default=None,
        flag="--seq",
        kind="count",
        help="tokens per sample (default: the model's maximum; a line on stderr says so)",
    )
    input_shape: tuple[int, ...] | None = step_field(
        default=None,
        flag="--input-shape",
        kind="shape",
        help="one sample of a vision model, e.g. 3,380,380 (default: the config's image)",
    )
    mode: str = step_field(
        default="train", kind="mode", help="train (forward, backward, optimizer step) or inference"
    )
    max_new_tokens: int | None = step_field(
        default=None,
        flag="--new-tokens",
        kind="count",
        help="with --inference: generate N tokens after the --seq prompt (model.generate)",
    )
    use_cache: bool | None = step_field(
        default=None, help="inference returns a KV cache (transformers' default for decoders)"
    )
    # the numbers
    precision: str | None = step_field(
        default=None,
        flag="--precision",
        kind="precision",
        help="Lightning's names: 32-true, 16-mixed, bf16-mixed, 16-true, bf16-true, or auto "
        "(the card's 16-bit mixed precision)",
    )
    quantization: str | DType | None = step_field(
        default=None,
        kind="quantization",
        help="a bitsandbytes base: nf4, fp4, int4 or int8 (or a BitsAndBytesConfig)",
    )
    base_dtype: str | DType | None = step_field(
        default=None,
        flag="--base-dtype",
        kind="dtype",
        help="a frozen LoRA base's dtype under mixed precision (default: the checkpoint's); "
        "with 4-bit weights, the dtype they were quantized from (fp16 for Lightning Fabric)",
    )
    bnb_compute_dtype: str | DType | None = step_field(
        default=None,
        flag="--bnb-compute-dtype",
        kind="dtype",
        help="inference on a 4-bit base: bitsandbytes' bnb_4bit_compute_dtype where it is not "
        "the precision's (fp32, its default), which only the 4-bit layers compute in",
    )
    double_quant: bool = step_field(
        default=True,
        flag="--no-double-quant",
        help="4-bit weights without double quantization (one fp32 absmax per 64 weights)",
    )
    quantize_head: bool = step_field(
        default=False,
        flag="--quantize-head",
        help="with --dtype nf4/int8: the output head quantized too (kept 16-bit by default)",
    )
    bitsandbytes_version: str | None = step_field(
        default=None,
        flag="--bitsandbytes-version",
        kind="bitsandbytes_version",
        help="the bitsandbytes of a 4-bit run (before 0.43.2 4-bit layers keep their input)",
    )
    torch_version: str | None = step_field(
        default=None,
        flag="--torch-version",
        kind="torch_version",
        help="the run's torch (before 2.2 torch.mean keeps its input); default: the installed",
    )
    kbit_prepare: bool | None = step_field(
        default=None,
        flag="--no-kbit-prepare",
        help="a 4/8-bit base trained without peft.prepare_model_for_kbit_training (its "
        "embeddings, norms and head stay 16-bit)",
    )
    # the training loop
    optimizer: Any = step_field(
        default="adamw",
        flag="--optimizer",
        kind="optimizer",
        help="sgd, sgd-momentum, adam, adamw, adamw-8bit, paged-adamw-8bit, paged-adamw, "
        "lion, adafactor",
    )
    gradient_checkpointing: bool = step_field(
        default=False, flag="--checkpointing", help="gradient checkpointing"
    )
    gradient_accumulation_steps: int = step_field(
        default=1,
        flag="--accumulate",
        kind="count",
        help="gradient accumulation steps (--batch is one micro-batch); gradients stay alive",
    )
    set_to_none: bool = step_field(
        default=True,
        flag="--zero-grad-in-place",
        help="zero_grad(set_to_none=False): gradients stay allocated between steps",
    )
    keep_output: bool = step_field(
        default=False,
        flag="--keep-output",
        help="the forward's output stays referenced through backward (outputs.loss.backward())",
    )
    optimizer_in_backward: bool = step_field(
        default=False,
        flag="--optimizer-in-backward",
        help="each parameter steps during backward and its gradient is freed (torchtune)",
    )
    loss_chunk_size: int | None = step_field(
        default=None,
        flag="--loss-chunk",
        kind="count",
        help="the loss is computed N positions at a time (torchtune's chunked CE, LitGPT: 128)",
    )
    fp32_output: bool = step_field(
        default=False, flag="--fp32-output", help="the loop casts the logits to fp32 (Fabric)"
    )
    # what trains
    trainable_params: int | None = step_field(
        default=None,
        flag="--trainable-params",
        kind="whole",
        help="parameters that train (LoRA adapters, a frozen base); default: all",
    )
    frozen_base: bool | None = step_field(
        default=None, help="the model's own weights are frozen and adapters train beside them"
    )
    lora: Any = step_field(default=None, help="a peft.LoraConfig")
    lora_rank: int | None = step_field(
        default=None, flag="--lora-rank", kind="count", help="LoRA rank (PEFT's default 8)"
    )
    lora_targets: tuple[str, ...] | str | None = step_field(
        default=None,
        flag="--lora-targets",
        kind="names",
        help="comma-separated Linears with adapters, e.g. q_proj,v_proj or all-linear "
        "(PEFT's default for the model; a 4/8-bit --train plan assumes it)",
    )
    lora_dropout: float | None = step_field(
        default=None,
        flag="--lora-dropout",
        kind="fraction",
        help="the adapters' dropout (lora_dropout)",
    )
    # the kernels
    attn_implementation: str = step_field(
        default="sdpa", flag="--attn", kind="attention", help="eager, sdpa or flash"
    )
    device: str = step_field(
        default="cuda", help="cuda (default) or cpu: kernel choices and dropout masks differ"
    )

    def __post_init__(self) -> None:  # noqa: C901 - one check per field, in order
        """Normalize the spellings and check the fields together."""
        if isinstance(self.lora_targets, Sequence) and not isinstance(self.lora_targets, str):
            object.__setattr__(self, "lora_targets", tuple(self.lora_targets))
        if self.quantization is not None and not isinstance(self.quantization, (str, DType)):
            raise TypeError(
                f"Step(quantization=...) takes a format name ('nf4', 'int8'); got a "
                f"{type(self.quantization).__name__}: pass a BitsAndBytesConfig as "
                "Step.from_peft(quantization=config, ...) or Step.of(quantization=config, ...)"
            )
        checks.fields(self, **{k: v for k, v in knobs.ESTIMATE_RULES.items() if k in FIELD_NAMES})
        set_ = object.__setattr__
        set_(self, "mode", parse_mode(self.mode).value)
        if self.device not in {"cuda", "cpu"}:
            raise ValueError(f"device must be 'cuda' or 'cpu'; got {self.device!r}")
        if self.quantization is not None:
            fmt = parse_dtype(self.quantization)
            if not fmt.is_quantized:
                raise ValueError(
                    f"quantization={self.quantization!r} is not a 4/8-bit format; expected "
                    f"'nf4', 'fp4', 'int4' or 'int8'; precision= names a float model"
                )
            set_(self, "quantization", fmt.value)
        if isinstance(self.optimizer, str) or not callable(self.optimizer):
            parse_optimizer(self.optimizer)  # a factory is checked when the step is traced
        if self.base_dtype is not None:
            set_(self, "base_dtype", parse_dtype(self.base_dtype).value)
        if self.precision is None:
            set_(self, "precision", knobs.default_precision(self))
        elif self.precision != AUTO:
            set_(self, "precision", parse_precision_name(self.precision).value)
        if self.bnb_compute_dtype is not None:
            set_(self, "bnb_compute_dtype", knobs.bnb_compute_dtype_of(self))
        if self.precision != AUTO:
            knobs.check_step(self)

    # -- derived ---------------------------------------------------------------------------

    @property
    def training(self) -> bool:
        """A training step (forward, backward, optimizer step)."""
        return self.mode == Mode.TRAIN.value

    @property
    def compute(self) -> DType:
        """The dtype matmuls run in."""
        return parse_dtype(self._precision().compute)

    @property
    def mixed(self) -> bool:
        """fp32 master weights under autocast (a ``*-mixed`` precision)."""
        return self._precision().mixed

    @property
    def numerics(self) -> Numerics:
        """The step's numbers as the estimators take them.

        The weights' format (a quantized one, else the compute dtype), the compute dtype,
        and autocast.
        """
        quantized = None if self.quantization is None else parse_dtype(self.quantization)
        return Numerics(weights=quantized or self.compute, compute=self.compute, mixed=self.mixed)

    @property
    def kbit_prepared(self) -> bool:
        """A quantized base trains as ``peft.prepare_model_for_kbit_training`` leaves it.

        ``kbit_prepare``, or its default: yes for a 4/8-bit base in a ``*-mixed`` step.
        """
        return knobs.check_step(self)

    @property
    def wants_lora(self) -> bool:
        """Any LoRA argument was given."""
        return any(
            v is not None for v in (self.lora, self.lora_rank, self.lora_targets, self.lora_dropout)
        )

    def _precision(self) -> TrainingPrecision:
        if self.precision == AUTO or self.precision is None:
            raise ValueError(
                "precision='auto' picks the card's 16-bit precision and needs a card: give "
                "one (precision='bf16-mixed') here, or ask torchfit.fits(model, gpu, step)"
            )
        return TrainingPrecision(self.precision)

    # -- making new ones -------------------------------------------------------------------

    def replace(self, **changes: Any) -> Step:
        """A copy with ``changes`` (field names), checked again.

        Example:
            >>> Step(batch_size=8).replace(batch_size=4).batch_size
            4
        """
        return dataclasses.replace(self, **changes)

    def for_card(self, bf16: bool) -> Step:  # noqa: FBT001
        """``precision="auto"`` made concrete for a card (with native bf16 or not)."""
        if self.precision != AUTO:
            return self
        half = "bf16" if bf16 else "16"
        return self.replace(precision=f"{half}-mixed" if self.training else f"{half}-true")

    @classmethod
    def of(cls, **keywords: Any) -> Step:
        """A `Step` from `estimate`'s keywords, older spellings included.

        Besides the fields: ``dtype`` (a float: the compute dtype, autocast for 16-bit
        training unless ``mixed_precision=False``; a 4/8-bit format: the quantized
        base), ``mixed_precision``, and ``quantization`` as a ``BitsAndBytesConfig``.

        Raises:
            TypeError: an unknown keyword (the message lists the close ones).
            ValueError: two spellings that contradict each other.
        """
        return cls(**read_spellings(keywords, FIELD_NAMES))

    @classmethod
    def from_peft(cls, lora: Any = None, quantization: Any = None, **fields: Any) -> Step:
        """A `Step` from a ``peft.LoraConfig`` and a ``transformers.BitsAndBytesConfig``.

        Every field of theirs that changes memory is read (`torchfit._bnb.config` says which
        ones and which are left out knowingly); ``fields`` give the rest.

        Example:
            >>> from peft import LoraConfig
            >>> from transformers import BitsAndBytesConfig as Bnb
            >>> bnb = Bnb(load_in_4bit=True, bnb_4bit_compute_dtype="bfloat16")
            >>> Step.from_peft(LoraConfig(r=16), bnb, seq_len=2048).precision
            'bf16-mixed'
        """
        return cls.of(lora=lora, quantization=quantization, **fields)

    @classmethod
    def from_training_arguments(cls, args: Any, **fields: Any) -> Step:
        """A `Step` from a ``transformers.TrainingArguments``; ``fields`` give the rest.

        Read: the per-device batch, accumulation, bf16/fp16, ``optim``, checkpointing.
        A setting not modelled (``torch_compile``) warns (`NotModelledWarning`); a field
        in ``fields`` that contradicts ``args`` is a ValueError.

        Example:
            >>> from transformers import TrainingArguments
            >>> args = TrainingArguments("out", per_device_train_batch_size=4, bf16=True,
            ...                          activation_checkpointing=True, use_cpu=True, report_to=[])
            >>> step = Step.from_training_arguments(args, seq_len=2048)
            >>> step.batch_size, step.precision, step.gradient_checkpointing
            (4, 'bf16-mixed', True)
        """
        return made_from(cls.of, training_arguments_fields(args), fields)

    @classmethod
    def from_lightning(cls, trainer_or_precision: Any, **fields: Any) -> Step:
        """A `Step` from a Lightning ``Trainer``, a ``Fabric`` or a ``precision=`` value.

        Read: the precision (``16``, ``"bf16"`` as Lightning reads them; a bitsandbytes
        plugin's 4/8-bit base), ``accumulate_grad_batches``, Fabric's fp32 outputs.

        Example:
            >>> Step.from_lightning("bf16", batch_size=8, seq_len=1024).precision
            'bf16-mixed'
        """
        return made_from(cls.of, lightning_fields(trainer_or_precision), fields)

    @classmethod
    def from_recipe(cls, config: Any, **fields: Any) -> Step:
        """A `Step` from a torchtune or LitGPT config (a dict or its YAML path), or ``"unsloth"``.

        Read as `recipe_fields` says; what is not modelled warns.

        Example:
            >>> Step.from_recipe({"precision": "bf16-true", "quantize": "bnb.nf4", "lora_r": 32,
            ...     "train": {"micro_batch_size": 2, "global_batch_size": 8}}).optimizer
            'paged-adamw'
        """
        return made_from(cls.of, recipe_fields(config, seq_len=fields.get("seq_len")), fields)

    def changed(self) -> dict[str, Any]:
        """The fields that differ from the defaults (what a short repr shows)."""
        default = {f.name: f.default for f in dataclasses.fields(self)}
        default["precision"] = knobs.default_precision(self)
        return {k: v for k, v in vars(self).items() if k in default and v != default[k]}

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain Python values (for JSON).

        A ``peft.LoraConfig`` as the fields that decide memory, an optimizer factory as its repr.

        Example:
            >>> Step(batch_size=2, lora_targets=["q_proj"]).to_dict()["lora_targets"]
            ['q_proj']
        """
        return {f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def __repr__(self) -> str:
        """``Step(...)`` with the fields that differ from the defaults."""
        inner = ", ".join(f"{k}={short_repr(v)}" for k, v in self.changed().items())
        return f"Step({inner})"


#: The names of `Step`'s fields.
FIELD_NAMES = frozenset(f.name for f in dataclasses.fields(Step))
