"""The step knobs `estimate` takes beside the model: the loop and LoRA, checked together."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torchfit._bnb.layout import keeps_4bit_input
from torchfit._core import checks
from torchfit._core.step import Loop, Mode, parse_mode
from torchfit._core.units import DType, parse_dtype
from torchfit.memory.analytic.arch import TransformerSpec
from torchfit.memory.analytic.formulas import parse_attention
from torchfit.memory.analytic.lora import LoraSetup, lora_setup

__all__ = [
    "ESTIMATE_RULES",
    "check_generation",
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
    "base_dtype": checks.parsed(parse_base_dtype, kinds=(str,)),
}


def loop_of(
    accumulation: int,
    *,
    set_to_none: bool,
    keep_output: bool,
    in_backward: bool,
    loss_chunk: int | None,
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
) -> LoraSetup | None:
    """The adapters asked for, or None when no LoRA argument was given."""
    if lora is None and rank is None and targets is None and dropout is None:
        return None
    return lora_setup(spec, lora=lora, rank=rank, targets=targets, dropout=dropout)


def refuse_for_meta_pass(*, lora: bool, chunked: bool) -> None:
    """A meta-pass estimate has no LoRA or chunked-loss model: say so rather than ignore it."""
    if lora:
        raise ValueError(
            "lora=/lora_rank=/lora_targets= need a transformers config of a family with a "
            "closed form; for this model pass trainable_params=, or trace the peft model"
        )
    if chunked:
        raise ValueError(
            "loss_chunk_size is modelled for transformers language models only (the loss of "
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
