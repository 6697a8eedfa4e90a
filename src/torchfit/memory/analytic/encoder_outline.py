"""A BERT masked-LM training step's tensors in step order: the encoder's `StepOutline`.

Unlike a decoder's block (`training_outline`), an encoder block frees tensors before
backward (the output projections' results once dropout has used them, the dropped
outputs once added to the residual, the attention half's LayerNorm output once the MLP
has used it), and under autocast over fp32 weights every Linear keeps its own 16-bit
copy of its input and the autocast cache keeps each weight's 16-bit copy until its
backward. The sequences below follow transformers' ``BertForMaskedLM`` (5.x,
``models/bert/modeling_bert.py``) as a real step allocates it: an H200 memory snapshot
of a BERT-base fp16-autocast step (torch 2.11, batch 32, 512 tokens; case
``T4_bert_mlm_16mixed_scaler_b32_s512`` of ``tests/memory/allocator/data``) lists, per layer,
the three weight copies, input copies and projections of Q, K and V, SDPA's output and
log-sum-exp, then for each half the dense output, the bool dropout mask, the dropped
output, the fp32 residual sum and the fp32 LayerNorm output.

The loss is ``nn.CrossEntropyLoss`` on the logits as they are: under CUDA autocast a
16-bit log-softmax and ``nll_loss``'s fp32 copy of it, both saved (`loss_bytes`).
"""

from __future__ import annotations

import math

from torchfit.memory.analytic.arch import TransformerSpec
from torchfit.memory.analytic.formulas import FP32, INT64, dropout_mask_bytes, keeps_linear_state
from torchfit.memory.analytic.outline import no_grad_block, split
from torchfit.memory.analytic.settings import BlockSettings
from torchfit.memory.outline import SAVED, StepOutline, Transient

__all__ = ["bert_parameters", "bert_training_outline"]

#: A lifetime that outlasts any sequence below but is not `SAVED`: freed when the
#: block (or the embeddings, or the head) is done.
_TO_THE_END = 1_000


def bert_parameters(spec: TransformerSpec) -> list[int]:
    """Elements of ``BertForMaskedLM``'s parameter tensors in ``model.parameters()`` order.

    Embeddings (word, position, token type, LayerNorm), per layer Q, K, V and the
    attention output (weight, bias each), LayerNorm, intermediate, output, LayerNorm, then
    the MLM head's transform, its LayerNorm and the decoder's bias (its weight is the word
    embedding's).

    Example:
        >>> from transformers import BertConfig
        >>> from torchfit.memory.analytic.arch import spec_from_config
        >>> spec = spec_from_config(BertConfig())
        >>> sum(bert_parameters(spec)) == spec.num_params
        True
    """
    h, i, v = spec.hidden, spec.intermediate, spec.vocab
    types = (spec.num_params - sum(_known(spec))) // h
    layer = [h * h, h] * 4 + [h, h, i * h, i, h * i, h, h, h]
    return [v * h, spec.max_positions * h, types * h, h, h, *layer * spec.num_layers,
            h * h, h, h, h, v]  # fmt: skip


def _known(spec: TransformerSpec) -> list[int]:
    """`bert_parameters` without the token-type embedding."""
    h, i = spec.hidden, spec.intermediate
    layer = 4 * (h * h + h) + 4 * h + 2 * h * i + i + h
    return [spec.vocab * h, spec.max_positions * h, 2 * h, spec.num_layers * layer,
            h * h + 3 * h + spec.vocab]  # fmt: skip


class _Sizes:
    """The step's tensor sizes in bytes, from the spec and the settings."""

    def __init__(self, spec: TransformerSpec, s: BlockSettings, tokens: int, seq_len: int) -> None:
        e, r = s.dtype.itemsize, s.residual
        self.cast = s.autocast and r > e  # fp32 weights and stream under 16-bit autocast
        self.hw = math.ceil(tokens * spec.hidden * e)  # a projection's output
        self.hr = math.ceil(tokens * spec.hidden * r)  # the residual stream's dtype
        self.iw = math.ceil(tokens * spec.intermediate * s.mlp_itemsize)
        dropping = s.training and spec.dropout > 0
        self.mask = math.ceil(tokens * spec.hidden * dropout_mask_bytes(s.dtype, s.device))
        self.mask = self.mask if dropping else 0
        self.stats = tokens * FP32  # a LayerNorm's mean, and its rstd
        self.e = e
        batch = tokens // seq_len
        p = spec.attention_dropout if s.training else 0.0
        self.flash = keeps_linear_state(s.attention, device=s.device, training=True, dropout=p)
        self.lse = batch * spec.num_heads * seq_len * FP32
        # eager: the b·a·s² scores' softmax, and with dropout its mask and dropped copy
        square = batch * spec.num_heads * seq_len * seq_len
        mask = dropout_mask_bytes(s.dtype, s.device) + e if p else 0
        self.probabilities = math.ceil(square * (e + mask))

    def weight(self, elements: int) -> int:
        """The autocast cache's 16-bit copy of a Linear's weight (none without autocast)."""
        return math.ceil(elements * self.e) if self.cast else 0

    def linear(
        self, elements: int, out: int, *, input_kept: int = 0, copy: bool = True
    ) -> list[Transient]:
        """A Linear: its weight's copy, its input's copy (autocast) or input, its output.

        ``copy=False``: the weight's copy is counted apart (a checkpointed block's).
        """
        kept = self.hw if self.cast else input_kept  # 0: an input kept elsewhere already
        return [(self.weight(elements) if copy else 0, SAVED), (kept, SAVED), (out, SAVED)]

    def dropped_sum(self, dense: int) -> list[Transient]:
        """Dense output, dropout (mask, dropped output), the fp32 residual sum, LayerNorm."""
        if not self.mask:
            return [(dense, 1), (self.hr, SAVED), (self.stats, SAVED), (self.stats, SAVED)]
        return [(dense, 2), (self.mask, SAVED), (self.hw, 4), (self.hr, SAVED),
                (self.stats, SAVED), (self.stats, SAVED)]  # fmt: skip


def _weight_copies(spec: TransformerSpec, z: _Sizes) -> tuple[int, ...]:
    """Autocast's 16-bit copies of one ``BertLayer``'s weights, in the order it makes them."""
    h, i = spec.hidden, spec.intermediate
    return tuple(z.weight(n) for n in (h * h, h * h, h * h, h * h, h * i, i * h) if z.weight(n))


def _layer(spec: TransformerSpec, z: _Sizes, *, copies: bool = True) -> tuple[Transient, ...]:
    """One ``BertLayer``'s forward; its LayerNorm output (``h``) is the schedule's residual.

    ``copies=False``: without autocast's weight copies (a checkpointed block, whose
    copies the schedule allocates apart: `_weight_copies`).
    """
    h, i = spec.hidden, spec.intermediate
    weight = z.weight if copies else (lambda _: 0)
    qkv: list[Transient] = []
    for role in range(3):  # the block's input is kept once, by Q (its copies, under autocast)
        qkv += z.linear(h * h, z.hw, input_kept=z.hr if role == 0 else 0, copy=copies)
    if z.flash:
        core: list[Transient] = [(z.hw, SAVED), (z.lse, SAVED)]  # SDPA's output and lse
    else:
        core = [(z.probabilities, SAVED), (z.hw, SAVED)]  # probabilities, context
    attention_out = [(weight(h * h), SAVED)]  # dense(context) keeps the context
    # the attention half's LayerNorm output: the MLP's input and residual (freed at the end)
    normed = (z.hr, SAVED if not z.cast else _TO_THE_END)
    mlp = [*z.linear(h * i, z.iw, copy=copies), (z.iw, SAVED)]  # intermediate, GELU's output
    return (
        *qkv,
        *core,
        *attention_out,
        *z.dropped_sum(z.hw),
        normed,
        *mlp,
        (weight(i * h), SAVED),
        *z.dropped_sum(z.hw),
    )


def _embeddings(spec: TransformerSpec, z: _Sizes, seq_len: int, r: float) -> tuple[Transient, ...]:
    """Word, token-type and position lookups, their sums, LayerNorm, dropout's mask."""
    sequence: list[Transient] = [
        (z.hr, _TO_THE_END),  # word embeddings
        (z.hr, _TO_THE_END),  # token-type embeddings
        (z.hr, 2),  # their sum
        (math.ceil(seq_len * spec.hidden * r), _TO_THE_END),  # position embeddings
        (z.hr, SAVED),  # the sum LayerNorm keeps
        (z.stats, SAVED),
        (z.stats, SAVED),
    ]
    if z.mask:  # LayerNorm's output, dropped into the first residual
        sequence += [(z.hr, 2), (z.mask, SAVED)]
    return tuple(sequence)


def _head(spec: TransformerSpec, z: _Sizes) -> tuple[Transient, ...]:
    """The MLM transform (dense, GELU, LayerNorm), then the decoder's weight copy and input."""
    h = spec.hidden
    transform = z.linear(h * h, z.hw, input_kept=z.hr)
    decoder = [(z.weight(spec.vocab * h), SAVED), *([(z.hw, SAVED)] if z.cast else [])]
    stats = [(z.stats, SAVED), (z.stats, SAVED)]
    if z.cast:  # GELU's 16-bit output, cast to fp32 by LayerNorm (autocast's fp32 list)
        norm: list[Transient] = [(z.hw, 4), (z.hr, SAVED)]
        # the normed output lives through the decoder's copies and the logits
        normed: Transient = (z.hr, len(stats) + len(decoder) + 1)
    else:  # LayerNorm keeps GELU's output, the decoder its input
        norm, normed = [(z.hw, SAVED)], (z.hr, SAVED)
    return (*transform, *norm, normed, *stats, *decoder)


def _loss(logits: int, s: BlockSettings) -> tuple[tuple[int, ...], int, tuple[int, ...]]:
    """(loss tensors, how many are saved, the loss's gradients) as `loss_bytes` has them."""
    e = s.dtype.itemsize
    fp32 = math.ceil(logits * FP32 / e)
    if e == FP32:
        return (logits,), 1, (logits, logits)
    if s.autocast and s.device == "cuda":  # 16-bit log-softmax, nll_loss's fp32 copy
        return (logits, fp32), 2, (fp32, logits)
    if s.autocast:  # CPU autocast: cross_entropy in fp32 from an fp32 copy of the logits
        return (fp32, fp32), 1, (fp32, fp32)
    return (logits,), 1, (logits, logits)


def _gradients(spec: TransformerSpec, grads: list[int]) -> tuple[tuple[int, ...], ...]:
    """(head, one block, embedding) gradients in the order backward makes them.

    The head's come first, the word embedding's among them (the decoder shares it).
    """
    layer = 16
    embeddings, head = grads[:5], grads[5 + layer * spec.num_layers :]
    block = grads[5 : 5 + layer]
    return (
        (*reversed(head), embeddings[0]),
        tuple(reversed(block)),
        tuple(reversed(embeddings[1:])),
    )


def bert_training_outline(
    spec: TransformerSpec,
    settings: BlockSettings,
    *,
    tokens: int,
    seq_len: int,
    weights: int,
    gradients: int,
    optimizer: int,
    step_temporaries: int,
    checkpointing: bool = False,
) -> StepOutline:
    """The `StepOutline` of a full ``BertForMaskedLM`` training step (module docstring).

    The closed form's byte totals of weights, gradients, optimizer state and the step's
    temporaries are cut per parameter tensor (`bert_parameters`); the activations are
    the tensors the forward makes, in order.

    With ``checkpointing`` each layer runs forward without autograd (`no_grad_block`)
    keeping its input, and backward recomputes it, saving what `_layer` saves; autocast's
    weight copies are made per layer apart (kept until the forward ends, made again by
    the recompute), as the decoders' outline has them. Against the CUDA-target trace of
    BERT-base, RoBERTa-base and BERT-large MLM steps with checkpointing (fp32, bf16, fp16
    and bf16 autocast), reserved went from -2% to -22% (no outline: the allocated peak
    plus a margin) to a median of 1.0%, from -1.9% to +5.7%. A 4-layer BERT, whose
    logits-sized loss tensors dwarf its layers, is still within 18% either way: which
    segment those land in decides it.
    """
    z = _Sizes(spec, settings, tokens, seq_len)
    core = z.hw if z.flash else z.probabilities
    elements = bert_parameters(spec)
    grads = list(split(gradients, elements))
    head_g, layer_g, embed_g = _gradients(spec, grads)
    per_tensor = round(optimizer / gradients) if gradients else 0
    states = tuple(
        p for g in grads for p in split(math.ceil(optimizer * g / gradients), [1] * per_tensor)
    )
    logits = math.ceil(tokens * spec.vocab * settings.dtype.itemsize)
    loss, loss_saved, loss_grads = _loss(logits, settings)
    return StepOutline(
        training=True,
        parameters=split(weights, elements),
        inputs=(tokens * INT64,),  # the token ids (the labels: the same, or as large)
        num_layers=spec.num_layers,
        residual=z.hr,
        embedding_forward=_embeddings(spec, z, seq_len, settings.residual),
        block_forward=_layer(spec, z, copies=not checkpointing),
        checkpointing=checkpointing,
        block_transient=no_grad_block(spec, settings, tokens, core) if checkpointing else (),
        block_copies=_weight_copies(spec, z) if checkpointing else (),
        head_forward=_head(spec, z),
        logits=logits,
        loss=loss,
        loss_saved=loss_saved,
        loss_grads=loss_grads,
        block_grads=(z.iw, z.iw),  # the gradients of GELU's output and of its input
        layer_gradients=layer_g,
        head_gradients=head_g,
        tied_gradient=head_g[-1] if head_g else 0,  # the decoder's weight is the embedding's
        tied_in_place=z.cast,  # the decoder's gradient comes from autocast's cast
        embedding_gradients=embed_g,
        states=states if per_tensor else (),
        step_temporaries=split(step_temporaries, grads) if grads else (),
    )
