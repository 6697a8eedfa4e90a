"""The training peak of a transformer's closed form: the highest of a step's moments.

* the start of backward: weights, optimizer state, every saved activation, and the
  loss's two logits-sized fp32 gradients; or, when it is higher, the top block's
  backward (with gradient checkpointing: the recomputed block, once the loss's
  gradients are gone);
* with gradient checkpointing, the end of the forward: the blocks' inputs, the loss's
  logits and, under autocast, every weight's 16-bit copy (autocast's cache);
* the end of backward: every gradient but the first block's and the embeddings', with
  the first block's saved tensors (recomputed under checkpointing);
* the optimizer step: weights, optimizer state, all gradients, and the optimizer's
  temporaries (`adam_step_temporaries`: by default ``foreach`` lists on CUDA, one tensor
  at a time on CPU; none for ``fused=True``).

Between them, activations are freed as gradients appear, so the lines between them hold
no higher point.
"""

from __future__ import annotations

import math

from torchfit._core.step import Loop, OptimizerName
from torchfit._core.units import DType
from torchfit.memory.analytic.arch import Family, TransformerSpec
from torchfit.memory.analytic.blocks import (
    block_terms,
    head_terms,
    loss_bytes,
    mlp_backward_width,
    upcasts_logits,
)
from torchfit.memory.analytic.encoder_outline import bert_training_outline
from torchfit.memory.analytic.formulas import FP32, INT64
from torchfit.memory.analytic.head_backward import head_backward
from torchfit.memory.analytic.model_states import ModelStates
from torchfit.memory.analytic.moe import (
    largest_expert_tensor,
    moe_backward_width,
    moe_block_terms,
)
from torchfit.memory.analytic.optimizer_step import adam_step_temporaries
from torchfit.memory.analytic.outline import training_outline
from torchfit.memory.analytic.settings import BlockSettings
from torchfit.memory.analytic.states import chunked_loss_peak, kept_gradients, kept_output
from torchfit.memory.analytic.term import Term
from torchfit.memory.outline import StepOutline
from torchfit.memory.result import LayerMemory, MemoryEstimate

__all__ = ["elem_of", "training_peak"]


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


def _copies_at_backward(copies: int, head: int, *, layers: int, recomputing: bool) -> int:
    """Autocast's weight copies alive at the start of backward (``layers=0``: no checkpoints).

    Autocast caches the 16-bit copy of each fp32 leaf weight that requires grad until the
    outermost ``autocast`` exits (``cached_cast`` in aten/src/ATen/autocast_mode.cpp), so
    every copy is alive at the end of the forward. After that, a copy lives as long as
    autograd saved it: all of them without checkpointing; with it, the head's, plus one
    block's while backward recomputes that block under autocast again (measured with the
    CUDA-target trace: a Llama-3.2-1B fp32 step under bf16 autocast and checkpointing holds
    the tied head's copy at the start of backward, not the blocks').
    """
    if not layers:
        return copies
    return head + ((copies - head) // layers if recomputing else 0)


def _end_of_backward(
    spec: TransformerSpec,
    settings: BlockSettings,
    states: ModelStates,
    *,
    tokens: int,
    per_block: int,
    workspace: int,
    trainable: int,
    head_copies: int,
    checkpointing: bool,
) -> tuple[int, str, int, int, int, int]:
    """The first block's backward, a moment of the step (`training_peak`).

    Every gradient but its own is there, with its saved tensors (under checkpointing:
    recomputed from its kept input) and its weights' autocast copies. Returns the moment
    as ``training_peak`` compares them: (bytes above weights and state, label,
    activations, gradients, workspace, copies).
    """
    kept_input = math.ceil(tokens * spec.hidden * settings.residual) if checkpointing else 0
    first = per_block + kept_input
    grads = states.gradients - _block_gradients(spec, states.gradients, trainable)
    copies = (states.autocast_copies - head_copies) // max(spec.num_layers, 1)
    total = grads + first + workspace + copies
    return total, "end of backward (first block)", first, grads, workspace, copies


def _block_gradients(spec: TransformerSpec, gradients: int, trainable: int) -> int:
    """The gradients not made yet when the first block's backward starts.

    Its own weights' (or adapters', over a frozen base) and the embeddings'; a tied
    embedding's gradient is already there, made by the head.
    """
    if trainable != spec.num_params:
        return gradients // max(spec.num_layers, 1)
    block = (spec.num_params - spec.embedding_params - spec.head_params) / spec.num_layers
    tied = spec.vocab * spec.hidden if spec.tied_embeddings else 0
    return math.floor(gradients * (block + spec.embedding_params - tied) / spec.num_params)


def _loss_forward(spec: TransformerSpec, settings: BlockSettings) -> float:
    """Per token: the logits, and their fp32 upcast, alive while the log-softmax is made.

    The causal-LM loss upcasts 16-bit logits (`loss_bytes`); both are freed before backward.
    """
    v = spec.vocab
    upcast = upcasts_logits(spec, settings.dtype)
    return v * settings.dtype.itemsize + (v * FP32 if upcast else 0)


def _chunked_note(start: int, chunked: int, notes: list[str]) -> int:
    """``start``, noting when a chunked loss's own moment (`chunked_loss_peak`) set it."""
    if chunked and chunked == start:
        notes.append("chunked loss: all logit chunks in forward, or the head's gradients summed")
    return start


def training_peak(
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
    head_itemsize: float = 0.0,
    head_copies: int = 0,
) -> MemoryEstimate:
    """The larger of the start of backward and the optimizer step (module docstring).

    ``head_itemsize``: bytes per element of a trained head copy's gradient over a frozen
    base (0: the master weights' dtype). ``head_copies``: the head's share of
    ``states.autocast_copies`` (its ``F.linear`` runs outside every checkpoint).
    """
    compute, device, opt = settings.dtype, settings.device, optimizer
    tokens = batch_size * seq_len
    block = _block_terms(spec, seq_len, settings)
    per_block = math.ceil(tokens * sum(t.per_token for t in block))
    head = math.ceil(tokens * sum(t.per_token for t in head_terms(spec, settings)))
    if gradient_checkpointing:
        # each block's input (the residual stream), kept by its checkpoint; one block is
        # recomputed at a time in backward, after the loss's gradients are gone
        kept = math.ceil(spec.num_layers * tokens * spec.hidden * settings.residual)
        activations, recomputed = kept + head, kept + per_block
        notes.append("gradient checkpointing: block inputs kept, one block recomputed")
    else:
        activations = recomputed = spec.num_layers * per_block + head
    layers = tuple(
        LayerMemory(f"block {k}", spec.family.value, per_block, "; ".join(t.name for t in block))
        for k in range(spec.num_layers)
    )
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
    mlp_grads = math.ceil(tokens * _mlp_backward_width(spec) * settings.mlp_itemsize)
    # a frozen head (LoRA on the blocks) gets no weight gradient; its modules_to_save copy
    # does, in the dtype the copy is held in
    trains = not settings.frozen_base or settings.head_trains
    head = spec.vocab * spec.hidden if trains else 0
    head_grad = math.ceil(head * (head_itemsize or elem_of(mixed, compute)))
    # the top block's backward, with the copy a 4-bit Linear's backward dequantizes
    block_backward = recomputed + head_grad + mlp_grads + dequantized
    backward_start = max(activations + loss_grads, block_backward)
    # the saved tensors of the moment: the top block's backward has the recomputed one
    saved = recomputed if backward_start == block_backward else activations
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
    backward_start += kept_output(loop, tokens * spec.vocab, compute.itemsize, notes)
    kept_grads = kept_gradients(loop, states.gradients, notes)
    elem = elem_of(mixed, compute)
    step_temp = _step_temporaries(
        spec,
        opt,
        device=device,
        trainable=trainable,
        elem=elem,
        in_backward=in_backward,
        notes=notes,
    )
    if in_backward:
        backward_start = max(backward_start, activations + step_temp)
    # Autocast's 16-bit weight copies are saved for backward: alive at its start, gone by
    # the optimizer step. Under checkpointing only the head's is saved (and, in the top
    # block's recompute, that block's); all of them are alive at the end of the forward.
    copies = _copies_at_backward(
        states.autocast_copies,
        head_copies,
        layers=spec.num_layers if gradient_checkpointing else 0,
        recomputing=saved == recomputed,
    )
    start = backward_start + kept_grads + copies
    logits = math.ceil(_loss_forward(spec, settings) * tokens) if loss_chunk is None else 0
    moments = [(start, "start of backward", saved, kept_grads, backward_start - saved, copies)]
    head_sum = head_backward(
        spec, settings, tokens=tokens, activations=activations, gradients=kept_grads, copies=copies
    )
    if head_sum is not None and loss_chunk is None and not in_backward:
        moments.append(head_sum)
    if gradient_checkpointing:
        forward_end = activations + kept_grads + states.autocast_copies + logits
        label = "end of forward (the loss, autocast's cache)"
        all_copies = states.autocast_copies
        moments.append((forward_end, label, activations, kept_grads, logits, all_copies))
    if not in_backward:
        moments.append(
            _end_of_backward(
                spec,
                settings,
                states,
                tokens=tokens,
                per_block=per_block,
                workspace=mlp_grads + dequantized,
                trainable=trainable,
                head_copies=head_copies,
                checkpointing=gradient_checkpointing,
            )
        )
        moments.append(
            (states.gradients + step_temp, "optimizer step", 0, states.gradients, step_temp, 0)
        )
    _, peak_at, act, grads, workspace, copies = max(moments, key=lambda m: m[0])
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
        outline=None
        if loss_chunk is not None
        or in_backward
        or spec.moe is not None
        or kept_grads
        or loop.keep_output
        or loop.fp32_output
        else _outline(
            spec,
            settings,
            tokens=tokens,
            seq_len=seq_len,
            weights=weights,
            gradients=states.gradients,
            optimizer=states.optimizer,
            step_temporaries=step_temp,
            block=block,
            head=head_terms(spec, settings),
            loss_grads=loss_grads,
            block_grads=mlp_grads,
            dequantized=dequantized,
            checkpointing=gradient_checkpointing,
            full=trainable == spec.num_params,
            copies=(states.autocast_copies, head_copies),
        ),
    )


def _outline(
    spec: TransformerSpec,
    settings: BlockSettings,
    *,
    tokens: int,
    seq_len: int,
    weights: int,
    gradients: int,
    optimizer: int,
    step_temporaries: int,
    block: list[Term],
    head: list[Term],
    loss_grads: int,
    block_grads: int,
    dequantized: int,
    checkpointing: bool,
    full: bool,
    copies: tuple[int, int],
) -> StepOutline | None:
    """The step's `StepOutline`: a decoder's, or a fully trained BERT's (`encoder_outline`)."""
    if spec.family is Family.BERT:
        if not full or dequantized:
            return None  # adapters: not outlined for encoders
        return bert_training_outline(
            spec,
            settings,
            tokens=tokens,
            seq_len=seq_len,
            weights=weights,
            gradients=gradients,
            optimizer=optimizer,
            step_temporaries=step_temporaries,
            checkpointing=checkpointing,
        )
    return training_outline(
        spec,
        settings,
        tokens=tokens,
        weights=weights,
        gradients=gradients,
        optimizer=optimizer,
        step_temporaries=step_temporaries,
        block=block,
        head=head,
        loss_grads=loss_grads,
        block_grads=block_grads,
        dequantized=dequantized,
        checkpointing=checkpointing,
        full=full,
        copies=copies,
    )


def _step_temporaries(
    spec: TransformerSpec,
    opt: OptimizerName,
    *,
    device: str,
    trainable: int,
    elem: float,
    in_backward: bool,
    notes: list[str],
) -> int:
    """Temporaries of the optimizer step (Adam: `adam_step_temporaries`), in bytes."""
    largest = _largest_tensor(spec)
    step_temp = 0
    if not in_backward:
        step_temp = adam_step_temporaries(
            opt, device=device, trainable=trainable, largest=largest, elem=elem, notes=notes
        )
    # End of backward with tied embeddings: the embedding's dense gradient arrives while the
    # LM head's gradient is already in .grad, and their sum is a third tensor (measured).
    tied_sum = math.ceil(2 * spec.vocab * spec.hidden * elem) if spec.tied_embeddings else 0
    step_temp = max(step_temp, tied_sum)
    if in_backward:
        # Each parameter steps as soon as its gradient is accumulated and the gradient is
        # freed (torchtune's optimizer_in_bwd): no moment holds all gradients, and the
        # step's temporaries are one tensor's.
        step_temp = math.ceil(2 * min(trainable, largest) * elem)
        if opt.is_torch_adam:
            step_temp = adam_step_temporaries(
                opt,
                device=device,
                trainable=trainable,
                largest=largest,
                elem=elem,
                per_parameter=True,
            )
        notes.append("optimizer step in backward: one parameter's gradient and update at a time")
    return step_temp
