"""The step knobs `estimate` takes beside the model: the loop and LoRA, checked together."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from torchfit._bnb.config import read_bitsandbytes_config
from torchfit._bnb.layout import keeps_4bit_input
from torchfit._core import checks
from torchfit._core.step import Loop, Mode, Numerics, TrainingPrecision, parse_mode
from torchfit._core.torch_rules import mean_keeps_input
from torchfit._core.units import DType, parse_dtype
from torchfit.memory.analytic.arch import TransformerSpec
from torchfit.memory.analytic.formulas import parse_attention
from torchfit.memory.analytic.lora import LoraSetup
from torchfit.memory.analytic.loraconfig import lora_setup

__all__ = [
    "ESTIMATE_RULES",
    "bnb_compute_dtype_of",
    "check_base_dtype",
    "check_step",
    "default_precision",
    "check_generation",
    "kbit_prepare_of",
    "quantization_of",
    "with_compute",
    "lora_of",
    "loop_of",
    "parse_base_dtype",
    "refuse_for_meta_pass",
]

#: The dtypes a checkpoint loads in (what a frozen or quantized base is held or quantized from).
_BASE_DTYPES = (DType.FP32, DType.FP16, DType.BF16)


def parse_base_dtype(value: str | DType) -> DType:
    """A frozen base's dtype: a float a checkpoint loads in, never a quantized format.

    Example:
        >>> parse_base_dtype("nf4")
        Traceback (most recent call last):
        ...
        ValueError: a base is loaded in fp32, fp16 or bf16, not 'nf4'; ...
    """
    found = parse_dtype(value)
    if found not in _BASE_DTYPES:
        raise ValueError(
            f"a base is loaded in {', '.join(d.value for d in _BASE_DTYPES[:-1])} or "
            f"{_BASE_DTYPES[-1].value}, not {found.value!r}; the quantized format goes in dtype="
        )
    return found


#: The door's rules for the arguments `estimate` and `fits` share (one definition).
ESTIMATE_RULES: dict[str, checks.Rule] = {
    "model": checks.model_ref(),
    "batch_size": checks.whole(at_least=1),
    "seq_len": checks.whole(at_least=1),
    "input_shape": checks.shape(),
    "attn_implementation": checks.parsed(parse_attention, kinds=(str,)),
    "gradient_accumulation_steps": checks.whole(at_least=1),
    "loss_chunk_size": checks.whole(at_least=1),
    "max_new_tokens": checks.whole(at_least=1),
    "lora_rank": checks.whole(at_least=1),
    "lora_dropout": checks.number(at_least=0, below=1),
    "bitsandbytes_version": checks.parsed(keeps_4bit_input),
    "torch_version": checks.parsed(mean_keeps_input),
    "base_dtype": checks.parsed(parse_base_dtype, kinds=(str,)),
    "bnb_compute_dtype": checks.parsed(parse_dtype, kinds=(str,)),
}


def loop_of(
    accumulation: int,
    *,
    set_to_none: bool,
    keep_output: bool,
    in_backward: bool,
    loss_chunk: int | None,
    fp32_output: bool = False,
) -> Loop:
    """The loop knobs of `estimate`, checked together.

    Example:
        >>> loop_of(2, set_to_none=True, keep_output=False, in_backward=True, loss_chunk=None)
        Traceback (most recent call last):
        ...
        ValueError: optimizer_in_backward=True steps each parameter during backward, ...
    """
    loop = Loop(
        accumulation_steps=accumulation,
        set_to_none=set_to_none,
        keep_output=keep_output,
        optimizer_in_backward=in_backward,
        fp32_output=fp32_output,
    )
    if loss_chunk is not None and (isinstance(loss_chunk, bool) or not isinstance(loss_chunk, int)):
        raise TypeError(f"loss_chunk_size must be an int or None; got {loss_chunk!r}")
    if loss_chunk is not None and loss_chunk < 1:
        raise ValueError(f"loss_chunk_size must be >= 1 position, or None; got {loss_chunk}")
    return loop


def lora_of(
    spec: TransformerSpec,
    lora: Any,
    rank: int | None,
    targets: str | Sequence[str] | None,
    dropout: float | None,
    *,
    training: bool = True,
) -> LoraSetup | None:
    """The adapters asked for, or None when no LoRA argument was given."""
    if lora is None and rank is None and targets is None and dropout is None:
        return None
    return lora_setup(
        spec, lora=lora, rank=rank, targets=targets, dropout=dropout, training=training
    )


def refuse_for_meta_pass(*, lora: bool, chunked: bool, fp32_output: bool = False) -> None:
    """A meta-pass estimate has no LoRA or chunked-loss model: say so rather than ignore it."""
    if lora:
        raise ValueError(
            "lora=/lora_rank=/lora_targets= need a transformers config of a family with a "
            "closed form; for this model pass trainable_params=, or trace the peft model"
        )
    if chunked or fp32_output:
        name = "loss_chunk_size" if chunked else "fp32_output"
        raise ValueError(
            f"{name} is modelled for transformers language models only (the loss of "
            "any other model is its own code); for this model trace your own training step "
            "with torchfit.memory.trace_step"
        )


def check_generation(new_tokens: int | None, *, mode: str, use_cache: bool | None) -> None:
    """``max_new_tokens`` describes ``generate``: inference with a cache only."""
    if new_tokens is None:
        return
    if parse_mode(mode) is not Mode.INFERENCE:
        raise ValueError(
            f"max_new_tokens={new_tokens} describes generation, but mode={mode!r}; pass "
            "mode='inference' or leave max_new_tokens out"
        )
    if use_cache is False:
        raise ValueError(
            f"max_new_tokens={new_tokens} generates with a KV cache, but use_cache=False; "
            "drop use_cache=False (generate always caches here) or leave max_new_tokens out"
        )


def kbit_prepare_of(
    *, given: bool | None, weights: DType, mode: str, mixed: bool | None, compute: DType
) -> bool:
    """Whether a quantized base trains as ``peft.prepare_model_for_kbit_training`` leaves it.

    Default: yes for a 4/8-bit ``dtype`` in training (PEFT's QLoRA recipe), unless the
    model itself is 16-bit (``precision='bf16-true'``, ``mixed_precision=False``), which
    converts every parameter and so undoes the recipe's fp32 casts. Given explicitly, it
    must describe a quantized training step.

    Raises:
        ValueError: ``kbit_prepare`` with an unquantized ``dtype``, for inference, or
            ``True`` with a 16-bit model; the message names the right spelling.

    Example:
        >>> nf4, bf16 = DType.NF4, DType.BF16
        >>> kbit_prepare_of(given=None, weights=nf4, mode="train", mixed=None, compute=bf16)
        True
        >>> kbit_prepare_of(given=None, weights=nf4, mode="train", mixed=False, compute=bf16)
        False
    """
    training = parse_mode(mode) is Mode.TRAIN
    pure_16bit = mixed is False and compute.bits == 16
    if given is None:
        return weights.is_quantized and training and not pure_16bit
    if not weights.is_quantized:
        raise ValueError(
            f"kbit_prepare={given} describes peft.prepare_model_for_kbit_training of a 4/8-bit "
            f"base, but dtype={weights.value!r} is not quantized; pass dtype='nf4' (or 'fp4', "
            "'int8'), or leave kbit_prepare out"
        )
    if not training:
        raise ValueError(
            f"kbit_prepare={given} describes a training run, but mode={mode!r}; leave "
            "kbit_prepare out for inference"
        )
    if given and pure_16bit:
        raise ValueError(
            f"kbit_prepare=True keeps the base's embeddings, norms and head in fp32, but a "
            f"{compute.value} model without autocast (precision='{compute.value}-true' or "
            "mixed_precision=False) converts them to 16 bits; pass precision='bf16-mixed' "
            "(autocast, PEFT's recipe) or kbit_prepare=False"
        )
    return given


def check_base_dtype(
    base: str | DType | None,
    *,
    weights: DType,
    compute: DType,
    mode: str,
    mixed: bool | None,
    frozen: bool,
) -> None:
    """Refuse a ``base_dtype`` that the step would ignore or contradict.

    It names a frozen base's dtype (LoRA, ``trainable_params``/``frozen_base``) under
    autocast, or the dtype a quantized base was quantized from. A model that trains
    whole, an unquantized model at inference, and a model converted to 16 bits
    (``*-true``) have their dtype from ``precision``/``dtype`` alone.

    Raises:
        ValueError: the message names the spelling that says it.

    Example:
        >>> check_base_dtype("bf16", weights=DType.FP32, compute=DType.FP32, mode="train",
        ...                  mixed=None, frozen=False)
        Traceback (most recent call last):
        ...
        ValueError: base_dtype='bf16' is the dtype of a frozen base (LoRA: lora=, ...
    """
    if base is None or weights.is_quantized:
        return
    given = parse_dtype(base)
    if parse_mode(mode) is not Mode.TRAIN:
        raise ValueError(
            f"base_dtype={given.value!r} has no effect on inference of an unquantized model: "
            f"pass dtype={given.value!r} (the weights' dtype) instead"
        )
    if not frozen:
        raise ValueError(
            f"base_dtype={given.value!r} is the dtype of a frozen base (LoRA: lora=, "
            "lora_rank=/lora_targets=, or trainable_params=), but the whole model trains; "
            "precision= (or dtype=) names its dtype"
        )
    autocast = compute.autocasts(mixed=mixed)
    if not autocast and given is not compute:
        raise ValueError(
            f"base_dtype={given.value!r}, but without autocast the whole model computes in "
            f"{compute.value} (precision='{compute.value}-true' converts it); pass "
            f"precision='bf16-mixed' (autocast, as Trainer(bf16=True) runs it) for a "
            f"{given.value} base, or leave base_dtype out"
        )


def quantization_of(
    quantization: Any,
    *,
    dtype: str | DType | None,
    double_quant: bool | None,
    quantize_head: bool,
) -> tuple[str | DType | None, bool, bool, DType | None]:
    """``(dtype, double_quant, quantize_head, compute)`` with a ``BitsAndBytesConfig`` read in.

    Without ``quantization`` the arguments stand (double quantization on by default for
    4 bits) and ``compute`` is None. With one, it names the format, the double
    quantization, whether the head is quantized and ``bnb_4bit_compute_dtype``
    (`torchfit._bnb.config`); ``dtype`` must then be left out, and ``double_quant`` and
    ``quantize_head`` may only repeat it.

    Raises:
        ValueError: an argument names again, differently, what the config says.
    """
    if quantization is None:
        return dtype, True if double_quant is None else double_quant, quantize_head, None
    found = read_bitsandbytes_config(quantization)
    if dtype is not None:
        raise ValueError(
            f"quantization= names the weights ({found.weights.value}) and dtype={dtype!r} "
            "would name them again; leave dtype out (base_dtype= names the dtype the "
            "checkpoint is loaded in, precision= the autocast)"
        )
    if double_quant is not None and double_quant != found.double_quant:
        raise ValueError(
            f"double_quant={double_quant} contradicts the config's bnb_4bit_use_double_quant="
            f"{found.double_quant}; leave double_quant out"
        )
    if quantize_head and not found.quantize_head:
        raise ValueError(
            "quantize_head=True, but the config's llm_int8_skip_modules keeps the head "
            "unquantized (transformers' default); pass llm_int8_skip_modules=[] in the config, "
            "or leave quantize_head out"
        )
    return found.weights, found.double_quant, found.quantize_head, found.compute


def with_compute(numerics: Numerics, compute: DType | None, *, precision: str | None) -> Numerics:
    """``numerics`` computing in a config's ``bnb_4bit_compute_dtype`` when no precision says.

    With ``precision``, autocast decides the matmuls' dtype (bitsandbytes' ``F.linear``
    runs inside it), so the config's compute dtype changes nothing the estimate counts.

    Raises:
        ValueError: ``mixed_precision=True`` with an fp32 compute dtype.
    """
    if compute is None or precision is not None:
        return numerics
    if numerics.mixed and compute.bits != 16:
        raise ValueError(
            "mixed_precision=True autocasts to a 16-bit dtype, but bnb_4bit_compute_dtype is "
            "float32; pass precision='bf16-mixed' (autocast over the fp32 compute dtype), or "
            "leave mixed_precision out"
        )
    return dataclasses.replace(numerics, compute=compute)


def default_precision(step: Any) -> str:
    """What a step that names no precision runs in: fp32, or bf16 around a quantized base."""
    if step.quantization is None:
        return TrainingPrecision.FP32.value
    return (TrainingPrecision.BF16_MIXED if step.training else TrainingPrecision.BF16_TRUE).value


def bnb_compute_dtype_of(step: Any) -> str | None:
    """A 4-bit inference step's own matmul dtype, or None when it is the precision's.

    Raises:
        ValueError: no 4-bit base, a dtype that is not a float, or a training step.
    """
    fmt = parse_dtype(step.bnb_compute_dtype)
    if fmt.is_quantized or step.quantization is None or parse_dtype(step.quantization).bits != 4:
        raise ValueError(
            f"bnb_compute_dtype={fmt.value!r} is the dtype a 4-bit bitsandbytes layer computes "
            f"in; it needs quantization='nf4' (or fp4) and a float dtype (fp32, bf16, fp16); "
            f"got quantization={step.quantization!r}"
        )
    if step.training:
        raise ValueError(
            f"bnb_compute_dtype={fmt.value!r} is modelled for inference; a training step "
            "computes its 4-bit layers in the precision's dtype (autocast) or, without "
            "autocast, in fp32 throughout: pass precision='32-true' for that"
        )
    same = step.precision != "auto" and fmt is step.compute
    return None if same else fmt.value


def check_step(step: Any) -> bool:
    """Check a `Step`'s fields together; returns whether a quantized base is PEFT-prepared.

    Raises:
        ValueError: a contradiction, named with its fix (`loop_of`, `check_generation`,
            `kbit_prepare_of`, `check_base_dtype`).
    """
    loop_of(
        step.gradient_accumulation_steps,
        set_to_none=step.set_to_none,
        keep_output=step.keep_output,
        in_backward=step.optimizer_in_backward,
        loss_chunk=step.loss_chunk_size,
        fp32_output=step.fp32_output,
    )
    check_generation(step.max_new_tokens, mode=step.mode, use_cache=step.use_cache)
    if step.fp32_output and parse_mode(step.mode) is not Mode.TRAIN:
        raise ValueError(
            "fp32_output=True describes a training loop's loss over fp32 logits, but "
            f"mode={step.mode!r}; leave fp32_output out for inference"
        )
    check_base_dtype(
        step.base_dtype,
        weights=step.numerics.weights,
        compute=step.compute,
        mode=step.mode,
        mixed=step.mixed,
        frozen=step.wants_lora or step.trainable_params is not None or bool(step.frozen_base),
    )
    return kbit_prepare_of(
        given=step.kbit_prepare,
        weights=step.numerics.weights,
        mode=step.mode,
        mixed=step.mixed,
        compute=step.compute,
    )
