"""`estimate`: the analytic, explainable estimator, one door for every kind of model.

A transformers config, a catalog name or a transformers model goes to the closed forms
(`torchfit.memory.analytic.transformer`); a vision config or any ``nn.Module`` with an
input shape goes to a meta-device pass (`torchfit.memory.modules`). Neither builds the
model in memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torchfit._core.step import Loop, OptimizerName, resolve_numerics
from torchfit._core.units import DType
from torchfit.memory.analytic.arch import TransformerSpec, describe
from torchfit.memory.analytic.lora import LoraSetup, lora_setup
from torchfit.memory.analytic.transformer import estimate_transformer
from torchfit.memory.catalog.resolve import (
    build_model,
    is_vision,
    resolve_config,
    vision_input_shape,
)
from torchfit.memory.modules.peak import estimate_module
from torchfit.memory.result import MemoryEstimate

__all__ = ["estimate"]

_DEVICES = ("cuda", "cpu")


def estimate(
    model: Any,
    *,
    batch_size: int,
    seq_len: int | None = None,
    input_shape: tuple[int, ...] | None = None,
    dtype: str | DType | None = None,
    mode: str = "train",
    optimizer: str | OptimizerName | None = "adamw",
    gradient_checkpointing: bool = False,
    attn_implementation: str = "sdpa",
    mixed_precision: bool | None = None,
    trainable_params: int | None = None,
    use_cache: bool | None = None,
    device: str = "cuda",
    frozen_base: bool | None = None,
    precision: str | None = None,
    gradient_accumulation_steps: int = 1,
    set_to_none: bool = True,
    keep_output: bool = False,
    optimizer_in_backward: bool = False,
    loss_chunk_size: int | None = None,
    lora: Any = None,
    lora_rank: int | None = None,
    lora_targets: str | Sequence[str] | None = None,
    lora_dropout: float | None = None,
) -> MemoryEstimate:
    """Predict the peak memory of one training or inference step.

    Args:
        model: A catalog name (``"gpt2"``, ``"llama-2-7b"``), a local ``config.json`` or
            model directory, a transformers config or model, or any ``nn.Module`` (then
            ``input_shape`` is required and activations come from a meta-device pass).
        batch_size: Samples per step.
        seq_len: Tokens per sample (transformers; defaults to the model's maximum).
        input_shape: Shape of one sample for non-transformer models, e.g. ``(3, 224, 224)``.
        dtype: Compute dtype (``"fp32"``, the default, ``"bf16"``, ``"fp16"``); ``"int8"``/
            ``"int4"``/``"nf4"`` quantize the block weights (inference, or training
            adapters only; they compute in bf16 unless ``precision`` says otherwise).
        mode: ``"train"`` or ``"inference"``.
        optimizer: ``"sgd"``, ``"sgd-momentum"``, ``"adam"``, ``"adamw"``, ``"adamw-8bit"``,
            ``"paged-adamw-8bit"``, ``"paged-adamw"``, ``"lion"``, ``"adafactor"`` or
            ``None`` (transformers' ``optim`` spellings work too).
        gradient_checkpointing: Keep only each block's input; recompute one block at a time.
        attn_implementation: ``"eager"``, ``"sdpa"`` or ``"flash"``.
        mixed_precision: Autocast with fp32 master weights. Default: on for training with a
            16-bit ``dtype``; ``False`` means the model itself is 16-bit.
        trainable_params: Parameters that train (frozen layers, LoRA); all by default.
        use_cache: Inference returns a KV cache (transformers' default for decoders).
        device: ``"cuda"`` (default) or ``"cpu"``: kernel choices and dropout masks differ.
        frozen_base: The model's own weights are frozen and adapters beside every block
            Linear train (LoRA), so autograd keeps nothing that only a weight's gradient
            needs (transformers). Default: when ``trainable_params`` is at most a tenth of
            the parameters.
        precision: Lightning's names: ``"32-true"``, ``"16-mixed"``, ``"bf16-mixed"``
            (fp32 master weights under autocast), ``"16-true"``, ``"bf16-true"`` (the model,
            its gradients and optimizer state 16-bit). Replaces ``dtype``/
            ``mixed_precision``; ``dtype`` may still name a quantized base (QLoRA).
        gradient_accumulation_steps: Micro-batches per optimizer step (``batch_size`` is
            one micro-batch): the gradients are then alive through forward and backward.
        set_to_none: ``zero_grad(set_to_none=...)``; ``False`` keeps the gradients
            allocated through the next forward.
        keep_output: The forward's output (the logits) stays referenced through backward,
            as in ``outputs = model(**batch); outputs.loss.backward()``. The Hugging Face
            Trainer and Lightning drop it first (``False``).
        optimizer_in_backward: Each parameter steps as soon as its gradient is ready and
            the gradient is freed (torchtune's ``optimizer_in_bwd``).
        loss_chunk_size: The loss is computed in chunks of this many positions
            (torchtune's ``CEWithChunkedOutputLoss``: ``seq_len // 8``; LitGPT's
            ``chunked_cross_entropy``: 128), so backward makes one chunk's logit gradients
            at a time. Fused linear cross-entropy (Liger), which never makes the logits, is
            not modelled.
        lora: A ``peft.LoraConfig``: its ``r``, ``target_modules``, ``lora_dropout`` and
            ``modules_to_save`` decide what trains and what the adapters keep.
        lora_rank: LoRA rank (PEFT's default 8 when only targets are given).
        lora_targets: The Linears that get adapters, in the model's names (``["q_proj",
            "v_proj"]``), or ``"all-linear"``; PEFT's default for the family when only a
            rank is given. Training a quantized base (``"nf4"``, ``"int8"``) without any of
            these or ``trainable_params`` assumes PEFT's default adapters, and says so.
        lora_dropout: ``lora_dropout``: above 0 each adapter keeps a mask and a dropped
            copy of its input.

    Returns:
        A `MemoryEstimate` with per-block rows in ``layers`` and the rules in ``notes``.

    Raises:
        ValueError: bad sizes, ``seq_len`` beyond the model's positions, an unknown name,
            optimizer or dtype.

    Example:
        >>> from transformers import GPT2Config
        >>> e = estimate(GPT2Config(), batch_size=8, seq_len=1024, dtype="bf16")
        >>> round(e.total / 2**30, 1) > 4  # GPT-2 small at 8 x 1024 in bf16 AMP
        True
    """
    if device not in _DEVICES:
        raise ValueError(f"device must be 'cuda' or 'cpu'; got {device!r}")
    numerics = resolve_numerics(precision=precision, dtype=dtype, mixed_precision=mixed_precision)
    loop = _loop(
        gradient_accumulation_steps,
        set_to_none=set_to_none,
        keep_output=keep_output,
        in_backward=optimizer_in_backward,
        loss_chunk=loss_chunk_size,
    )
    dtype, mixed_precision = numerics.weights, numerics.mixed
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive integer; got {batch_size!r}")
    from torch import nn  # noqa: PLC0415 - torch is always there; keeps the branch readable

    if isinstance(model, nn.Module) and not hasattr(getattr(model, "config", None), "model_type"):
        if input_shape is None:
            raise ValueError(
                "an nn.Module needs input_shape=(...) of one sample, e.g. (3, 224, 224)"
            )
        wants_lora = any(v is not None for v in (lora, lora_rank, lora_targets, lora_dropout))
        _refuse_loop_for_modules(loop, in_backward=optimizer_in_backward, lora=wants_lora)
        return estimate_module(
            model,
            batch_size=batch_size,
            input_shape=input_shape,
            dtype=dtype,
            mode=mode,
            optimizer=optimizer,
            mixed_precision=mixed_precision,
            device=device,
        )
    config = resolve_config(model)
    try:
        spec = describe(config)
    except ValueError:
        if not is_vision(config):
            raise
        _refuse_loop_for_modules(loop, in_backward=optimizer_in_backward)
        return _estimate_vision(
            config,
            batch_size=batch_size,
            input_shape=input_shape,
            dtype=dtype,
            mode=mode,
            optimizer=optimizer,
            mixed_precision=mixed_precision,
            device=device,
        )
    return estimate_transformer(
        spec,
        batch_size=batch_size,
        seq_len=spec.max_positions if seq_len is None else seq_len,
        dtype=dtype,
        mode=mode,
        optimizer=optimizer,
        gradient_checkpointing=gradient_checkpointing,
        attn_implementation=attn_implementation,
        mixed_precision=mixed_precision,
        trainable_params=trainable_params,
        use_cache=use_cache,
        device=device,
        frozen_base=frozen_base,
        loop=loop,
        optimizer_in_backward=optimizer_in_backward,
        compute_dtype=numerics.compute,
        loss_chunk=loss_chunk_size,
        lora=_lora(spec, lora, lora_rank, lora_targets, lora_dropout),
    )


def _lora(
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


def _loop(
    accumulation: int,
    *,
    set_to_none: bool,
    keep_output: bool,
    in_backward: bool,
    loss_chunk: int | None,
) -> Loop:
    """The loop knobs of `estimate`, checked together."""
    loop = Loop(accumulation_steps=accumulation, set_to_none=set_to_none, keep_output=keep_output)
    if not isinstance(in_backward, bool):
        raise TypeError(f"optimizer_in_backward must be True or False; got {in_backward!r}")
    if in_backward and loop.accumulation_steps > 1:
        raise ValueError(
            "optimizer_in_backward=True steps each parameter during backward, so gradients "
            f"cannot accumulate over gradient_accumulation_steps={loop.accumulation_steps}; "
            "use one or the other (torchtune refuses the pair too)"
        )
    if loss_chunk is not None and (isinstance(loss_chunk, bool) or not isinstance(loss_chunk, int)):
        raise TypeError(f"loss_chunk_size must be an int or None; got {loss_chunk!r}")
    if loss_chunk is not None and loss_chunk < 1:
        raise ValueError(f"loss_chunk_size must be >= 1 position, or None; got {loss_chunk}")
    return loop


def _refuse_loop_for_modules(loop: Loop, *, in_backward: bool, lora: bool = False) -> None:
    """The meta-pass estimate models the plain loop only; say so rather than ignore a knob."""
    if lora:
        raise ValueError(
            "lora=/lora_rank=/lora_targets= need a transformers config of a family with a "
            "closed form; for this model pass trainable_params=, or trace the peft model"
        )
    if loop != Loop(keep_output=loop.keep_output) or in_backward:
        raise ValueError(
            "gradient_accumulation_steps, set_to_none=False and optimizer_in_backward are "
            "modelled for transformers' closed forms only so far; for this model use "
            "torchfit.memory.trace_step with your own training step"
        )


def _estimate_vision(
    config: Any,
    *,
    batch_size: int,
    input_shape: tuple[int, ...] | None,
    dtype: str | DType,
    mode: str,
    optimizer: str | OptimizerName | None,
    mixed_precision: bool | None,
    device: str,
) -> MemoryEstimate:
    """CNNs and vision transformers from a config: a meta-device build, then a meta pass."""
    shape = input_shape or vision_input_shape(config)
    model = build_model(config, device="meta", dtype="fp32")
    return estimate_module(
        model,
        batch_size=batch_size,
        input_shape=shape,
        dtype=dtype,
        mode=mode,
        optimizer=optimizer,
        mixed_precision=mixed_precision,
        device=device,
    )
