"""The closed-form estimate of a transformer: training and inference peaks, block by block.

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

import dataclasses
import math

from torchfit._core.step import Loop, Mode, OptimizerName, parse_mode, parse_optimizer
from torchfit._core.units import DType, parse_dtype
from torchfit.memory.analytic.arch import TransformerSpec
from torchfit.memory.analytic.blocks import (
    BlockSettings,
    Term,
    block_terms,
    head_terms,
    loss_bytes,
    mlp_backward_width,
)
from torchfit.memory.analytic.formulas import INT64, parse_attention
from torchfit.memory.analytic.inference import inference_estimate
from torchfit.memory.analytic.lora import LoraSetup, lora_parameters
from torchfit.memory.analytic.model_states import ModelStates, model_state_bytes
from torchfit.memory.analytic.moe import (
    largest_expert_tensor,
    moe_backward_width,
    moe_block_terms,
)
from torchfit.memory.analytic.quantized import (
    bitsandbytes_transients,
    quantized_shapes,
    with_loading,
)
from torchfit.memory.analytic.states import (
    adapters_for,
    chunked_loss_peak,
    frozen_base_states,
    inputs_kept,
    kept_gradients,
    kept_output,
    parameter_shapes,
    weight_bytes,
)
from torchfit.memory.result import LayerMemory, MemoryEstimate

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


def elem_of(mixed: bool, compute: DType) -> float:  # noqa: FBT001 - a pure helper
    """Bytes per parameter element: fp32 master weights under mixed precision."""
    return compute.master(mixed=mixed).itemsize


def _largest_tensor(spec: TransformerSpec) -> int:
    """Elements of the largest parameter tensor (the embedding or the MLP weight)."""
    experts = largest_expert_tensor(spec) if spec.moe else 0  # MoE hook
    return max(
        spec.vocab * spec.hidden, spec.hidden * spec.intermediate, 3 * spec.hidden**2, experts
    )


# --- MoE hook: mixture-of-experts blocks swap their MLP terms (analytic/moe.py) ---------
def _block_terms(spec: TransformerSpec, seq_len: int, settings: BlockSettings) -> list[Term]:
    if spec.moe is not None:
        return moe_block_terms(spec, seq_len, settings)
    return block_terms(spec, seq_len, settings)


def _mlp_backward_width(spec: TransformerSpec) -> float:
    return moe_backward_width(spec) if spec.moe is not None else mlp_backward_width(spec)


# --- end of the MoE hook (inference: analytic/inference.py) -------------------------------


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
    double_quant: bool = True,
    quantize_head: bool = False,
    base_dtype: DType | None = None,
    new_tokens: int | None = None,
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
    quantized_compute = DType.BF16 if compute_dtype is None else parse_dtype(compute_dtype)
    compute = quantized_compute if weights_format.is_quantized else weights_format
    mixed = training and compute.bits == 16 if mixed_precision is None else mixed_precision
    opt = parse_optimizer(optimizer) if training else OptimizerName.NONE
    notes: list[str] = []

    lora = adapters_for(
        spec, lora, trainable_params, weights_format, training=training, notes=notes
    )
    if lora is not None:
        trainable_params, frozen_base = lora_parameters(spec, lora), True
    trainable = spec.num_params if trainable_params is None else trainable_params
    states = model_state_bytes(
        params=spec.num_params,
        trainable=trainable,
        dtype=compute,
        mixed_precision=mixed,
        optimizer=opt,
        training=training,
        num_tensors=spec.num_tensors if trainable == spec.num_params else 0,
        shapes=parameter_shapes(spec) if trainable == spec.num_params else None,
        # bitsandbytes' 4/8-bit matmuls dequantize inside their own autograd function and
        # save the quantized weight, so autocast keeps 16-bit copies of the adapters only
        autocast_params=trainable if weights_format.is_quantized else spec.autocast_params,
    )
    frozen = training and (
        adapters_only(trainable, spec.num_params) if frozen_base is None else frozen_base
    )
    if frozen and mixed and not weights_format.is_quantized:
        states = frozen_base_states(
            states, spec, trainable=trainable, base=base_dtype, compute=compute, notes=notes
        )
    weights = weight_bytes(
        spec,
        states,
        weights_format,
        compute,
        adapters=trainable if training else 0,
        mixed=mixed,
        double_quant=double_quant,
        head=quantize_head,
        notes=notes,
    )

    settings = BlockSettings(
        dtype=compute,
        attention=parse_attention(attn_implementation),
        device=device,
        training=training,
        frozen_base=frozen,
        autocast=training and mixed and compute.bits == 16,
        lora=lora if training else None,
        inputs_kept=inputs_kept(weights_format, bitsandbytes_version, training=training),
    )
    if settings.inputs_kept:
        notes.append("bitsandbytes before 0.43.2: every 4-bit Linear keeps its input for backward")
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
    found = _training_peak(
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
        dequantized=dequantized,
    )
    return with_loading(found, loading)


def _chunked_note(start: int, chunked: int, notes: list[str]) -> int:
    """``start``, noting when a chunked loss's own moment (`chunked_loss_peak`) set it."""
    if chunked and chunked == start:
        notes.append("chunked loss: all logit chunks in forward, or the head's gradients summed")
    return start


def _saved(
    spec: TransformerSpec,
    settings: BlockSettings,
    *,
    tokens: int,
    seq_len: int,
    checkpointing: bool,
) -> tuple[int, int, tuple[LayerMemory, ...]]:
    """Saved bytes at the loss's backward, at the top block's backward, and per block.

    Under checkpointing the loss's backward runs before any block is recomputed; the top
    block is recomputed after the loss gradients are freed (its own, later moment).
    """
    block = _block_terms(spec, seq_len, settings)
    per_block = math.ceil(tokens * sum(t.per_token for t in block))
    head = math.ceil(tokens * sum(t.per_token for t in head_terms(spec, settings)))
    layers = tuple(
        LayerMemory(f"block {k}", spec.family.value, per_block, "; ".join(t.name for t in block))
        for k in range(spec.num_layers)
    )
    if not checkpointing:
        return spec.num_layers * per_block + head, spec.num_layers * per_block + head, layers
    kept = math.ceil(spec.num_layers * tokens * spec.hidden * settings.dtype.itemsize)
    return kept + head, kept + per_block, layers


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
    loop: Loop,
    in_backward: bool,
    loss_chunk: int | None,
    dequantized: int = 0,
) -> MemoryEstimate:
    """The larger of the start of backward and the optimizer step (module docstring)."""
    compute, device, opt = settings.dtype, settings.device, optimizer
    tokens = batch_size * seq_len
    activations, recomputing, layers = _saved(
        spec, settings, tokens=tokens, seq_len=seq_len, checkpointing=gradient_checkpointing
    )
    if gradient_checkpointing:
        notes.append("gradient checkpointing: block inputs kept, one block recomputed")
    # Start of backward: the loss gradients w.r.t. the log-softmax and the logits
    # (`loss_bytes`). With a chunked loss (torchtune's CEWithChunkedOutputLoss, LitGPT's
    # chunked_cross_entropy) backward makes these gradients one chunk of positions at a time.
    loss_tokens = tokens if loss_chunk is None else batch_size * min(seq_len, loss_chunk)
    loss_grads = math.ceil(loss_tokens * loss_bytes(spec, settings)[1])
    if loss_chunk is not None:
        notes.append(f"loss in chunks of {loss_chunk} positions: one chunk's logit gradients")
    # Then the top block's MLP backward: the head's gradients exist (tied: the embedding's)
    # and the activation's chain of intermediates gets a gradient each (measured with the
    # tracer: gelu_new's backward holds about four i-wide tensors at once).
    mlp_grads = math.ceil(tokens * _mlp_backward_width(spec) * compute.itemsize)
    # a frozen head (LoRA on the blocks) gets no weight gradient
    head = 0 if settings.frozen_base else spec.vocab * spec.hidden
    head_grad = math.ceil(head * elem_of(mixed, compute))
    backward_start = max(activations + loss_grads, recomputing + head_grad + mlp_grads)
    chunked = chunked_loss_peak(
        activations,
        head_params=head,
        itemsize=compute.itemsize,
        rows=batch_size,
        seq_len=seq_len,
        chunk=loss_chunk,
        vocab=spec.vocab,
        logits_kept=loop.keep_output,
    )
    backward_start = _chunked_note(max(backward_start, chunked), chunked, notes)
    backward_start += dequantized  # the first 4-bit Linear's backward: a 16-bit weight copy
    backward_start += kept_output(loop, tokens * spec.vocab * compute.itemsize, notes)
    kept_grads = kept_gradients(loop, states.gradients, notes)
    # Optimizer step: temporaries of AdamW's update (sqrt of v, then its quotient).
    elem = elem_of(mixed, compute)
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
    if in_backward:
        # Each parameter steps as soon as its gradient is accumulated and the gradient is
        # freed (torchtune's optimizer_in_bwd): no moment holds all gradients, and the
        # step's temporaries are one tensor's.
        step_temp = math.ceil(2 * min(trainable, _largest_tensor(spec)) * elem)
        notes.append("optimizer step in backward: one parameter's gradient and update at a time")
        backward_start = max(backward_start, activations + step_temp)
    # Autocast's 16-bit weight copies are saved for backward: alive at its start, gone by
    # the optimizer step.
    start = backward_start + kept_grads + states.autocast_copies
    if in_backward or start >= states.gradients + step_temp:
        peak_at = "start of backward"
        act, grads, workspace = activations, kept_grads, backward_start - activations
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
