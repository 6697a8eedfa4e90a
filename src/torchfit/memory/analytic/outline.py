"""The closed form's tensors in step order: the `StepOutline` an analytic estimate carries.

`training_outline` and `forward_outline` cut the closed form's byte totals into the
tensors a real step allocates (one per weight, per saved activation, per gradient), so
that `torchfit.memory.allocator.schedule` can replay them through the caching-allocator
model. Totals are kept: the pieces of a category add up to the category.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torchfit.memory.analytic.arch import Family, TransformerSpec
from torchfit.memory.analytic.blocks import SAVED_BY_ACTIVATION, upcasts_logits
from torchfit.memory.analytic.formulas import INT64, AttentionImpl
from torchfit.memory.analytic.gpt2_outline import gpt2_no_grad_block
from torchfit.memory.analytic.settings import BlockSettings
from torchfit.memory.analytic.states import parameter_shapes
from torchfit.memory.analytic.term import Term
from torchfit.memory.outline import SAVED, StepOutline, Transient

__all__ = ["forward_block", "forward_outline", "no_grad_block", "split", "training_outline"]


def split(total: int, weights: Sequence[int]) -> tuple[int, ...]:
    """``total`` bytes cut in proportion to ``weights`` (the pieces add up to ``total``).

    Example:
        >>> split(10, [1, 1, 2])
        (2, 3, 5)
    """
    whole = sum(weights)
    if total <= 0 or whole <= 0:
        return ()
    cuts = [math.floor(total * c / whole) for c in _cumulative(weights)]
    return tuple(b - a for a, b in zip([0, *cuts[:-1]], cuts, strict=True))


def _cumulative(weights: Sequence[int]) -> list[int]:
    out, running = [], 0
    for w in weights:
        running += w
        out.append(running)
    return out


def _elements(spec: TransformerSpec) -> list[int]:
    return [math.prod(shape) for shape in parameter_shapes(spec)]


def _saved_tensors(terms: Sequence[Term], tokens: int) -> tuple[int, ...]:
    """A block's saved terms as the tensors the kernels allocate.

    Each term's ``pieces`` (a norm's input and its per-row statistics, an MLP's chain of
    intermediates, a fused attention's inputs, output and log-sum-exp), else the term as
    one tensor. The sizes decide which cached segment each one fits, so a group is not one
    block of their sum.
    """
    out: list[int] = []
    for term in terms:
        tensors = term.pieces or (term.per_token,)
        out += [n for n in (math.ceil(tokens * t) for t in tensors) if n]
    return tuple(out)


def no_grad_block(
    spec: TransformerSpec, settings: BlockSettings, tokens: int, core: int
) -> tuple[Transient, ...]:
    """A GPT-2 or BERT-style block run without autograd: each intermediate with its lifetime.

    GPT-2 with SDPA follows its real forward (`gpt2_no_grad_block`). Otherwise (eager
    attention): the normed input lives through q, k and v; q through k, v and attention;
    ``core`` is the attention's output (eager: its scores); the MLP is a chain where each
    intermediate lives through the next. Llama-style blocks: `forward_block`.
    """
    if spec.family is Family.GPT2 and settings.attention is not AttentionImpl.EAGER:
        return gpt2_no_grad_block(spec, settings, tokens, core)
    e, r, m = settings.dtype.itemsize, settings.residual, settings.mlp_itemsize
    h, i, kv = spec.hidden * tokens, spec.intermediate * tokens, spec.kv_dim * tokens
    attention: list[Transient] = [
        (math.ceil(h * r), 3),  # normed input
        (math.ceil(h * e), 3),  # q
        (math.ceil(kv * e), 2),  # k
        (math.ceil(kv * e), 1),  # v
        (core, 1),  # attention output
        (math.ceil(h * e), 1),  # o_proj output
        (math.ceil(h * r), 3),  # normed input of the MLP
    ]
    chain = SAVED_BY_ACTIVATION.get(spec.activation, 1)
    mlp = [(math.ceil(i * m), 1) for _ in range(chain + 1)] + [(math.ceil(h * e), 0)]
    return (*attention, *mlp)


def _rms_norm(spec: TransformerSpec, settings: BlockSettings, tokens: int) -> list[Transient]:
    """Llama's ``RMSNorm.forward`` as a real forward allocates it, before its output.

    ``hidden_states.to(torch.float32)`` (none over an fp32 stream), ``pow(2)`` (freed
    once ``mean`` has read it), ``hidden_states * torch.rsqrt(...)``, and its cast back
    to the stream's dtype before the weight multiplies it (transformers 5.x,
    ``LlamaRMSNorm``; the order an H200 snapshot of a Qwen2 forward lists).
    """
    h = tokens * spec.hidden
    r = settings.residual
    upcast: list[Transient] = [(h * 4, 2)] if r < 4 else []
    back: list[Transient] = [(math.ceil(h * r), 1)] if r < 4 else []
    return [*upcast, (h * 4, 0), (h * 4, 1 + len(back)), *back]


def _rope(nbytes: int, then: int) -> list[Transient]:
    """``q * cos + rotate_half(q) * sin``: ``rotate_half`` negates one half and concatenates.

    ``then``: allocations after the rotated tensor before it is freed.
    """
    return [(nbytes, 4), (nbytes // 2, 1), (nbytes, 1), (nbytes, 1), (nbytes, then)]


def forward_block(
    spec: TransformerSpec, settings: BlockSettings, tokens: int, core: int, *, cache: bool
) -> tuple[Transient, ...]:
    """One Llama-style block run without autograd, as a real forward allocates it.

    An inference forward's block, and a checkpointed training block's forward (``cache``
    off). Unlike `no_grad_block` (a generic estimate), it follows the sequence an H200
    memory snapshot of a Qwen2 forward (transformers 5.17, SDPA, ``use_cache``) shows:
    each RMSNorm's fp32 temporaries (`_rms_norm`), Q, K and V, the rotary embedding's
    temporaries for Q then K (`_rope`), with a cache the keys' and values' copies the
    ``DynamicCache`` concatenates (kept: `SAVED`), the attention output, ``o_proj``'s, the
    residual sum the MLP half reads, then the MLP, whose normed input lives until
    ``down_proj`` has run. Against the CUDA-target trace it gives reserved within 0.1% on
    Llama-3.2-1B forwards (the MLP input freed before ``down_proj``: -3.7%) and within 1.6%
    on checkpointed Llama and Qwen2 steps (with `no_grad_block`: up to +18%). Families
    other than Llama: `no_grad_block`.
    """
    if spec.family is not Family.LLAMA:
        return no_grad_block(spec, settings, tokens, core)
    e, r, m = settings.dtype.itemsize, settings.residual, settings.mlp_itemsize
    h, i, kv = spec.hidden * tokens, spec.intermediate * tokens, spec.kv_dim * tokens
    q, k = math.ceil(h * e), math.ceil(kv * e)
    kept: list[Transient] = [(k, SAVED), (k, SAVED)] if cache else []
    rope = 10 + len(kept)  # Q's and K's rotary temporaries, and the cache's copies
    mlp: list[Transient] = [
        *_rms_norm(spec, settings, tokens),
        (math.ceil(h * r), 5),  # normed input of the MLP: until down_proj ran
        (math.ceil(i * m), 1),  # gate
        (math.ceil(i * m), 2),  # act(gate)
        (math.ceil(i * m), 1),  # up
        (math.ceil(i * m), 1),  # product
        (math.ceil(h * e), 0),  # down
    ]
    attention: list[Transient] = [
        *_rms_norm(spec, settings, tokens),
        (math.ceil(h * r), rope + 5),  # normed input: through attention's output and o_proj
        (q, 2 + 10),  # q: through k, v and both rotations
        (k, 1 + 10),
        (k, rope),  # v: until the cache has copied it
        *_rope(q, 5 + len(kept) + 2),  # q rotated: until o_proj
        *_rope(k, len(kept)),  # k rotated: until the cache has copied it
        *kept,
        (core, 1),  # attention output
        (math.ceil(h * e), 1),  # o_proj output
        (math.ceil(h * r), len(mlp)),  # the residual sum: through the MLP half
    ]
    return (*attention, *mlp)


def _block_slice(spec: TransformerSpec) -> tuple[int, int]:
    """Where the first block's tensors start in `parameter_shapes`, and how many a block has."""
    lead = 1 if spec.family is Family.LLAMA else 2  # the embeddings
    tail = 1 if spec.tied_embeddings else 2  # the final norm, and an untied head
    return lead, (len(parameter_shapes(spec)) - lead - tail) // spec.num_layers


def _block_copies(
    spec: TransformerSpec, nbytes: int, *, full: bool, adapters_per_layer: int
) -> tuple[int, ...]:
    """One block's autocast weight copies (``nbytes``), one per matrix it casts."""
    if nbytes <= 0:
        return ()
    if not full:  # the adapters' A and B matrices
        return split(nbytes, [1] * max(adapters_per_layer, 1))
    lead, per = _block_slice(spec)
    shapes = parameter_shapes(spec)[lead : lead + per]
    return split(nbytes, [math.prod(shape) for shape in shapes if len(shape) >= 2])


def _gradient_groups(
    spec: TransformerSpec, gradients: int, *, full: bool, adapters_per_layer: int
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(head, one block, embedding) gradients, in bytes."""
    if gradients <= 0:
        return (), (), ()
    if not full:  # adapters on the blocks: small tensors, spread over the layers
        per_layer = gradients // max(spec.num_layers, 1)
        return (), split(per_layer, [1] * max(adapters_per_layer, 1)), ()
    pieces = split(gradients, _elements(spec))
    lead, per = _block_slice(spec)
    block = pieces[lead : lead + per]
    tail = pieces[lead + per * spec.num_layers :]
    if spec.tied_embeddings:  # the head's gradient is the embedding's, made by the head
        return (*tail, *pieces[:1]), block, pieces[1:lead]
    return tail, block, pieces[:lead]


def training_outline(
    spec: TransformerSpec,
    settings: BlockSettings,
    *,
    tokens: int,
    weights: int,
    gradients: int,
    optimizer: int,
    step_temporaries: int,
    block: Sequence[Term],
    head: Sequence[Term],
    loss_grads: int,
    block_grads: int,
    dequantized: int,
    checkpointing: bool,
    full: bool,
    copies: tuple[int, int] = (0, 0),
) -> StepOutline:
    """The `StepOutline` of a training step from the closed form's terms (bytes).

    ``copies``: autocast's weight copies, all of them and the head's.
    """
    e, v = settings.dtype.itemsize, spec.vocab * tokens
    logits = math.ceil(v * e)
    losses = [t for t in head if t.name.startswith("log-softmax")]
    loss_term = losses[0] if losses else None
    saved_loss = math.ceil(tokens * loss_term.per_token) if loss_term else 0
    upcast = upcasts_logits(spec, settings.dtype)
    loss = (math.ceil(v * 4), saved_loss) if upcast else (saved_loss,)
    kept = [t for t in head if t is not loss_term and t.name != "labels" and t.per_token > 0]
    head_saved = _saved_tensors(kept, tokens)
    adapters_per_layer = 2 * (len(settings.lora.roles) if settings.lora else 7)
    head_g, layer_g, embed_g = _gradient_groups(
        spec, gradients, full=full, adapters_per_layer=adapters_per_layer
    )
    all_copies, head_copy = copies
    block_copies = _block_copies(
        spec,
        (all_copies - head_copy) // max(spec.num_layers, 1),
        full=full,
        adapters_per_layer=adapters_per_layer,
    )
    # the optimizer's lists follow model.parameters(): the embeddings (a tied head's weight
    # is the embedding's), the blocks, then the final norm and an untied head
    tied = head_g[-1:] if full and spec.tied_embeddings else ()
    trained = [*embed_g, *tied, *layer_g * spec.num_layers, *head_g[: len(head_g) - len(tied)]]
    per_tensor = round(optimizer / gradients) if gradients else 0
    states = (
        tuple(
            p
            for g in trained
            for p in split(math.ceil(optimizer * g / gradients), [1] * per_tensor)
        )
        if per_tensor
        else ()
    )
    width = 3 if spec.family is Family.LLAMA else SAVED_BY_ACTIVATION.get(spec.activation, 1)
    attention = [t for t in block if t.name.startswith("attention (")]
    core = math.ceil(tokens * attention[0].per_token) if attention else 0
    return StepOutline(
        training=True,
        parameters=split(weights, _elements(spec)),
        inputs=(tokens * INT64,),
        num_layers=spec.num_layers,
        residual=math.ceil(tokens * spec.hidden * settings.residual),
        block_saved=_saved_tensors(block, tokens),
        block_transient=forward_block(spec, settings, tokens, core, cache=False),
        checkpointing=checkpointing,
        head_saved=head_saved,
        block_copies=block_copies,
        head_copy=head_copy,
        logits=logits,
        loss=tuple(n for n in loss if n),
        loss_grads=split(loss_grads, [1, 1]),
        block_grads=(*split(block_grads, [1] * width), *((dequantized,) if dequantized else ())),
        layer_gradients=layer_g,
        head_gradients=head_g,
        tied_gradient=head_g[-1] if full and spec.tied_embeddings and head_g else 0,
        tied_in_place=head_copy > 0,  # the head's gradient comes from autocast's cast
        embedding_gradients=embed_g,
        states=states,
        step_temporaries=split(step_temporaries, trained) if trained else (),
    )


def forward_outline(
    spec: TransformerSpec,
    settings: BlockSettings,
    *,
    tokens: int,
    weights: int,
    kv_cache: int,
    core: int,
) -> StepOutline:
    """The `StepOutline` of an inference forward (no generation) over ``tokens`` tokens."""
    e = settings.dtype.itemsize
    per_layer = kv_cache // max(spec.num_layers, 1)
    in_block = spec.family is Family.LLAMA  # the cache's copies are made inside the block
    return StepOutline(
        training=False,
        parameters=split(weights, _elements(spec)),
        inputs=(tokens * INT64,),
        num_layers=spec.num_layers,
        residual=math.ceil(tokens * spec.hidden * e),
        block_transient=forward_block(spec, settings, tokens, core, cache=kv_cache > 0),
        logits=math.ceil(tokens * spec.vocab * e),
        kv_cache=() if in_block else split(per_layer, [1, 1]),
    )
