"""A synthetic allocation schedule of one step, from an estimate's `StepOutline`.

The closed form knows the sizes of a step's tensors but not the allocator's view of
them. `step_schedule` lays those tensors out as the allocations and frees of a warm-up
step and of the measured step after it, in the order PyTorch makes them, so that
`replay` (the caching-allocator model) gives the reserved bytes. What reserved adds
to allocated then has its real causes:

* every request is rounded, and one above 1 MiB takes a segment of its own size
  rounded to 2 MiB once it is past 10 MiB (``CUDACachingAllocator.cpp``,
  ``get_allocation_size``): a logits-sized tensor reserves a segment for itself;
* cached blocks are reused best-fit and split, so the optimizer state and gradients the
  warm-up creates *after* its activations are freed land in the blocks the logits and
  the loss left, and the measured step must reserve new segments for those;
* a block run without autograd (a checkpointed forward, or inference) frees its
  intermediates as it goes: the blocks they leave are cached, and they are free at the
  peak (the loss, or the logits) but still reserved;
* under gradient checkpointing backward recomputes one block at a time into blocks cut
  to the previous block's sizes;
* under autocast over fp32 weights each block's 16-bit weight copies are made in its
  forward and, checkpointed, freed when the forward ends (autocast's cache) and made
  again by its recompute.

Order of a training step (``hf_step``-like: ``loss.backward(); opt.step();
opt.zero_grad(set_to_none=True)``): weights and inputs (allocated before the warm-up);
forward block by block; the head, the logits and the loss; backward from the loss to
the top block, then each block down to the embeddings; the optimizer's state (at the
first step only) and its temporaries; the gradients freed. An inference forward runs
each block without autograd, keeps its keys and values, and ends with the logits; its
warm-up is a short forward after which the cache is emptied, so only the weights and
inputs come before it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from torchfit._core import checks
from torchfit.memory.outline import SAVED, StepOutline, Transient

__all__ = ["Schedule", "step_schedule"]

#: An allocation ``(key, nbytes)`` or a free ``(key,)``, as `replay` takes them.
Op = tuple[object, ...]


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The events of a warm-up step and of the step measured after it.

    Attributes:
        warmup: Allocations and frees from an empty allocator to the end of the warm-up.
        events: The measured step; it starts by restating what the warm-up left
            allocated (weights, inputs, optimizer state), as `replay` expects.
    """

    warmup: tuple[Op, ...]
    events: tuple[Op, ...]


class _Writer:
    """Collects events; keys are tuples naming the tensor."""

    def __init__(self) -> None:
        self.ops: list[Op] = []

    def alloc(self, key: tuple[object, ...], nbytes: int) -> None:
        if nbytes > 0:
            self.ops.append((key, nbytes))

    def free(self, key: tuple[object, ...], nbytes: int) -> None:
        if nbytes > 0:
            self.ops.append((key,))


def _held(o: StepOutline, *, states: bool) -> Iterator[tuple[tuple[object, ...], int]]:
    """What is allocated between steps: weights, inputs, and the state after a first step."""
    yield from ((("weight", i), n) for i, n in enumerate(o.parameters))
    yield from ((("input", i), n) for i, n in enumerate(o.inputs))
    if states:
        yield from ((("state", i), n) for i, n in enumerate(o.states))


def _no_grad_block(w: _Writer, o: StepOutline, tag: object) -> None:
    """A block run without autograd: each intermediate freed when its lifetime ends.

    A `SAVED` one (an inference forward's cache) stays; one that outlives the block's
    other allocations is freed at its end.
    """
    alive: list[tuple[tuple[object, ...], int, int]] = []  # key, nbytes, allocations left
    for j, (nbytes, lives) in enumerate(o.block_transient):
        for entry in [a for a in alive if a[2] == 0]:
            w.free(entry[0], entry[1])
            alive.remove(entry)
        w.alloc(("tmp", tag, j), nbytes)
        alive = [(key, n, left - 1) for key, n, left in alive]
        if lives != SAVED:
            alive.append((("tmp", tag, j), nbytes, lives))
    for key, nbytes, _ in alive:
        w.free(key, nbytes)


def _run(w: _Writer, tensors: list[tuple[tuple[object, ...], int, int]]) -> None:
    """Allocate ``(key, nbytes, lifetime)`` in order, each freed when its lifetime ends.

    Lifetimes count the allocations after a tensor (`Transient`); `SAVED` ones stay, and
    whatever else is alive after the last allocation is freed then.
    """
    alive: list[tuple[tuple[object, ...], int, int]] = []
    for key, nbytes, lives in tensors:
        for entry in [a for a in alive if a[2] == 0]:
            w.free(entry[0], entry[1])
            alive.remove(entry)
        w.alloc(key, nbytes)
        alive = [(k, n, left - 1) for k, n, left in alive]
        if lives != SAVED:
            alive.append((key, nbytes, lives))
    for key, nbytes, _ in alive:
        w.free(key, nbytes)


def _named(
    tensors: tuple[Transient, ...], saved: tuple[object, ...], scratch: tuple[object, ...]
) -> list[tuple[tuple[object, ...], int, int]]:
    """Keys for a forward sequence: ``(*saved, k)`` for the k-th `SAVED` tensor, else scratch."""
    out, kept = [], 0
    for j, (nbytes, lives) in enumerate(tensors):
        if lives == SAVED:
            out.append(((*saved, kept), nbytes, lives))
            kept += 1
        else:
            out.append(((*scratch, j), nbytes, lives))
    return out


def _forward(w: _Writer, o: StepOutline) -> None:
    """Embeddings, then the blocks; every block's output (residual) stays until backward."""
    embedding = _named(o.embedding_forward, ("embedding",), ("embedding scratch",))
    _run(w, [*embedding, (("h", -1), o.residual, SAVED)])
    for layer in range(o.num_layers):
        if not o.training:
            _no_grad_block(w, o, layer)
            for k, nbytes in enumerate(o.kv_cache):
                w.alloc(("kv", layer, k), nbytes)
        elif o.checkpointing:
            _copies(w, o, layer)
            _no_grad_block(w, o, layer)
        elif o.block_forward:  # the block's scratch is freed once its output exists
            _copies(w, o, layer)
            block = _named(o.block_forward, ("saved", layer), ("scratch", layer))
            _run(w, [*block, (("h", layer), o.residual, SAVED)])
            w.free(("h", layer - 1), o.residual)
            continue
        else:
            _copies(w, o, layer)
            for j, nbytes in enumerate(o.block_saved):
                w.alloc(("saved", layer, j), nbytes)
        w.alloc(("h", layer), o.residual)
        if not o.training or not o.checkpointing:
            w.free(("h", layer - 1), o.residual)  # kept only as a checkpoint's input


def _copies(w: _Writer, o: StepOutline, layer: int, *, free: bool = False) -> None:
    """Allocate (or free) one block's autocast weight copies."""
    for j, nbytes in enumerate(o.block_copies):
        if free:
            w.free(("copy", layer, j), nbytes)
        else:
            w.alloc(("copy", layer, j), nbytes)


def _head(w: _Writer, o: StepOutline) -> None:
    """Final norm and head, the logits, the loss (its last ``loss_saved`` tensors are saved)."""
    head = _named(o.head_forward, ("head",), ("head scratch",))
    if not o.head_forward:
        head = [(("head", j), nbytes, SAVED) for j, nbytes in enumerate(o.head_saved)]
    loss = [(("loss", j), nbytes, SAVED) for j, nbytes in enumerate(o.loss)]
    w.alloc(("copy", "head"), o.head_copy)
    _run(w, [*head, (("logits",), o.logits, SAVED), *loss])
    for j, nbytes in list(enumerate(o.loss))[: len(o.loss) - o.loss_saved]:
        w.free(("loss", j), nbytes)
    w.free(("logits",), o.logits)
    if o.checkpointing:  # autocast's cache goes at its exit; nothing saved the blocks' copies
        for layer in range(o.num_layers):
            _copies(w, o, layer, free=True)


def _loss_chain(w: _Writer, o: StepOutline) -> tuple[tuple[object, ...], int]:
    """A loss that saved several tensors: its backward a chain of gradients.

    ``nll_loss``'s backward frees its saved input once its gradient exists; each later
    gradient (the cast's back to the logits' dtype, log-softmax's) frees the one before,
    and log-softmax's frees its saved output. Returns the logits' gradient.
    """
    kept = list(enumerate(o.loss))[len(o.loss) - o.loss_saved :]
    chain = [*((("dloss", j), n) for j, n in enumerate(o.loss_grads)), (("dlogits",), o.logits)]
    for k, (key, nbytes) in enumerate(chain):
        w.alloc(key, nbytes)
        if k:
            w.free(*chain[k - 1])
        if k == 0 and kept:
            j, n = kept.pop()
            w.free(("loss", j), n)
    for j, n in reversed(kept):
        w.free(("loss", j), n)
    return chain[-1]


def _loss_backward(w: _Writer, o: StepOutline) -> None:
    """The loss's gradients, the logits' (back in the compute dtype), the head's weights'."""
    if o.loss_saved > 1:
        last = _loss_chain(w, o)
    else:
        grads = list(enumerate(o.loss_grads))
        for j, nbytes in grads:
            w.alloc(("dloss", j), nbytes)
        for j, nbytes in grads[:-1]:
            w.free(("dloss", j), nbytes)
        if o.loss:
            w.free(("loss", len(o.loss) - 1), o.loss[-1])
        last = (("dloss", len(grads) - 1), grads[-1][1] if grads else 0)
        if len(o.loss) > 1:  # the logits' gradient goes back to the compute dtype
            w.alloc(("dlogits",), o.logits)
            w.free(*last)
            last = (("dlogits",), o.logits)
    for j, nbytes in enumerate(o.head_gradients):
        w.alloc(("grad", "head", j), nbytes)
    w.alloc(("dh", o.num_layers - 1), o.residual)
    w.free(*last)
    w.free(("copy", "head"), o.head_copy)


def _backward(w: _Writer, o: StepOutline) -> None:
    """From the loss down to the embeddings, the weights' gradients appearing as it goes."""
    _loss_backward(w, o)
    top = o.num_layers - 1
    for j, nbytes in enumerate(o.saved_by_head):
        w.free(("head", j), nbytes)
    w.free(("h", top), o.residual)
    for layer in reversed(range(o.num_layers)):
        _block_backward(w, o, layer)
    for j, nbytes in enumerate(o.embedding_gradients):
        w.alloc(("grad", "embedding", j), nbytes)
    if o.tied_gradient:  # the embedding's own gradient, added to the head's
        w.alloc(("grad", "tied", "embedding"), o.tied_gradient)
        if not o.tied_in_place:  # into a new tensor, which replaces the head's
            w.alloc(("grad", "tied"), o.tied_gradient)
            w.free(("grad", "head", len(o.head_gradients) - 1), o.tied_gradient)
        w.free(("grad", "tied", "embedding"), o.tied_gradient)
    w.free(("dh", -1), o.residual)
    for j, nbytes in enumerate(n for n, lives in o.embedding_forward if lives == SAVED):
        w.free(("embedding", j), nbytes)


def _block_backward(w: _Writer, o: StepOutline, layer: int) -> None:
    """One block's backward (recomputed first under checkpointing)."""
    saved = o.saved_by_block
    if o.checkpointing:
        _copies(w, o, layer)
        for j, nbytes in enumerate(saved):
            w.alloc(("saved", layer, j), nbytes)
    for j, nbytes in enumerate(o.block_grads):
        w.alloc(("dtmp", layer, j), nbytes)
    grads = list(reversed(list(enumerate(o.layer_gradients))))
    kept = list(reversed(list(enumerate(saved))))
    for k in range(max(len(grads), len(kept))):
        if k < len(grads):
            w.alloc(("grad", layer, grads[k][0]), grads[k][1])
        if k < len(kept):
            w.free(("saved", layer, kept[k][0]), kept[k][1])
    for j, nbytes in enumerate(o.block_grads):
        w.free(("dtmp", layer, j), nbytes)
    _copies(w, o, layer, free=True)
    w.alloc(("dh", layer - 1), o.residual)
    w.free(("dh", layer), o.residual)
    if o.checkpointing:  # the checkpoint's input, released with its saved tensors
        w.free(("h", layer - 1), o.residual)


def _optimizer(w: _Writer, o: StepOutline, *, first: bool) -> None:
    """State at the first step, the step's temporaries, then ``zero_grad(set_to_none=True)``."""
    if first:
        for i, nbytes in enumerate(o.states):
            w.alloc(("state", i), nbytes)
    for j, nbytes in enumerate(o.step_temporaries):
        w.alloc(("step", j), nbytes)
    for j, nbytes in enumerate(o.step_temporaries):
        w.free(("step", j), nbytes)
    _zero_grad(w, o)


def _zero_grad(w: _Writer, o: StepOutline) -> None:
    """``zero_grad(set_to_none=True)``: every gradient freed, in the parameters' order."""
    tied = len(o.head_gradients) - 1 if o.tied_gradient else -1
    if o.tied_gradient:  # the embedding's: set to None first
        key = ("grad", "head", tied) if o.tied_in_place else ("grad", "tied")
        w.free(key, o.tied_gradient)
    for j, nbytes in enumerate(o.head_gradients):
        if j != tied:
            w.free(("grad", "head", j), nbytes)
    for layer in range(o.num_layers):
        for j, nbytes in enumerate(o.layer_gradients):
            w.free(("grad", layer, j), nbytes)
    for j, nbytes in enumerate(o.embedding_gradients):
        w.free(("grad", "embedding", j), nbytes)


def _step(o: StepOutline, *, first: bool) -> list[Op]:
    w = _Writer()
    for key, nbytes in _held(o, states=not first):
        w.alloc(key, nbytes)
    _forward(w, o)
    if not o.training:
        w.alloc(("logits",), o.logits)
        return w.ops
    _head(w, o)
    _backward(w, o)
    _optimizer(w, o, first=first)
    return w.ops


@checks.arguments()
def step_schedule(outline: StepOutline) -> Schedule:
    """The warm-up step's events and the measured step's, from ``outline``.

    Args:
        outline: The step's tensors (`StepOutline`, what an analytic estimate carries).

    Returns:
        A `Schedule`; ``replay(schedule.events, warmup=schedule.warmup)`` gives the
        measured step's peaks.

    Example:
        >>> o = StepOutline(training=False, parameters=(8 * 2**20,), num_layers=1,
        ...                 residual=2**20, block_transient=((2**20, 1), (2**20, 0)),
        ...                 logits=4 * 2**20)
        >>> s = step_schedule(o)
        >>> s.warmup
        ((('weight', 0), 8388608),)
        >>> [op[0][0] for op in s.events]
        ['weight', 'h', 'tmp', 'tmp', 'tmp', 'tmp', 'h', 'h', 'logits']
    """
    if outline.training:
        warmup = _step(outline, first=True)
    else:  # a short forward, then torch.cuda.empty_cache(): only what is held remains
        warmup = [(key, n) for key, n in _held(outline, states=False) if n > 0]
    return Schedule(warmup=tuple(warmup), events=tuple(_step(outline, first=False)))
