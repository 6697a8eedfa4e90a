"""`estimate`: the analytic, explainable estimator.

From a description of the model (a transformers config, a catalog name, or an
``nn.Module`` with an input shape) to a `MemoryEstimate`, without building the model.
The peak of a training step is the larger of two moments (the tests check both):

* the start of backward: weights, optimizer state, every saved activation, and the
  loss's two logits-sized fp32 gradients;
* the optimizer step: weights, optimizer state, all gradients, and the optimizer's
  temporaries (``foreach`` lists on CUDA, one tensor at a time on CPU).

Between the two, activations are freed as gradients appear, so the line between them
holds no higher point. Inference keeps no activations: weights, the KV cache when the
model returns one, the logits, and the largest transient of one block.
"""

from __future__ import annotations

import math
from typing import Any

from torchfit._core.step import Mode, OptimizerName, parse_mode, parse_optimizer
from torchfit._core.units import DType, parse_dtype
from torchfit.memory.analytic.arch import TransformerSpec, describe
from torchfit.memory.analytic.blocks import (
    BlockSettings,
    block_terms,
    head_terms,
    inference_transient,
    mlp_backward_width,
)
from torchfit.memory.analytic.formulas import (
    FP32,
    INT64,
    ModelStates,
    kv_cache_bytes,
    model_state_bytes,
    parse_attention,
)
from torchfit.memory.result import LayerMemory, MemoryEstimate

__all__ = ["estimate", "estimate_transformer"]

_DEVICES = ("cuda", "cpu")


def _resolve_config(model: Any) -> Any:
    if hasattr(model, "model_type") and hasattr(model, "to_dict"):
        return model  # a transformers config
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "model_type"):
        return config  # a transformers model: its config describes it
    from torchfit.memory.catalog import model_config  # noqa: PLC0415 - needs transformers

    return model_config(model)


def estimate(
    model: Any,
    *,
    batch_size: int,
    seq_len: int | None = None,
    input_shape: tuple[int, ...] | None = None,
    dtype: str | DType = "fp32",
    mode: str = "train",
    optimizer: str | OptimizerName | None = "adamw",
    gradient_checkpointing: bool = False,
    attn_implementation: str = "sdpa",
    mixed_precision: bool | None = None,
    trainable_params: int | None = None,
    use_cache: bool | None = None,
    device: str = "cuda",
    frozen_base: bool | None = None,
) -> MemoryEstimate:
    """Predict the peak memory of one training or inference step.

    Args:
        model: A catalog name (``"gpt2"``, ``"llama-2-7b"``), a local ``config.json`` or
            model directory, a transformers config or model, or any ``nn.Module`` (then
            ``input_shape`` is required and activations come from a meta-device pass).
        batch_size: Samples per step.
        seq_len: Tokens per sample (transformers; defaults to the model's maximum).
        input_shape: Shape of one sample for non-transformer models, e.g. ``(3, 224, 224)``.
        dtype: Compute dtype (``"fp32"``, ``"bf16"``, ``"fp16"``); ``"int8"``/``"int4"``/
            ``"nf4"`` quantize the block weights (inference, or training adapters only).
        mode: ``"train"`` or ``"inference"``.
        optimizer: ``"sgd"``, ``"sgd-momentum"``, ``"adam"``, ``"adamw"``, ``"adamw-8bit"``
            or ``None``.
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
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive integer; got {batch_size!r}")
    from torch import nn  # noqa: PLC0415 - torch is always there; keeps the branch readable

    if isinstance(model, nn.Module) and not hasattr(getattr(model, "config", None), "model_type"):
        from torchfit.memory.modules.peak import estimate_module  # noqa: PLC0415

        if input_shape is None:
            raise ValueError(
                "an nn.Module needs input_shape=(...) of one sample, e.g. (3, 224, 224)"
            )
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
    config = _resolve_config(model)
    try:
        spec = describe(config)
    except ValueError:
        if not _is_vision(config):
            raise
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
    )


#: Fewer than 1/10 of the parameters training is taken as adapters over a frozen base.
_ADAPTER_SHARE = 10


def adapters_only(trainable: int | None, params: int) -> bool:
    """Whether ``trainable`` of ``params`` parameters look like adapters (LoRA) on a frozen base.

    Example:
        >>> adapters_only(4_000_000, 7_000_000_000), adapters_only(None, 10)
        (True, False)
    """
    return trainable is not None and trainable * _ADAPTER_SHARE <= params


def _is_vision(config: Any) -> bool:
    return hasattr(config, "num_channels") or hasattr(config, "image_size")


def vision_input_shape(config: Any) -> tuple[int, int, int]:
    """One image as the config describes it: ``(num_channels, image_size, image_size)``.

    Example:
        >>> from transformers import ResNetConfig
        >>> vision_input_shape(ResNetConfig())
        (3, 224, 224)
    """
    size = getattr(config, "image_size", 224)
    size = size[0] if isinstance(size, list | tuple) else size
    return (int(getattr(config, "num_channels", 3)), int(size), int(size))


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
    from torchfit.memory.catalog import build_model  # noqa: PLC0415
    from torchfit.memory.modules.peak import estimate_module  # noqa: PLC0415

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


def elem_of(mixed: bool, compute: DType) -> float:  # noqa: FBT001 - a pure helper
    """Bytes per parameter element: fp32 master weights under mixed precision."""
    return FP32 if mixed or compute is DType.TF32 else compute.itemsize


def _largest_tensor(spec: TransformerSpec) -> int:
    """Elements of the largest parameter tensor (the embedding or the MLP weight)."""
    return max(spec.vocab * spec.hidden, spec.hidden * spec.intermediate, 3 * spec.hidden**2)


def estimate_transformer(
    spec: TransformerSpec,
    *,
    batch_size: int,
    seq_len: int,
    dtype: str | DType = "fp32",
    mode: str = "train",
    optimizer: str | OptimizerName | None = "adamw",
    gradient_checkpointing: bool = False,
    attn_implementation: str = "sdpa",
    mixed_precision: bool | None = None,
    trainable_params: int | None = None,
    use_cache: bool | None = None,
    device: str = "cuda",
    frozen_base: bool | None = None,
) -> MemoryEstimate:
    """`estimate` for a `TransformerSpec` (see `estimate` for the arguments)."""
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len <= 0:
        raise ValueError(f"seq_len must be a positive integer; got {seq_len!r}")
    if seq_len > spec.max_positions:
        raise ValueError(
            f"seq_len={seq_len} is beyond this model's {spec.max_positions} positions; "
            f"use seq_len <= {spec.max_positions}"
        )
    step = parse_mode(mode)
    training = step is Mode.TRAIN
    weights_format = parse_dtype(dtype)
    compute = DType.BF16 if weights_format.is_quantized else weights_format
    mixed = training and compute.bits == 16 if mixed_precision is None else mixed_precision
    opt = parse_optimizer(optimizer) if training else OptimizerName.NONE
    notes: list[str] = []

    trainable = spec.num_params if trainable_params is None else trainable_params
    if weights_format.is_quantized and training and trainable_params is None:
        raise ValueError(
            f"training with {weights_format.value} weights needs adapters: pass "
            "trainable_params=<LoRA parameters> (torchfit plan: --trainable-params N); the "
            "quantized base stays frozen"
        )
    states = model_state_bytes(
        params=spec.num_params,
        trainable=trainable,
        dtype=compute,
        mixed_precision=mixed,
        optimizer=opt,
        training=training,
        num_tensors=spec.num_tensors if trainable == spec.num_params else 0,
        # bitsandbytes' 4/8-bit matmuls dequantize inside their own autograd function and
        # save the quantized weight, so autocast keeps 16-bit copies of the adapters only
        autocast_params=trainable if weights_format.is_quantized else spec.linear_params,
    )
    weights = states.weights
    if weights_format.is_quantized:
        from torchfit.memory.analytic.quantized import quantized_weight_bytes  # noqa: PLC0415

        weights = quantized_weight_bytes(spec, weights_format, compute)
        if training:  # the adapters, at full precision beside the frozen quantized base
            weights += math.ceil(trainable * (4 if mixed else compute.itemsize))
        notes.append(
            f"block weights in {weights_format.value}; embeddings, norms, head in {compute.value}"
        )
    if weights_format.is_quantized and training:
        notes.append(f"adapters ({trainable:,} parameters): {states.note}")
    elif not weights_format.is_quantized:  # quantized inference: said above
        notes.append(states.note)

    settings = BlockSettings(
        dtype=compute,
        attention=parse_attention(attn_implementation),
        device=device,
        training=training,
        frozen_base=training
        and (adapters_only(trainable, spec.num_params) if frozen_base is None else frozen_base),
    )
    if not training:
        return _inference(
            spec,
            settings,
            batch_size=batch_size,
            seq_len=seq_len,
            weights=weights,
            use_cache=use_cache,
            notes=notes,
        )

    return _training_peak(
        spec,
        settings,
        batch_size=batch_size,
        seq_len=seq_len,
        weights=weights,
        states=states,
        optimizer=opt,
        mixed=mixed,
        trainable=trainable,
        gradient_checkpointing=gradient_checkpointing,
        notes=notes,
    )


def _training_peak(
    spec: TransformerSpec,
    settings: BlockSettings,
    *,
    batch_size: int,
    seq_len: int,
    weights: int,
    states: ModelStates,
    optimizer: OptimizerName,
    mixed: bool,
    trainable: int,
    gradient_checkpointing: bool,
    notes: list[str],
) -> MemoryEstimate:
    """The larger of the start of backward and the optimizer step (module docstring)."""
    compute, device, opt = settings.dtype, settings.device, optimizer
    tokens = batch_size * seq_len
    block = block_terms(spec, seq_len, settings)
    per_block = math.ceil(tokens * sum(t.per_token for t in block))
    head = math.ceil(tokens * sum(t.per_token for t in head_terms(spec, settings)))
    if gradient_checkpointing:
        kept = math.ceil(spec.num_layers * tokens * spec.hidden * compute.itemsize)
        activations = kept + per_block + head
        notes.append("gradient checkpointing: block inputs kept, one block recomputed")
    else:
        activations = spec.num_layers * per_block + head
    layers = tuple(
        LayerMemory(f"block {k}", spec.family.value, per_block, "; ".join(t.name for t in block))
        for k in range(spec.num_layers)
    )
    # Start of backward: the loss gradient w.r.t. the log-softmax and the logits (fp32).
    loss_grads = 2 * tokens * spec.vocab * FP32
    # Then the top block's MLP backward: the head's gradients exist (tied: the embedding's)
    # and the activation's chain of intermediates gets a gradient each (measured with the
    # tracer: gelu_new's backward holds about four i-wide tensors at once).
    mlp_grads = math.ceil(tokens * mlp_backward_width(spec) * compute.itemsize)
    head_grad = math.ceil(spec.vocab * spec.hidden * elem_of(mixed, compute))
    backward_start = max(activations + loss_grads, activations + head_grad + mlp_grads)
    # Optimizer step: temporaries of AdamW's update (sqrt of v, then its quotient).
    elem = FP32 if mixed or compute is DType.TF32 else compute.itemsize
    if opt in {OptimizerName.ADAM, OptimizerName.ADAMW}:
        if device == "cuda":
            step_temp = math.ceil(trainable * elem)  # foreach: one list the size of all parameters
            notes.append("optimizer step: foreach temporaries (CUDA default)")
        else:
            step_temp = math.ceil(2 * min(trainable, _largest_tensor(spec)) * elem)
            notes.append("optimizer step: one tensor at a time (CPU default)")
    else:
        step_temp = 0
    # End of backward with tied embeddings: the embedding's dense gradient arrives while the
    # LM head's gradient is already in .grad, and their sum is a third tensor (measured).
    tied_sum = math.ceil(2 * spec.vocab * spec.hidden * elem) if spec.tied_embeddings else 0
    step_temp = max(step_temp, tied_sum)
    # Autocast's 16-bit weight copies are saved for backward: alive at its start, gone by
    # the optimizer step.
    if backward_start + states.autocast_copies >= states.gradients + step_temp:
        peak_at = "start of backward"
        act, grads, workspace = activations, 0, backward_start - activations
        copies = states.autocast_copies
    else:
        peak_at = "optimizer step"
        act, grads, workspace, copies = 0, states.gradients, step_temp, 0
    return MemoryEstimate(
        weights=weights,
        gradients=grads,
        optimizer=states.optimizer,
        activations=act,
        workspace=workspace,
        overhead=copies + tokens * INT64,
        device=device,
        notes=tuple(notes),
        layers=layers if act else (),
        peak_at=peak_at,
    )


def _inference(
    spec: TransformerSpec,
    settings: BlockSettings,
    *,
    batch_size: int,
    seq_len: int,
    weights: int,
    use_cache: bool | None,
    notes: list[str],
) -> MemoryEstimate:
    tokens = batch_size * seq_len
    e = settings.dtype.itemsize
    cache = spec.family.value != "bert" if use_cache is None else use_cache
    kv = (
        kv_cache_bytes(
            batch_size=batch_size,
            seq_len=seq_len,
            num_layers=spec.num_layers,
            num_kv_heads=spec.num_kv_heads,
            head_dim=spec.head_dim,
            dtype=settings.dtype,
            sliding_window=spec.sliding_window,
        )
        if cache
        else 0
    )
    if cache:
        notes.append("inference returns the KV cache of every layer")
    transient = math.ceil(tokens * inference_transient(spec, seq_len, settings))
    logits = math.ceil(tokens * spec.vocab * e)
    # Alive through the whole forward: the additive 4D mask eager attention builds
    # (batch x 1 x s x s in the compute dtype) and RoPE's cos/sin tables.
    mask = batch_size * seq_len * seq_len * e if settings.attention.value == "eager" else 0
    rope = 2 * seq_len * spec.head_dim * e if spec.family.value == "llama" else 0
    return MemoryEstimate(
        weights=weights,
        activations=max(transient, logits + math.ceil(tokens * spec.hidden * e)),
        kv_cache=kv,
        overhead=math.ceil(tokens * INT64 + mask + rope),
        device=settings.device,
        notes=tuple(notes),
        peak_at="forward",
    )
