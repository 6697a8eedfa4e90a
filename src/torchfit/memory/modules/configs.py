"""Any transformers architecture without a closed form: a meta-device pass from its config.

The model is built on the meta device from its config (once per config), run on token
ids of the asked batch and sequence (`estimate_module`), and the start of backward is
given the loss's logit gradients; for inference, the KV cache the forward returns is
reported apart.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from torchfit._core.step import Loop, parse_mode
from torchfit._core.units import DType, parse_dtype
from torchfit.memory.analytic.formulas import FP32
from torchfit.memory.analytic.generation import generation_moments
from torchfit.memory.analytic.states import chunked_loss_peak
from torchfit.memory.catalog.build import instantiate, model_class_for, transformers_without_data
from torchfit.memory.catalog.inputs import (
    DEFAULT_SEQUENCE,
    example_batch,
    loss_tokens,
    sequence_limit,
)
from torchfit.memory.modules.adapters import with_adapters
from torchfit.memory.modules.checkpointed import (
    checkpointed_layers,
    layer_input_bytes,
    with_checkpointing,
)
from torchfit.memory.modules.chunked import ChunkedLoss
from torchfit.memory.modules.peak import estimate_module
from torchfit.memory.result import MemoryEstimate

__all__ = ["by_meta_pass", "cache_apart", "meta_model", "pass_sequence"]


#: Models built on meta for the fallback, by config: `fits` estimates one model many times.
_BUILT: dict[tuple[str, str], Any] = {}
_KEEP = 4


def pass_sequence(config: Any, seq_len: int | None) -> Any:
    """The tokens per sample of the pass: ``seq_len``, else the model's limit or 512."""
    return seq_len if seq_len is not None else sequence_limit(config) or DEFAULT_SEQUENCE


def meta_model(config: Any, attention: str) -> Any:
    """The model built on meta from its config (fp32; the pass casts), once per config.

    Shared, not copied: callers that change it (adapters, quantized layers) wrap it or
    read it only.
    """
    key = (config.to_json_string(use_diff=False), attention)
    if key not in _BUILT:
        if len(_BUILT) >= _KEEP:
            _BUILT.pop(next(iter(_BUILT)))
        config = copy.deepcopy(config)
        if attention == "eager":
            config._attn_implementation = "eager"  # noqa: SLF001 - how transformers reads it
        model = instantiate(config, model_class_for(config), torch.float32)
        # no padding check: it reads token values (DeBERTa, ...), which meta tensors lack;
        # the pass never shifts labels (decoder ids are given), the only other use of it
        model.config.pad_token_id = None  # type: ignore[union-attr]
        _BUILT[key] = model
    return _BUILT[key]


def by_meta_pass(
    config: Any,
    *,
    seq_len: int | None,
    attention: str,
    adapters: dict[str, Any] | None = None,
    frozen_dtype: DType | None = None,
    loss_chunk: int | None = None,
    new_tokens: int | None = None,
    prepare: Callable[[nn.Module], None] | None = None,
    checkpointing: bool = False,
    fp32_stream: bool | None = None,
    **options: Any,
) -> MemoryEstimate:
    """Any transformers architecture: a meta-device pass with token ids as its input.

    With ``adapters`` (LoRA arguments of `estimate`), PEFT's own layers are added to a copy
    first (`with_adapters`) and the base is frozen, in ``frozen_dtype`` when given.

    The pass gives what autograd saves, layer by layer (`estimate_module`). A step whose
    model computes its loss from ``labels`` also holds, at the start of backward, two
    logits-sized fp32 gradients (of the log-softmax and of the logits) instead of the
    model's outputs, which torchfit's step drops before backward: measured with the
    tracer on BLOOM, Falcon, T5, GPTBigCode, OPT, GPT-NeoX and Gemma 2.

    ``options["dtype"]`` is the compute dtype: a quantized base comes through
    `quantized_meta_pass`, which passes its compute dtype here.

    With ``loss_chunk`` (training), a causal LM's head and loss run that many positions at
    a time (`ChunkedLoss`), and those gradients are one chunk's. With ``new_tokens``
    (inference), the prompt's forward asks for the last position's logits only, as
    ``generate`` does, and `generation_moments` adds the decoding steps.

    ``prepare`` changes the adapted copy before the pass (never the shared base model):
    it needs ``adapters``. ``checkpointing``: transformers' gradient checkpointing of its
    decoder layers (`torchfit.memory.modules.checkpointed`), each keeping its input in
    fp32 with ``fp32_stream`` (fp32 embeddings and norms: fp32 weights under autocast by
    default, a prepared 4-bit base), else in the pass's dtype.
    """
    limit = sequence_limit(config)
    seq = pass_sequence(config, seq_len)
    if isinstance(seq, bool) or not isinstance(seq, int) or seq <= 0:
        raise ValueError(f"seq_len must be a positive integer; got {seq!r}")
    if limit is not None and seq > limit and not getattr(config, "is_encoder_decoder", False):
        raise ValueError(
            f"seq_len={seq} is beyond this model's {limit} positions; use seq_len <= {limit}"
        )
    model = _pass_model(config, attention, adapters, prepare)
    training = parse_mode(options["mode"]).value == "train"
    batch = example_batch(model, batch_size=options["batch_size"], seq_len=seq, training=training)
    chunk = loss_chunk if training and "labels" in batch else None
    run = model if chunk is None else ChunkedLoss(model, chunk=chunk)
    if new_tokens is not None and not training:
        run = LastLogits(model)
    layers = checkpointed_layers(model) if checkpointing and training else []
    with contextlib.ExitStack() as stack:
        stack.enter_context(transformers_without_data())
        first = stack.enter_context(layer_input_bytes(model, layers[0])) if layers else []
        found = estimate_module(run, example_inputs=batch, frozen_dtype=frozen_dtype, **options)
    if checkpointing and training:  # fp32 weights under autocast: fp32 embeddings, norms
        mixed = parse_dtype(options["dtype"]).autocasts(mixed=options.get("mixed_precision"))
        stream = (frozen_dtype is None and mixed) if fp32_stream is None else fp32_stream
        found = _checkpointed(found, layers, first, fp32_stream=stream)
    built = type(meta_model(config, attention)).__name__
    method = (
        f"method: meta-device pass of {built} built from its config (no closed "
        f"form for model_type {config.model_type!r}); {seq} tokens per sample"
    )
    if adapters is not None:
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        found = found.replace(
            notes=(
                *found.notes,
                f"LoRA adapters placed by PEFT: {trainable:,} trainable parameters",
            )
        )
    head = model.get_output_embeddings()
    tokens = loss_tokens(batch)
    if chunk is not None:
        tokens = min(tokens, batch["labels"].shape[0] * chunk)
        note = f"loss in chunks of {chunk} positions: one chunk's logit gradients"
        found = found.replace(notes=(*found.notes, note))
    if training and tokens and head is not None:
        vocab = int(head.weight.shape[0])
        kept = _output_bytes(model, batch, options) if options["loop"].keep_output else 0
        found = _with_loss_gradients(
            found,
            2 * tokens * vocab * FP32,
            model=model,
            head=head,
            kept_output=kept,
            chunk=chunk,
            seq_len=seq,
            **options,
        )
    if not training:
        found = cache_apart(found, model, batch, parse_dtype(options["dtype"]))
    if not training and new_tokens is not None:
        vocab = int(head.weight.shape[0])
        found = _generation(
            found, model, batch, parse_dtype(options["dtype"]), new_tokens=new_tokens, vocab=vocab
        )
    return found.replace(notes=(method, *found.notes))


def _checkpointed(
    found: MemoryEstimate, layers: list[str], first: list[int], *, fp32_stream: bool
) -> MemoryEstimate:
    """``found`` checkpointed: each layer keeps its input, fp32 with ``fp32_stream``.

    ``first`` is ``[elements, bytes per element]`` of one input as the pass ran it.
    """
    elements, itemsize = first or (0, 0)
    width = FP32 if fp32_stream else itemsize
    return with_checkpointing(found, layers, input_bytes=math.ceil(elements * width))


def _pass_model(
    config: Any,
    attention: str,
    adapters: dict[str, Any] | None,
    prepare: Callable[[nn.Module], None] | None,
) -> Any:
    """The model the pass runs: the shared meta model, or its adapted copy, prepared."""
    model = meta_model(config, attention)
    if adapters is not None:
        model = with_adapters(model, **adapters)
    if prepare is not None:
        if adapters is None:
            raise ValueError("prepare= changes the adapted copy; it needs adapters=")
        prepare(model)
    return model


class LastLogits(nn.Module):
    """``model``'s forward as ``generate`` calls it on the prompt: the last logits only."""

    def __init__(self, model: nn.Module) -> None:
        """Wrap ``model`` (its parameters are this module's)."""
        super().__init__()
        self.model = model
        self.keeps = "logits_to_keep" in inspect.signature(model.forward).parameters

    def forward(self, **inputs: Any) -> Any:
        """The forward with ``logits_to_keep=1`` where the model takes it."""
        return self.model(**inputs, **({"logits_to_keep": 1} if self.keeps else {}))


def _generation(
    found: MemoryEstimate,
    model: nn.Module,
    batch: dict[str, Any],
    dtype: DType,
    *,
    new_tokens: int,
    vocab: int,
) -> MemoryEstimate:
    """The prompt's pass (``found``, its cache apart) and the decoding steps after it."""
    ids = batch["input_ids"]
    longer = {**batch, "input_ids": ids.new_empty((ids.shape[0], ids.shape[1] + new_tokens))}
    lm: Any = model
    moments = generation_moments(
        prefill=found.activations,
        kv_prompt=found.kv_cache,
        kv_total=_cache_bytes(model, longer, dtype),
        num_layers=int(getattr(lm.config, "num_hidden_layers", 1) or 1),
        rows=int(ids.shape[0]),
        vocab=vocab,
        itemsize=dtype.itemsize,
        new_tokens=new_tokens,
    )
    return found.replace(
        activations=moments.activations,
        kv_cache=moments.kv_cache,
        notes=(*found.notes, moments.note),
        peak_at=moments.peak_at,
    )


def cache_apart(
    found: MemoryEstimate, model: nn.Module, batch: dict[str, Any], dtype: DType
) -> MemoryEstimate:
    """Inference: the KV cache the forward returns, as ``kv_cache`` (it was in the output).

    Self-attention keys and values of every decoder layer, and for encoder-decoders the
    cross-attention ones over the encoder's sequence, as one more meta forward returns
    them (the model is built in fp32: scaled to the compute dtype).
    """
    kv = _cache_bytes(model, batch, dtype)
    if not kv or kv > found.activations:
        return found
    what = (
        "self- and cross-attention"
        if getattr(model.config, "is_encoder_decoder", False)
        else "self-attention"
    )
    note = f"inference returns the KV cache of every decoder layer ({what})"
    return found.replace(
        activations=found.activations - kv, kv_cache=kv, notes=(*found.notes, note)
    )


def _cache_bytes(model: nn.Module, batch: dict[str, Any], dtype: DType) -> int:
    """Bytes of the KV cache one more meta forward of ``batch`` returns, in ``dtype``.

    The model is built in fp32: sizes are scaled to the compute dtype.
    """
    with torch.no_grad(), transformers_without_data():
        output = LastLogits(model)(**batch, use_cache=True)
    return _float_bytes(getattr(output, "past_key_values", None), dtype)


def _output_bytes(model: nn.Module, batch: dict[str, Any], options: dict[str, Any]) -> int:
    """Bytes of the floating-point tensors a training forward returns, but the loss.

    One more forward on meta tensors; the model is built in fp32, so sizes are scaled to
    the compute dtype, the logits to fp32 where the loop casts them (Lightning Fabric's
    ``convert_output``, which leaves a cache object as it is).
    """
    with torch.no_grad(), transformers_without_data():
        output = model(**batch)
    dtype = parse_dtype(options["dtype"])
    logits = DType.FP32 if options["loop"].fp32_output else dtype
    if not isinstance(output, dict):
        return _float_bytes([output], logits)
    parts = [v for k, v in output.items() if k not in {"loss", "logits"}]
    return _float_bytes(parts, dtype) + _float_bytes([output.get("logits")], logits)


def _float_bytes(value: Any, dtype: DType) -> int:
    """Bytes of the floating-point tensors inside ``value`` (`_tensors`), each in ``dtype``."""
    leaves = [t for t in _tensors(value) if t.is_floating_point()]
    return math.ceil(sum(t.numel() for t in leaves) * dtype.itemsize)


def _tensors(value: Any) -> list[torch.Tensor]:
    """Every tensor inside a cache object, list or tuple (transformers' Cache classes too)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for item in value for t in _tensors(item)]
    if value is None:
        return []
    found: list[torch.Tensor] = []
    for name in ("self_attention_cache", "cross_attention_cache"):
        found += _tensors(getattr(value, name, None))
    for layer in getattr(value, "layers", None) or []:
        found += _tensors([getattr(layer, "keys", None), getattr(layer, "values", None)])
    return found


def _with_loss_gradients(
    found: MemoryEstimate,
    loss_grads: int,
    *,
    model: nn.Module,
    head: nn.Module | None,
    kept_output: int,
    loop: Loop,
    dtype: str | DType,
    mixed_precision: bool | None,
    batch_size: int,
    chunk: int | None = None,
    seq_len: int = 0,
    **_options: Any,
) -> MemoryEstimate:
    """The start of backward with the loss's logits gradients, not the model's outputs.

    Beside them: the gradients of earlier micro-batches (accumulated, or zeroed in place)
    and the output (logits, and the KV cache a model with ``use_cache`` returns) when the
    caller keeps it through backward. With the loss in chunks, a trained head's per-chunk
    weight gradients are summed in backward (`chunked_loss_peak`).
    """
    compute = parse_dtype(dtype)
    saved = sum(layer.activations for layer in found.layers)
    weight = getattr(head, "weight", None)
    trained = weight is not None and weight.requires_grad
    summed = chunked_loss_peak(
        saved,
        head_params=weight.numel() if weight is not None and trained else 0,
        itemsize=compute.itemsize,
        rows=batch_size,
        seq_len=seq_len,
        chunk=chunk,
        vocab=0 if weight is None else int(weight.shape[0]),
        logits_kept=loop.keep_output,
    )
    loss_grads = max(loss_grads, summed - saved)
    kept = 0
    if loop.gradients_during_forward:
        mixed = compute.autocasts(mixed=mixed_precision)
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        kept = math.ceil(trainable * compute.master(mixed=mixed).itemsize)
    output = kept_output if loop.keep_output else 0
    start = found.replace(
        gradients=kept,
        activations=saved,
        workspace=loss_grads + output,
        peak_at="start of backward",
    )
    if found.peak_at == "start of backward" or start.total > found.total:
        note = "start of backward: two logits-sized fp32 gradients of the loss"
        return start.replace(notes=(*found.notes, note))
    return found
