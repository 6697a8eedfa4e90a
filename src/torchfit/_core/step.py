"""One training or inference step, defined once.

The traced estimator, `measure_step` and the tests all run *the same* step, so that an
estimate and a measurement always describe the same code: forward, loss, backward,
optimizer step, ``zero_grad``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from torchfit._core.in_backward import InBackward
from torchfit._core.optimizers import (
    OptimizerFactory,
    OptimizerName,
    make_optimizer,
    parse_optimizer,
)
from torchfit._core.outputs import call_model, compute_loss, outputs_in_fp32
from torchfit._core.units import DType, parse_dtype

__all__ = [
    "InBackward",
    "Loop",
    "Mode",
    "Numerics",
    "OptimizerFactory",
    "OptimizerName",
    "TrainingPrecision",
    "call_model",
    "compute_loss",
    "make_optimizer",
    "parse_mode",
    "parse_optimizer",
    "parse_precision_name",
    "precision_dtypes",
    "resolve_numerics",
    "run_step",
]


class Mode(enum.StrEnum):
    """What a step does: train (forward, backward, optimizer) or inference (forward only)."""

    TRAIN = "train"
    INFERENCE = "inference"


class TrainingPrecision(enum.StrEnum):
    """How a training step holds and computes its numbers, with Lightning's names.

    ``*-mixed``: fp32 weights, gradients and optimizer state, forward under autocast
    (``torch.autocast``; fp16 with a GradScaler). ``*-true``: the model itself is 16-bit,
    and so are its gradients and (in ``torch.optim``) its optimizer state: Lightning's
    ``"bf16-true"``, torchtune's default, LitGPT's fine-tuning recipes.
    """

    FP32 = "32-true"
    FP16_MIXED = "16-mixed"
    BF16_MIXED = "bf16-mixed"
    FP16_TRUE = "16-true"
    BF16_TRUE = "bf16-true"

    @property
    def compute(self) -> str:
        """The dtype matmuls run in (``"fp32"``, ``"fp16"``, ``"bf16"``)."""
        return {"32": "fp32", "16": "fp16", "bf16": "bf16"}[self.value.split("-")[0]]

    @property
    def mixed(self) -> bool:
        """fp32 master weights under autocast."""
        return self.value.endswith("-mixed")


#: Other spellings of the same settings: Lightning's short forms (``"bf16"`` meant
#: ``"bf16-mixed"`` in Lightning 2.x) and dtype-style names.
_PRECISION_ALIASES = {
    "32": TrainingPrecision.FP32,
    "fp32": TrainingPrecision.FP32,
    "16": TrainingPrecision.FP16_MIXED,
    "fp16-mixed": TrainingPrecision.FP16_MIXED,
    "bf16": TrainingPrecision.BF16_MIXED,
    "fp16-true": TrainingPrecision.FP16_TRUE,
}


def parse_precision_name(value: str | TrainingPrecision) -> TrainingPrecision:
    """A training precision by Lightning's name (``"bf16-true"``, ``"16-mixed"``, ...).

    Raises:
        TypeError: not a string.
        ValueError: an unknown name; the message lists the choices.

    Example:
        >>> parse_precision_name("bf16-true").compute, parse_precision_name("16").mixed
        ('bf16', True)
    """
    if isinstance(value, TrainingPrecision):
        return value
    if not isinstance(value, str):
        raise TypeError(
            f"precision must be a name such as 'bf16-mixed'; got {type(value).__name__}"
        )
    key = value.strip().lower()
    if key in _PRECISION_ALIASES:
        return _PRECISION_ALIASES[key]
    try:
        return TrainingPrecision(key)
    except ValueError:
        names = ", ".join(repr(p.value) for p in TrainingPrecision)
        raise ValueError(
            f"unknown precision {value!r}; expected one of {names} (Lightning's names; "
            "'32', '16' and 'bf16' also work)"
        ) from None


@dataclasses.dataclass(frozen=True)
class Numerics:
    """What a step's numbers are: the weights' format, the compute dtype, master weights.

    Attributes:
        weights: How the (base) weights are stored: a float dtype, or int8/nf4/fp4.
        compute: The dtype matmuls run in.
        mixed: fp32 master weights, gradients and optimizer state under autocast;
            ``None`` leaves it to the estimator's default (on for 16-bit training).
    """

    weights: DType
    compute: DType
    mixed: bool | None


def resolve_numerics(
    *,
    precision: str | TrainingPrecision | None,
    dtype: str | DType | None,
    mixed_precision: bool | None,
) -> Numerics:
    """Put ``precision``, ``dtype`` and ``mixed_precision`` together, refusing contradictions.

    ``precision`` (Lightning's names) decides the compute dtype and master weights;
    ``dtype`` may then only name the weights as precision holds them (``"fp32"`` for
    ``"*-mixed"``, the compute dtype for ``"*-true"``) or a quantized weight format
    (``"nf4"``, ``"int8"``: a QLoRA base, whose compute comes from ``precision``:
    ``"32-true"`` is bitsandbytes' fp32 ``bnb_4bit_compute_dtype`` without autocast).
    Without ``precision``, ``dtype`` is the compute dtype (a quantized one computes in
    bf16) and ``mixed_precision`` stays as given.

    Raises:
        ValueError: the settings contradict each other, or a 16-bit ``dtype`` beside a
            ``"*-mixed"`` precision (read two ways); the message names the spelling.

    Example:
        >>> resolve_numerics(precision="bf16-true", dtype="nf4", mixed_precision=None)
        Numerics(weights=<DType.NF4: 'nf4'>, compute=<DType.BF16: 'bf16'>, mixed=False)
        >>> resolve_numerics(precision=None, dtype="fp16", mixed_precision=None).mixed is None
        True
    """
    fmt = parse_dtype("fp32" if dtype is None else dtype)
    if mixed_precision is not None and not isinstance(mixed_precision, bool):
        raise TypeError(f"mixed_precision must be True, False or None; got {mixed_precision!r}")
    if precision is None:
        compute = DType.BF16 if fmt.is_quantized else fmt
        if mixed_precision and compute.bits != 16:
            raise ValueError(
                f"mixed_precision=True autocasts to a 16-bit dtype, but dtype={fmt.value!r} "
                "computes in fp32; pass dtype='bf16' (or precision='bf16-mixed'), or leave "
                "mixed_precision out"
            )
        return Numerics(weights=fmt, compute=compute, mixed=mixed_precision)
    chosen = parse_precision_name(precision)
    compute = parse_dtype(chosen.compute)
    if mixed_precision is not None and mixed_precision != chosen.mixed:
        raise ValueError(
            f"precision={chosen.value!r} and mixed_precision={mixed_precision} contradict "
            f"each other; pass only precision= (its '-mixed' names mean fp32 master weights)"
        )
    if fmt.is_quantized:
        return Numerics(weights=fmt, compute=compute, mixed=chosen.mixed)
    if dtype is not None and chosen.mixed and compute.bits == 16 and fmt.bits == 16:
        # 16-bit compute is precision's to name; a 16-bit dtype beside it would be the
        # dtype the model is loaded in, which '-mixed' (fp32 master weights) contradicts
        raise ValueError(
            f"dtype={fmt.value!r} beside precision={chosen.value!r} reads two ways: the "
            f"compute dtype, which precision already names, or the dtype the model is loaded "
            f"in. Pass base_dtype={fmt.value!r} for a LoRA base loaded in {fmt.value} (PEFT "
            f"keeps the adapters fp32 under autocast), precision='{fmt.value}-true' for a "
            f"model held in {fmt.value}, or precision={chosen.value!r} alone for fp32 master "
            "weights"
        )
    held = DType.FP32 if chosen.mixed else compute  # the master weights' dtype
    if dtype is not None and fmt is not compute and fmt is not held:
        raise ValueError(
            f"dtype={fmt.value!r} contradicts precision={chosen.value!r}, which computes "
            f"in {compute.value}; pass only precision=, or dtype= alone"
        )
    return Numerics(weights=compute, compute=compute, mixed=chosen.mixed)


@dataclasses.dataclass(frozen=True)
class Loop:
    """How the training loop around a step runs: what decides which tensors overlap.

    Attributes:
        accumulation_steps: Micro-batches per optimizer step. From the second one on,
            the gradients of the earlier ones are alive through forward and backward.
        set_to_none: ``zero_grad(set_to_none=...)``. ``False`` (PyTorch's default before
            2.0, and the 2022 Hugging Face Trainer) keeps every gradient allocated
            between steps, so they are alive through the next forward too.
        keep_output: The forward's output stays referenced through backward, as in
            ``outputs = model(**batch); loss = outputs.loss; loss.backward()`` (PyTorch's
            and Hugging Face's hand-written loops, nanoGPT). The Hugging Face Trainer,
            Lightning and torchtune drop it first: ``False``.
        optimizer_in_backward: Each parameter steps from its post-accumulate-grad hook
            and its gradient is freed there (torchtune's ``optimizer_in_bwd``), so no
            moment holds every gradient; there is no separate optimizer step.
        fp32_output: The loop casts the forward's floating outputs to fp32 before the
            loss, as Lightning Fabric's wrapped module does (every precision plugin's
            ``convert_output``; LitGPT's and Lit-GPT's scripts): the logits the loss
            reads, and keeps, are fp32 (`outputs_in_fp32`).
    """

    accumulation_steps: int = 1
    set_to_none: bool = True
    keep_output: bool = True
    optimizer_in_backward: bool = False
    fp32_output: bool = False

    def __post_init__(self) -> None:
        """Refuse a non-integer or non-positive accumulation and non-bool flags."""
        steps = self.accumulation_steps
        if isinstance(steps, bool) or not isinstance(steps, int):
            raise TypeError(f"gradient_accumulation_steps must be an int >= 1; got {steps!r}")
        if steps < 1:
            raise ValueError(
                f"gradient_accumulation_steps must be >= 1; got {steps} (1 means no accumulation)"
            )
        for name in ("set_to_none", "keep_output", "optimizer_in_backward", "fp32_output"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False; got {getattr(self, name)!r}")
        if self.optimizer_in_backward and steps > 1:
            raise ValueError(
                "optimizer_in_backward=True steps each parameter during backward, so gradients "
                f"cannot accumulate over gradient_accumulation_steps={steps}; use one or the "
                "other (torchtune refuses the pair too)"
            )

    @property
    def gradients_during_forward(self) -> bool:
        """Whether gradients exist while a forward and backward run (accumulated or kept)."""
        if self.optimizer_in_backward:
            return False  # every gradient is freed as soon as its parameter stepped
        return self.accumulation_steps > 1 or not self.set_to_none


def parse_mode(value: str | Mode) -> Mode:
    """``"train"``/``"training"`` or ``"inference"``/``"eval"`` as a `Mode`.

    Example:
        >>> parse_mode("training")
        <Mode.TRAIN: 'train'>
    """
    key = str(value).strip().lower()
    key = {"training": "train", "eval": "inference", "infer": "inference"}.get(key, key)
    try:
        return Mode(key)
    except ValueError:
        raise ValueError(f"unknown mode {value!r}; expected 'train' or 'inference'") from None


def run_step(
    model: nn.Module,
    example_inputs: object,
    *,
    mode: Mode,
    optimizer: torch.optim.Optimizer | InBackward | None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    set_to_none: bool = True,
    autocast_dtype: torch.dtype | None = None,
    loop: Loop | None = None,
) -> None:
    """One step. Train: forward, loss, backward per micro-batch, optimizer step, ``zero_grad``.

    Inference: forward under ``torch.inference_mode`` (the output is dropped at the end).
    With ``autocast_dtype``, ``torch.autocast`` (on the model's device) wraps forward and loss only,
    not backward or the optimizer step, as PyTorch recommends. ``loop`` says how many
    micro-batches (each on ``example_inputs``) run before the optimizer step, whether the
    output is cast to fp32 and stays referenced through backward, and ``zero_grad``'s
    ``set_to_none`` (which then overrides ``set_to_none``). With
    ``loop.optimizer_in_backward`` the optimizer is an `InBackward`, stepped parameter by
    parameter during backward.
    """
    loop = Loop(set_to_none=set_to_none, keep_output=False) if loop is None else loop
    # autocast on the device the model runs on (fake tensors of a trace say "cpu")
    first = next(model.parameters(), None)
    device_type = "cuda" if first is not None and first.device.type == "cuda" else "cpu"
    autocast = (
        contextlib.nullcontext()
        if autocast_dtype is None
        else torch.autocast(device_type, dtype=autocast_dtype)
    )
    if mode is Mode.INFERENCE:
        with torch.inference_mode(), autocast:
            call_model(model, example_inputs)
        return
    if isinstance(optimizer, InBackward) != loop.optimizer_in_backward:
        raise ValueError(
            "optimizer_in_backward=True needs an InBackward optimizer, and only it does; "
            f"got {type(optimizer).__name__} with {loop}"
        )
    fused = optimizer.attached() if isinstance(optimizer, InBackward) else contextlib.nullcontext()
    with fused:
        for _ in range(loop.accumulation_steps):
            with autocast:
                output = call_model(model, example_inputs)
                if loop.fp32_output:
                    output = outputs_in_fp32(output)
                loss = compute_loss(output, loss_fn)
                if not loop.keep_output:
                    del output
            if loop.accumulation_steps > 1:
                loss = loss / loop.accumulation_steps
            loss.backward()  # type: ignore[no-untyped-call]
            del loss
            if loop.keep_output:
                del output
    if isinstance(optimizer, InBackward):
        model.zero_grad(set_to_none=True)  # frozen or unused parameters: nothing to step
    elif optimizer is not None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=loop.set_to_none)
    else:
        model.zero_grad(set_to_none=loop.set_to_none)


def precision_dtypes(
    precision: str | TrainingPrecision | None, autocast_dtype: torch.dtype | None
) -> tuple[torch.dtype | None, torch.dtype | None]:
    """What a real or traced step does for ``precision``: (cast the model to, autocast in).

    ``*-true`` converts a copy of the model; ``*-mixed`` runs forward and loss under
    autocast; ``"32-true"`` does neither. Without ``precision``, ``autocast_dtype`` is used
    as given.

    Raises:
        ValueError: ``autocast_dtype`` contradicts ``precision``.

    Example:
        >>> precision_dtypes("bf16-true", None)
        (torch.bfloat16, None)
        >>> precision_dtypes("16-mixed", None)
        (None, torch.float16)
    """
    if precision is None:
        return None, autocast_dtype
    chosen = parse_precision_name(precision)
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[chosen.compute]
    wanted = dtype if chosen.mixed else None
    if autocast_dtype is not None and autocast_dtype != wanted:
        raise ValueError(
            f"autocast_dtype={autocast_dtype} contradicts precision={chosen.value!r} "
            f"(which autocasts to {wanted}); pass only precision="
        )
    return (None if chosen.mixed else dtype), wanted
