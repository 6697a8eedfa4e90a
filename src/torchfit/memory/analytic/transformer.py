"""The closed-form estimate of a transformer: training and inference peaks, block by block.

`estimate_transformer` puts the model states (weights, gradients, optimizer state, of a
plain, LoRA or quantized model) together with the block settings, then asks
`torchfit.memory.analytic.training` for the training peak or
`torchfit.memory.analytic.inference` for the inference one. Inference keeps no
activations: weights, the KV cache when the model returns one, the logits, and the
largest transient of one block.
"""

from __future__ import annotations

import dataclasses
import math

from torchfit._core.step import Loop, Mode, OptimizerName, parse_mode, parse_optimizer
from torchfit._core.torch_rules import mean_keeps_input
from torchfit._core.units import DType, parse_dtype
from torchfit.memory.analytic.arch import TransformerSpec
from torchfit.memory.analytic.formulas import parse_attention
from torchfit.memory.analytic.inference import inference_estimate
from torchfit.memory.analytic.kbit import kbit_head_params
from torchfit.memory.analytic.lora import LoraSetup, lora_parameters, saved_parameters
from torchfit.memory.analytic.model_states import ModelStates, model_state_bytes
from torchfit.memory.analytic.quantized import (
    bitsandbytes_transients,
    quantized_shapes,
    with_loading,
)
from torchfit.memory.analytic.settings import BlockSettings
from torchfit.memory.analytic.states import (
    adapters_for,
    check_dora,
    dora_recompute_bytes,
    dora_weight_copies,
    frozen_base_states,
    inputs_kept,
    parameter_shapes,
    saved_copy_states,
    weight_bytes,
)
from torchfit.memory.analytic.training import elem_of, training_peak
from torchfit.memory.result import MemoryEstimate

__all__ = ["adapters_only", "elem_of", "estimate_transformer"]

#: Fewer than 1/10 of the parameters training is taken as adapters over a frozen base.
_ADAPTER_SHARE = 10


def adapters_only(trainable: int | None, params: int) -> bool:
    """Whether ``trainable`` of ``params`` parameters look like adapters (LoRA) on a frozen base.

    Example:
        >>> adapters_only(4_000_000, 7_000_000_000), adapters_only(None, 10)
        (True, False)
    """
    return trainable is not None and trainable * _ADAPTER_SHARE <= params


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
    loop: Loop | None = None,
    optimizer_in_backward: bool = False,
    compute_dtype: str | DType | None = None,
    loss_chunk: int | None = None,
    lora: LoraSetup | None = None,
    bitsandbytes_version: str | None = None,
    torch_version: str | None = None,
    double_quant: bool = True,
    quantize_head: bool = False,
    base_dtype: DType | None = None,
    new_tokens: int | None = None,
    kbit_prepare: bool = False,
    bnb_compute_dtype: DType | None = None,
) -> MemoryEstimate:
    """`estimate` for a `TransformerSpec` (see `estimate` for the arguments).

    ``kbit_prepare``: a quantized base trains as PEFT's ``prepare_model_for_kbit_training``
    leaves it (`torchfit.memory.analytic.kbit`); the caller decides the default.
    """
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
    quantized_compute = DType.BF16 if compute_dtype is None else parse_dtype(compute_dtype)
    compute = quantized_compute if weights_format.is_quantized else weights_format
    mixed = compute.autocasts(mixed=mixed_precision, training=training)
    opt = parse_optimizer(optimizer) if training else OptimizerName.NONE
    notes: list[str] = []

    lora = adapters_for(
        spec, lora, trainable_params, weights_format, training=training, notes=notes
    )
    if lora is not None:
        trainable_params, frozen_base = lora_parameters(spec, lora), True
        check_dora(lora, weights_format)
    trainable = spec.num_params if trainable_params is None else trainable_params
    copies = saved_parameters(spec, lora) if lora is not None else 0  # modules_to_save
    adapters = trainable - copies
    autocast = training and mixed and compute.bits == 16
    prepared = training and weights_format.is_quantized and kbit_prepare
    states = model_state_bytes(
        params=spec.num_params,
        trainable=adapters,
        dtype=compute,
        mixed_precision=mixed,
        optimizer=opt,
        training=training,
        num_tensors=spec.num_tensors if trainable == spec.num_params else 0,
        # Adafactor's factored state alone reads the shapes (checked item by item)
        shapes=(
            parameter_shapes(spec)
            if trainable == spec.num_params and opt.base is OptimizerName.ADAFACTOR
            else None
        ),
        # bitsandbytes' 4/8-bit matmuls dequantize inside their own autograd function and
        # save the quantized weight, so autocast keeps 16-bit copies of the adapters only,
        # and of an fp32 head (prepare_model_for_kbit_training's)
        autocast_params=(
            adapters + kbit_head_params(spec, prepared=prepared, quantized_head=quantize_head)
            if weights_format.is_quantized
            else spec.autocast_params
        ),
    )
    frozen = training and (
        adapters_only(trainable, spec.num_params) if frozen_base is None else frozen_base
    )
    frozen_16bit = frozen and mixed and not weights_format.is_quantized
    if frozen_16bit:
        states = frozen_base_states(
            states, spec, trainable=adapters, base=base_dtype, compute=compute, notes=notes
        )
        frozen_16bit = base_dtype is not None and base_dtype.bits == 16
    if lora is not None and training:
        states = dora_weight_copies(
            states, spec, lora, compute, fp32_frozen=autocast and not frozen_16bit
        )
    weights = weight_bytes(
        spec,
        states,
        weights_format,
        compute,
        adapters=adapters if training else 0,
        mixed=mixed,
        double_quant=double_quant,
        head=quantize_head,
        notes=notes,
        prepared=prepared,
    )
    # modules_to_save: the trained copy, in the dtype of the original it copies
    held = DType.FP32 if prepared or (mixed and not frozen_16bit) else (base_dtype or compute)
    if copies and training:
        states, weights = saved_copy_states(states, weights, copies, held, opt, notes=notes)

    settings = BlockSettings(
        dtype=compute,
        attention=parse_attention(attn_implementation),
        device=device,
        training=training,
        frozen_base=frozen,
        autocast=autocast,
        lora=lora if training else None,
        inputs_kept=inputs_kept(weights_format, bitsandbytes_version, training=training),
        # fp32 embeddings and norms: autocast over fp32 weights, or a prepared 4-bit base
        fp32_stream=autocast and not frozen_16bit and (prepared or not weights_format.is_quantized),
        fp32_linear_outputs=weights_format.is_quantized,
        head_trains=lora is not None and "head" in lora.saved,
        mean_keeps_input=mean_keeps_input(torch_version),
        fp32_logits=loop is not None and loop.fp32_output,
    )
    notes += _settings_notes(settings, prepared=prepared, checkpointing=gradient_checkpointing)
    loading, dequantized, decoding = (0, 0, 0)
    if device == "cuda":
        loading, dequantized, decoding = bitsandbytes_transients(
            quantized_shapes(spec, head=quantize_head),
            weights_format,
            compute,
            base=base_dtype,
            version=bitsandbytes_version,
            rows=None if training else batch_size * seq_len,
            decode_rows=None if new_tokens is None else batch_size,
            notes=notes,
            matmul=bnb_compute_dtype,
        )
    if not training:
        found = inference_estimate(
            spec,
            settings,
            batch_size=batch_size,
            seq_len=seq_len,
            weights=weights,
            use_cache=use_cache,
            notes=notes,
            dequantized=dequantized,
            decode_dequantized=decoding,
            new_tokens=new_tokens,
        )
        return with_loading(found, loading)

    if opt.paged and device == "cuda":
        notes.append(
            f"paged optimizer: its {states.optimizer:,} bytes of state live in CUDA unified "
            "memory (cudaMallocManaged), outside PyTorch's allocator: not in the allocated "
            "peak, and evicted to host memory when the GPU runs short"
        )
        states = dataclasses.replace(states, optimizer=0)
    found = training_peak(
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
        loop=Loop() if loop is None else loop,
        in_backward=optimizer_in_backward,
        loss_chunk=loss_chunk,
        dequantized=dequantized
        + (dora_recompute_bytes(spec, lora, compute) if gradient_checkpointing and lora else 0),
        head_itemsize=held.itemsize if copies else 0.0,
        head_copies=_head_copies(
            spec,
            states,
            compute,
            quantized=weights_format.is_quantized,
            kbit_head=kbit_head_params(spec, prepared=prepared, quantized_head=quantize_head),
            frozen_16bit=frozen_16bit,
        ),
    )
    return with_loading(found, loading)


def _head_copies(
    spec: TransformerSpec,
    states: ModelStates,
    compute: DType,
    *,
    quantized: bool,
    kbit_head: int,
    frozen_16bit: bool,
) -> int:
    """The head's share of autocast's weight copies: its fp32 weight cast for ``F.linear``.

    A 4/8-bit base casts a prepared fp32 head only (`kbit_head_params`); a 16-bit frozen
    base casts no head; otherwise the head (tied or not) is an fp32 ``nn.Linear``.
    """
    params = kbit_head if quantized else 0 if frozen_16bit else spec.vocab * spec.hidden
    return min(states.autocast_copies, math.ceil(params * compute.itemsize))


def _settings_notes(settings: BlockSettings, *, prepared: bool, checkpointing: bool) -> list[str]:
    """What the estimate's notes say of the recipe behind ``settings``."""
    notes = []
    if prepared and not checkpointing:
        notes.append(
            "prepare_model_for_kbit_training turns gradient checkpointing on unless "
            "use_gradient_checkpointing=False: pass gradient_checkpointing=True for its default"
        )
    if settings.inputs_kept:
        notes.append("bitsandbytes before 0.43.2: every 4-bit Linear keeps its input for backward")
    return notes
