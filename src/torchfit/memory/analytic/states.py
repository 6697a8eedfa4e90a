"""What a training step holds besides its activations: weights, adapters, kept tensors.

Pure helpers of `torchfit.memory.analytic.transformer`: the weight bytes of a plain or a
quantized base with its adapters, which LoRA adapters train, and what the loop keeps
alive through forward and backward (the output, the gradients).
"""

from __future__ import annotations

import dataclasses
import math

from torchfit._bnb.layout import keeps_4bit_input
from torchfit._core.step import Loop, OptimizerName
from torchfit._core.units import DType
from torchfit.memory.analytic.arch import Family, TransformerSpec
from torchfit.memory.analytic.lora import (
    BLOCK_ROLES,
    LoraSetup,
    default_targets,
    lora_parameters,
    role_shapes,
)
from torchfit.memory.analytic.loraconfig import lora_setup
from torchfit.memory.analytic.model_states import ModelStates, model_state_bytes

__all__ = [
    "adapters_for",
    "check_dora",
    "dora_recompute_bytes",
    "dora_weight_copies",
    "saved_copy_states",
    "chunked_loss_peak",
    "frozen_base_states",
    "inputs_kept",
    "kept_gradients",
    "kept_output",
    "parameter_shapes",
    "weight_bytes",
]


def parameter_shapes(spec: TransformerSpec) -> list[tuple[int, ...]]:
    """The shapes of the model's parameter tensors, as the block layout gives them.

    Exact in the matrices that dominate (embeddings, attention and MLP weights); norms and
    biases are vectors of ``hidden``. Used where a per-tensor figure matters (Adafactor's
    factored state), not for counting parameters (`TransformerSpec.num_params` is exact).

    Example:
        >>> from transformers import GPT2Config
        >>> from torchfit.memory.analytic.arch import spec_from_config
        >>> parameter_shapes(spec_from_config(GPT2Config(n_layer=1)))[:2]
        [(50257, 768), (1024, 768)]
    """
    h, i, kv = spec.hidden, spec.intermediate, spec.kv_dim
    shapes: list[tuple[int, ...]] = [(spec.vocab, h)]
    if spec.family is not Family.LLAMA:
        shapes.append((spec.max_positions, h))
    if spec.family is Family.LLAMA:
        block = [(h, h), (kv, h), (kv, h), (h, h), (i, h), (i, h), (h, i), (h,), (h,)]
    elif spec.family is Family.GPT2:
        block = [(h, 3 * h), (3 * h,), (h, h), (h,), (h, i), (i,), (i, h), (h,), (h,)] + [(h,)] * 4
    else:
        block = [(h, h), (h,), (kv, h), (kv,), (kv, h), (kv,), (h, h), (h,), (i, h), (i,)]
        block += [(h, i), (h,)] + [(h,)] * 4
    shapes += block * spec.num_layers
    shapes.append((h,))
    if not spec.tied_embeddings:
        shapes.append((spec.vocab, h))
    return shapes


def adapters_for(
    spec: TransformerSpec,
    lora: LoraSetup | None,
    trainable_params: int | None,
    weights: DType,
    *,
    training: bool,
    notes: list[str],
) -> LoraSetup | None:
    """The LoRA adapters that train, if any: asked for, or PEFT's default for a quantized base."""
    if not training:
        return None
    if weights.is_quantized and lora is None and trainable_params is None:
        lora = lora_setup(spec)
        notes.append(
            f"{weights.value} weights train through adapters: assumed PEFT's default LoRA, "
            f"r={lora.rank} on {', '.join(default_targets(spec))} "
            "(set lora_rank=/lora_targets=, or trainable_params=)"
        )
    if lora is not None and trainable_params is not None:
        adapters = lora_parameters(spec, lora)
        if trainable_params != adapters:
            raise ValueError(
                f"trainable_params={trainable_params:,} contradicts the LoRA adapters, which "
                f"train {adapters:,} parameters; pass only one of them"
            )
    return lora


def frozen_base_states(
    states: ModelStates,
    spec: TransformerSpec,
    *,
    trainable: int,
    base: DType | None,
    compute: DType,
    notes: list[str],
) -> ModelStates:
    """Mixed precision over a frozen 16-bit base: the base stays 16-bit, adapters fp32.

    A frozen weight needs no fp32 master copy, and transformers' ``from_pretrained``
    loads a checkpoint in the dtype it was saved in (its default ``dtype="auto"`` in 5.x),
    so a LoRA run under autocast holds the base in that dtype and only the adapters in
    fp32 (PEFT's ``autocast_adapter_dtype``); autocast casts nothing of the base. With a
    base in fp32 (``base=None`` or fp32) the states stay as mixed precision gives them.
    """
    if base is None:
        notes.append(
            "frozen base in fp32: the config records no dtype; base_dtype='bf16' for a base "
            "loaded with from_pretrained(dtype=torch.bfloat16)"
        )
    if base is None or base.bits != 16:
        return states
    frozen = spec.num_params - trainable
    notes.append(
        f"frozen base in {base.value} (the checkpoint's dtype, as from_pretrained loads it), "
        f"adapters in fp32; base_dtype='fp32' for a base loaded in fp32"
    )
    return dataclasses.replace(
        states,
        weights=math.ceil(frozen * base.itemsize + trainable * 4),
        autocast_copies=math.ceil(trainable * compute.itemsize),
    )


def weight_bytes(
    spec: TransformerSpec,
    states: ModelStates,
    weights: DType,
    compute: DType,
    *,
    adapters: int,
    mixed: bool,
    double_quant: bool,
    notes: list[str],
    head: bool = False,
    prepared: bool = False,
) -> int:
    """Weight bytes: the model states', or a quantized base plus its adapters.

    ``prepared``: PEFT's ``prepare_model_for_kbit_training`` has cast the quantized base's
    other parameters (embeddings, norms, head) to fp32.
    """
    from torchfit.memory.analytic.quantized import (  # noqa: PLC0415
        check_quantize_head,
        quantized_weight_bytes,
    )

    if not weights.is_quantized:
        check_quantize_head(weights, head=head, tied=spec.tied_embeddings)
        notes.append(states.note)
        return states.weights
    rest = DType.FP32 if prepared else compute
    held = quantized_weight_bytes(
        spec, weights, compute, double_quant=double_quant, head=head, rest=rest
    )
    # the adapters, at full precision beside the frozen quantized base
    held += math.ceil(adapters * (4 if mixed else compute.itemsize))
    nested = "" if weights is DType.INT8 else (" + double quant" if double_quant else "")
    why = " (peft.prepare_model_for_kbit_training)" if prepared else ""
    notes.append(
        f"block weights{' and the head' if head else ''} in {weights.value}{nested}; "
        f"embeddings, norms{'' if head else ', head'} in {rest.value}{why}"
    )
    if adapters:
        notes.append(f"adapters ({adapters:,} parameters): {states.note}")
    return held


def inputs_kept(weights: DType, version: str | None, *, training: bool) -> bool:
    """Whether every 4-bit Linear keeps its input (bitsandbytes before 0.43.2)."""
    return training and weights.bits == 4 and keeps_4bit_input(version)


def kept_output(loop: Loop, logits: int, itemsize: float, notes: list[str]) -> int:
    """Bytes of the ``logits`` (elements) the caller keeps referenced through backward.

    In the compute dtype's ``itemsize`` (16-bit under autocast), or fp32 where the loop
    casts them (``loop.fp32_output``: Lightning Fabric's wrapped module).
    """
    if loop.fp32_output:
        notes.append("the loop casts the logits to fp32 before the loss (Lightning Fabric)")
        itemsize = DType.FP32.itemsize
    if not loop.keep_output:
        return 0
    notes.append("the forward's output (the logits) is kept through backward")
    return math.ceil(logits * itemsize)


def kept_gradients(loop: Loop, gradients: int, notes: list[str]) -> int:
    """Gradients alive through forward and backward: accumulated, or zeroed in place."""
    if not loop.gradients_during_forward:
        return 0
    why = (
        f"{loop.accumulation_steps} accumulation steps"
        if loop.accumulation_steps > 1
        else "zero_grad(set_to_none=False)"
    )
    notes.append(f"gradients alive through forward and backward ({why})")
    return gradients


def chunked_loss_peak(
    activations: int,
    *,
    head_params: int,
    itemsize: float,
    rows: int,
    seq_len: int,
    chunk: int | None,
    vocab: int,
    logits_kept: bool = False,
) -> int:
    """The highest moment a loss in chunks of positions adds to ``activations``, or 0.

    LitGPT's ``lm_head_chunk_size`` and torchtune's ``CEWithChunkedOutputLoss`` run the
    head once per chunk and hand the list of logit chunks to the loss. Two moments can
    beat the start of backward, where only one chunk's logit gradients exist:

    - the end of the loss in forward: every chunk's logits (compute dtype) are alive, and
      the chunk being upcast to fp32 for ``cross_entropy`` (16-bit only);
    - a trained head (not LoRA's frozen one) gets one weight gradient per chunk, which
      autograd adds into the running sum out of place (the incoming gradient is a
      transposed view, which ``InputBuffer::add`` does not add into in place): the sum so
      far, the new gradient and their sum are alive together while the second chunk from
      the end is done, when two chunks' fp32 log-softmax outputs are already freed.

    ``logits_kept``: the caller keeps the chunks through backward and counts them apart
    (`kept_output`), so the forward's moment leaves them out. One chunk
    (``chunk >= seq_len``) or no chunking: 0. Measured with the tracer and the
    real CPU step (tests/memory/modules/test_chunked.py).
    """
    if chunk is None or chunk >= seq_len:
        return 0
    upcast = rows * chunk * vocab * 4 if itemsize < 4 else 0
    logits = 0 if logits_kept else math.ceil(rows * seq_len * vocab * itemsize)
    forward_end = activations + logits + upcast
    if not head_params:
        return forward_end
    log_softmax = rows * chunk * vocab * 4  # one chunk's saved fp32 log-softmax
    summed = activations - 2 * log_softmax + math.ceil(3 * head_params * itemsize)
    return max(forward_end, summed)


def check_dora(lora: LoraSetup, weights: DType) -> None:
    """Refuse DoRA over a quantized base: its second matmul keeps dequantized weights.

    With ``lora_dropout`` DoRA runs the base's matmul again on the dropped input with
    ``dequantize_module_weight(base_layer)`` (peft/tuners/lora/variants.py,
    ``DoraLinearVariant.forward``; dora.py), and that dequantized copy of every adapted
    weight is saved for backward: not modelled.
    """
    if lora.dora and weights.is_quantized:
        raise ValueError(
            f"use_dora=True over a {weights.value} base is not modelled (DoRA dequantizes each "
            "adapted weight for its own matmul and, with dropout, keeps the copies for "
            "backward); trace the PEFT model with torchfit.memory.trace"
        )


def dora_weight_copies(
    states: ModelStates,
    spec: TransformerSpec,
    lora: LoraSetup,
    compute: DType,
    *,
    fp32_frozen: bool,
) -> ModelStates:
    """DoRA with dropout over an fp32 frozen base under autocast: a second 16-bit weight copy.

    DoRA's own ``F.linear(dropped x, weight)`` casts the frozen fp32 weight again (autocast
    caches casts of trained leaves only) and saves the copy, beside the one of the base's
    forward (counted with the autocast copies).
    """
    if not (lora.dora and lora.dropout > 0 and fp32_frozen and compute.bits == 16):
        return states
    shapes = role_shapes(spec)
    adapted = spec.num_layers * sum(
        i * o for r, (i, o) in shapes.items() if r in lora.roles & BLOCK_ROLES
    )
    return dataclasses.replace(
        states, autocast_copies=states.autocast_copies + math.ceil(adapted * compute.itemsize)
    )


def dora_recompute_bytes(spec: TransformerSpec, lora: LoraSetup, compute: DType) -> int:
    """What DoRA's forward holds for one adapted Linear (a checkpointed block's recompute).

    ``get_lora_weight`` runs the adapter on an identity matrix (``in x in``, then ``in x r``
    and ``in x out``, in the adapters' fp32), and ``get_weight_norm`` adds it to the weight
    (``out x in`` in the compute dtype, twice): the largest adapted Linear's.
    """
    if not lora.dora:
        return 0
    shapes = role_shapes(spec)
    sizes = [
        (i * i + i * lora.rank_of(r) + i * o) * 4 + 2 * i * o * compute.itemsize
        for r, (i, o) in shapes.items()
        if r in lora.roles & BLOCK_ROLES
    ]
    return math.ceil(max(sizes, default=0))


def saved_copy_states(
    states: ModelStates,
    weights: int,
    copies: int,
    held: DType,
    optimizer: OptimizerName,
    *,
    notes: list[str],
) -> tuple[ModelStates, int]:
    """``modules_to_save`` copies of the head or embedding: held, trained, stepped in ``held``.

    ``ModulesToSaveWrapper`` trains a ``copy.deepcopy`` of the module beside the frozen
    original (peft/utils/other.py), so the copy's weights add to the base's, and its
    gradients and optimizer state are in the dtype it was copied in (no fp32 master).
    """
    extra = model_state_bytes(
        params=copies,
        trainable=copies,
        dtype=held,
        mixed_precision=False,
        optimizer=optimizer,
        num_tensors=1,
    )
    notes.append(
        f"modules_to_save: a trained copy of {copies:,} parameters in {held.value} beside the "
        "frozen original"
    )
    states = dataclasses.replace(
        states,
        gradients=states.gradients + extra.gradients,
        optimizer=states.optimizer + extra.optimizer,
    )
    return states, weights + extra.weights
