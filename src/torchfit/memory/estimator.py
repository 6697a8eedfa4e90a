"""`estimate`: the analytic, explainable estimator, one door for every kind of model.

Whatever names the model goes through the one resolver (`resolve_model`: a config or
module, a folder, a torchvision/timm name, the catalog, the Hugging Face cache, the
Hub). Then:

* a transformers family with a closed form (GPT-2, Llama-style decoders, BERT-style
  encoders, Mixtral- and Qwen-MoE blocks) goes to the closed forms
  (`torchfit.memory.analytic.transformer`);
* an image model, or any ``nn.Module`` with an input shape, to a meta-device pass
  (`torchfit.memory.modules`);
* any other transformers architecture (T5, BART, Whisper, BLOOM, Falcon, OPT,
  GPT-NeoX, Gemma 2, ...) to a meta-device pass of the model built from its config,
  with token ids of ``(batch, seq)`` as its input; a bitsandbytes 4/8-bit base there
  takes bitsandbytes' layout (`torchfit.memory.modules.quantized`).

None of them builds the model in memory. The first note of the estimate says which
path produced the numbers (``method: ...``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torchfit._core import checks
from torchfit._core.step import OptimizerName, resolve_numerics
from torchfit._core.units import DType, parse_dtype
from torchfit.memory.analytic.arch import describe, has_closed_form
from torchfit.memory.analytic.quantized import check_quantize_head
from torchfit.memory.analytic.transformer import estimate_transformer
from torchfit.memory.catalog.build import (
    recorded_dtype,
)
from torchfit.memory.catalog.resolve import (
    build_model,
    is_vision,
    resolve_model,
    vision_input_shape,
)
from torchfit.memory.knobs import (
    ESTIMATE_RULES,
    check_base_dtype,
    check_generation,
    kbit_prepare_of,
    loop_of,
    lora_of,
    quantization_of,
    refuse_for_meta_pass,
    with_compute,
)
from torchfit.memory.modules.configs import by_meta_pass
from torchfit.memory.modules.peak import estimate_module
from torchfit.memory.modules.quantized import quantized_meta_pass
from torchfit.memory.result import MemoryEstimate

__all__ = ["estimate"]

_DEVICES = ("cuda", "cpu")


@checks.arguments(**ESTIMATE_RULES)
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
    bitsandbytes_version: str | None = None,
    double_quant: bool | None = None,
    quantize_head: bool = False,
    base_dtype: str | DType | None = None,
    max_new_tokens: int | None = None,
    kbit_prepare: bool | None = None,
    quantization: Any = None,
) -> MemoryEstimate:
    """Predict the peak memory of one training or inference step.

    Args:
        model: A catalog name (``"gpt2"``, ``"llama-3.1-8b"``), a Hugging Face Hub id
            (``"meta-llama/Llama-3.1-8B"``: the catalog, the local cache, then the Hub,
            config.json only), ``"torchvision/resnet50"`` or ``"timm/convnext_tiny"``, a
            local ``config.json`` or model directory, a transformers config or model, or
            any ``nn.Module`` (then ``input_shape`` is required and activations come from a
            meta-device pass).
        batch_size: Samples per step.
        seq_len: Tokens per sample (transformers; defaults to the model's maximum).
        input_shape: Shape of one sample for non-transformer models, e.g. ``(3, 224, 224)``.
        dtype: Compute dtype (``"fp32"``, the default, ``"bf16"``, ``"fp16"``); ``"int8"``/
            ``"int4"``/``"nf4"``/``"fp4"`` quantize the block weights (inference, or
            training adapters only; they compute in bf16 unless ``precision`` says
            otherwise: ``"32-true"`` is bitsandbytes' fp32 compute dtype without autocast).
            Beside ``precision`` it may only name how the weights are held (``"fp32"`` under
            ``"*-mixed"``, the compute dtype under ``"*-true"``) or a quantized base: a
            16-bit ``dtype`` with ``"bf16-mixed"`` is refused, since it would also read as
            the dtype the model is loaded in (``base_dtype`` says that for a LoRA base).
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
        max_new_tokens: Inference is ``model.generate(prompt, max_new_tokens=...)`` of a
            ``seq_len``-token prompt, not one forward: the prompt's forward makes the last
            position's logits only (transformers 4.45+), and the cache grows to ``seq_len
            + max_new_tokens``; the peak is the prefill or the last decoding step.
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
        bitsandbytes_version: The bitsandbytes a 4-bit QLoRA run uses (default: the
            installed one): before 0.43.2 every 4-bit Linear kept its input for backward.
        double_quant: With a 4-bit ``dtype``: the absmax values quantized again
            (``bnb_4bit_use_double_quant``, torchfit.quantize's default, and the default
            here); ``False``: one fp32 absmax per 64 weights.
        quantize_head: The output head is quantized too (transformers keeps it in 16 bits
            unless your skip list leaves it out); not possible for a tied head.
        base_dtype: The dtype a frozen base (LoRA under mixed precision) is held in.
            Default: the checkpoint's (the config's ``dtype``), as ``from_pretrained``
            loads it; ``"fp32"`` for a base loaded in fp32 (Lightning's ``*-mixed``).
            With a 4-bit ``dtype``: the dtype its weights were quantized from, which
            bitsandbytes dequantizes them back to before copying to the compute dtype
            (``from_pretrained(dtype=...)``; ``"fp16"`` for Lightning Fabric's
            ``BitsandbytesPrecision``, and bitsandbytes before 0.43 uses fp16 anyway).
            Default there: the compute dtype.
        quantization: A ``transformers.BitsAndBytesConfig`` (or its dict), as passed to
            ``from_pretrained(quantization_config=...)``, instead of ``dtype``/
            ``double_quant``/``quantize_head``: its 4/8-bit format, double quantization,
            ``llm_int8_skip_modules`` (the head only) and ``bnb_4bit_compute_dtype`` (the
            compute dtype when no ``precision`` says autocast: transformers' default
            float32 trains the whole step in fp32). See `torchfit._bnb.config` for the
            fields read and those left out knowingly.
        kbit_prepare: With a 4/8-bit ``dtype`` in training: the base went through PEFT's
            ``prepare_model_for_kbit_training`` before ``get_peft_model``, as in Hugging
            Face's QLoRA notebook and TRL's ``SFTTrainer``: its embeddings, norms and head
            are fp32, so are the residual stream and the quantized Linears' outputs, and
            under autocast the fp32 head's 16-bit copy is kept for backward. Default: on,
            unless the model itself is 16-bit (``precision='bf16-true'``); ``False`` for
            recipes that call ``get_peft_model`` on the loaded 4-bit model directly (the
            rest then stays in the dtype it was loaded in). The recipe also turns on
            gradient checkpointing by default: pass ``gradient_checkpointing=True`` for it.

    Returns:
        A `MemoryEstimate` with per-block rows in ``layers`` and the rules in ``notes``.

    Raises:
        ValueError: bad sizes, ``seq_len`` beyond the model's positions, an unknown name
            (or a Hub id that could not be read: offline, gated), optimizer or dtype;
            ``kbit_prepare`` without a quantized training step.
        TypeError: ``model`` is not a name, path, config or module.

    Example:
        >>> from transformers import GPT2Config
        >>> e = estimate(GPT2Config(), batch_size=8, seq_len=1024, dtype="bf16")
        >>> round(e.total / 2**30, 1) > 4  # GPT-2 small at 8 x 1024 in bf16 AMP
        True
        >>> print(estimate("t5-small", batch_size=8, seq_len=512).notes[0])  # doctest: +ELLIPSIS
        method: meta-device pass of T5ForConditionalGeneration built from its config (no ...
    """
    if device not in _DEVICES:
        raise ValueError(f"device must be 'cuda' or 'cpu'; got {device!r}")
    dtype, double_quant, quantize_head, bnb_compute = quantization_of(
        quantization, dtype=dtype, double_quant=double_quant, quantize_head=quantize_head
    )
    numerics = resolve_numerics(precision=precision, dtype=dtype, mixed_precision=mixed_precision)
    numerics = with_compute(numerics, bnb_compute, precision=precision)
    loop = loop_of(
        gradient_accumulation_steps,
        set_to_none=set_to_none,
        keep_output=keep_output,
        in_backward=optimizer_in_backward,
        loss_chunk=loss_chunk_size,
    )
    check_generation(max_new_tokens, mode=mode, use_cache=use_cache)
    dtype, mixed_precision = numerics.weights, numerics.mixed
    prepared = kbit_prepare_of(
        given=kbit_prepare,
        weights=dtype,
        mode=mode,
        mixed=mixed_precision,
        compute=numerics.compute,
    )
    wants_lora = any(v is not None for v in (lora, lora_rank, lora_targets, lora_dropout))
    check_base_dtype(
        base_dtype,
        weights=dtype,
        compute=numerics.compute,
        mode=mode,
        mixed=mixed_precision,
        frozen=wants_lora or trainable_params is not None or bool(frozen_base),
    )
    resolved = resolve_model(model)
    options: dict[str, Any] = {
        "batch_size": batch_size,
        "dtype": dtype,
        "mode": mode,
        "optimizer": optimizer,
        "mixed_precision": mixed_precision,
        "device": device,
        "loop": loop,
    }
    config = resolved.config
    if input_shape is not None and config is not None and not is_vision(config):
        raise ValueError(
            f"input_shape={input_shape!r} is the shape of one image or sample, but model_type "
            f"{config.model_type!r} takes tokens; give seq_len= (tokens per sample) instead "
            "and leave input_shape out"
        )
    if config is None or not has_closed_form(config):
        refuse_for_meta_pass(
            lora=wants_lora and (config is None or is_vision(config)),
            chunked=loss_chunk_size is not None and (config is None or is_vision(config)),
        )
    if config is None:  # a plain module: the user's, LeNet/AlexNet, torchvision, timm
        shape = input_shape or resolved.input_shape
        if shape is None or resolved.module is None:
            raise ValueError(
                "an nn.Module needs input_shape=(...) of one sample, e.g. (3, 224, 224)"
            )
        found = estimate_module(resolved.module, input_shape=shape, **options)
        return _noted(found, f"method: meta-device pass of {type(resolved.module).__name__}")
    if has_closed_form(config):
        spec = describe(config)
        found = estimate_transformer(
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
            lora=lora_of(spec, lora, lora_rank, lora_targets, lora_dropout),
            bitsandbytes_version=bitsandbytes_version,
            double_quant=double_quant,
            quantize_head=quantize_head,
            base_dtype=_base_dtype(config, base_dtype, quantized=dtype.is_quantized),
            new_tokens=max_new_tokens,
            kbit_prepare=prepared,
        )
        return _noted(found, f"method: closed form for model_type {spec.model_type!r}")
    if is_vision(config):
        shape = input_shape or vision_input_shape(config)
        built = build_model(config, device="meta", dtype="fp32")
        found = estimate_module(built, input_shape=shape, **options)
        return _noted(found, f"method: meta-device pass of {type(built).__name__}")
    unsupported = {
        "gradient_checkpointing": gradient_checkpointing,
        "trainable_params": trainable_params is not None,
        "frozen_base": bool(frozen_base),
    }
    asked = [name for name, on in unsupported.items() if on]
    if asked:
        raise ValueError(
            f"model_type {config.model_type!r} has no closed form, and its meta-device pass "
            f"does not model {', '.join(asked)}; trace the real step instead: "
            "torchfit.memory.trace(build_model(name), batch) (torchfit plan --trace)"
        )
    adapters = (
        {"lora": lora, "rank": lora_rank, "targets": lora_targets, "dropout": lora_dropout}
        if wants_lora
        else None
    )
    weights = parse_dtype(dtype)
    if weights.is_quantized:
        return quantized_meta_pass(
            config,
            weights=weights,
            seq_len=seq_len,
            attention=attn_implementation,
            adapters=adapters,
            double_quant=double_quant,
            head=quantize_head,
            bitsandbytes_version=bitsandbytes_version,
            base_dtype=_base_dtype(config, base_dtype, quantized=True),
            kbit_prepare=prepared,
            loss_chunk=loss_chunk_size,
            new_tokens=max_new_tokens,
            **{**options, "dtype": numerics.compute},
        )
    check_quantize_head(weights, head=quantize_head, tied=False)
    # autocast (the default for 16-bit training) keeps fp32 masters of what trains only
    mixed = parse_dtype(dtype).bits == 16 if mixed_precision is None else mixed_precision
    frozen = _base_dtype(config, base_dtype) if wants_lora and mixed else None
    return by_meta_pass(
        config,
        seq_len=seq_len,
        attention=attn_implementation,
        adapters=adapters,
        frozen_dtype=frozen,
        loss_chunk=loss_chunk_size,
        new_tokens=max_new_tokens,
        **options,
    )


def _base_dtype(config: Any, given: str | DType | None, *, quantized: bool = False) -> DType | None:
    """The frozen base's dtype: as given, else the one the checkpoint records.

    A quantized base has none by default: its 4-bit weights count as quantized from the
    compute dtype (``from_pretrained(dtype=...)`` matching ``bnb_4bit_compute_dtype``).
    """
    if given is not None:
        return parse_dtype(given)
    if quantized:
        return None
    recorded = recorded_dtype(config)
    return None if recorded is None else parse_dtype(recorded)


def _noted(found: MemoryEstimate, method: str) -> MemoryEstimate:
    """The estimate with the path that produced it as its first note."""
    return found.replace(notes=(method, *found.notes))
