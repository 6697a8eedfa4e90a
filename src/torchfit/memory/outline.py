"""`StepOutline`: the tensors of one step, by size, in the order a real step makes them.

An analytic estimate knows the sizes behind its peak (one tensor per weight, what a block
saves, the logits, the optimizer state); the outline keeps them in step order so that
`torchfit.memory.allocator.schedule` can turn them into the allocations and frees of a
warm-up step and the measured step, and the caching-allocator model can replay those.
The reserved bytes then come from the allocator's own rules (block rounding, segment
sizes, best-fit reuse of cached blocks) instead of a fixed allowance.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

from torchfit._core import checks
from torchfit._core.ledger import Event

__all__ = [
    "SAVED",
    "ForwardEvent",
    "RecordedStep",
    "Resizable",
    "StepOutline",
    "Transient",
    "lifetimes",
    "live_peak",
]

#: A tensor of a no-grad forward: its bytes, and for how many of the allocations after it
#: it stays alive (then it is freed, before the next one).
Transient = tuple[int, int]

#: The lifetime of a tensor in a training forward's sequence (`StepOutline.block_forward`,
#: ``embedding_forward``, ``head_forward``) that autograd saves: it lives until backward.
SAVED = 2**31 - 1

#: An allocation ``(name, nbytes)`` or the free of a name, in a forward's order.
ForwardEvent = tuple[str, int] | str


def lifetimes(steps: Sequence[ForwardEvent]) -> tuple[Transient, ...]:
    """The allocations of ``steps`` as `Transient`s, names unique.

    Each lives through the allocations made before its free; one never freed lives to
    the end of the sequence.

    Example:
        >>> lifetimes([("a", 4), ("b", 8), "a", ("c", 2), "b"])
        ((4, 1), (8, 1), (2, 1))
    """
    out = []
    for start, step in enumerate(steps):
        if isinstance(step, str):
            continue
        name, nbytes = step
        later = steps[start + 1 :]
        freed = later.index(name) if name in later else len(later)
        made = sum(1 for s in later[:freed] if not isinstance(s, str))
        out.append((nbytes, made + (1 if freed == len(later) else 0)))
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class StepOutline:
    """One step's tensors in bytes, grouped by the phase that allocates them.

    A training step: forward (per block the saved tensors, or under gradient
    checkpointing the block run without autograd and its input kept), the head and the
    loss, backward from the top block down (the recomputed block, its transient
    gradients, its weights' gradients), the optimizer step (its state created at the
    first step, its temporaries) and ``zero_grad(set_to_none=True)``. An inference
    forward: the blocks run without autograd, each adding its keys and values to the
    cache, then the logits.

    Attributes:
        training: A training step (else an inference forward).
        parameters: One entry per weight tensor, in the model's order.
        inputs: Input tensors held across steps (token ids, labels).
        num_layers: Blocks in the stack.
        residual: One residual-stream tensor (a block's input and output).
        block_saved: What one block saves for backward, in forward order (training).
        block_transient: A block run without autograd: each tensor with its lifetime
            (see `Transient`); the checkpointed forward of training, or inference.
        checkpointing: Gradient checkpointing: forward keeps each block's input only,
            backward recomputes one block at a time.
        head_saved: What the final norm and head save before the logits.
        block_copies: Autocast's 16-bit copies of one block's weights, made in its
            forward. Autocast's cache holds them until the forward ends; autograd saves
            them until the block's backward, or, under checkpointing, only its recompute's.
        head_copy: Autocast's 16-bit copy of the head's weight, saved until its backward.
        logits: The head's output in the compute dtype.
        loss: The loss's forward tensors in order; the last is saved for backward.
        loss_grads: The gradients the loss's backward holds together (then the
            logits' gradient in the compute dtype when the loss upcast them).
        block_grads: Transient gradients alive together in one block's backward.
        layer_gradients: One block's weight gradients.
        head_gradients: Weight gradients made by the head's backward.
        tied_gradient: Where the head shares the input embedding's weight (the last of
            ``head_gradients``): the embedding's backward makes that gradient once more
            at the end of backward and autograd adds the two (0: not tied, or the
            embedding is frozen).
        tied_in_place: How autograd adds them. True: into the head's gradient, the
            embedding's freed at once; False: into a new tensor, the sum and its two
            addends alive together. Autograd's engine adds into the first gradient only
            when it is a plain tensor it holds alone (``accumulate`` in
            ``torch/csrc/autograd/input_buffer.cpp``): under autocast over fp32 weights
            the head's gradient comes from the cast's backward, a fresh tensor; straight
            from the head's matmul it is a transposed view, which it may not write to.
            On an H200 (torch 2.11) Qwen2.5-0.5B and BERT under autocast allocated no sum,
            GPT-2, Llama-3.2-1B and Qwen3-0.6B in their own dtype did.
        embedding_gradients: Weight gradients made at the end of backward.
        states: Optimizer state tensors, in the order the first step creates them.
        step_temporaries: The optimizer step's temporaries, alive together.
        kv_cache: One block's keys and values (an inference forward returning a cache).
        block_forward: A training block's forward, every tensor in the order it is made
            with its lifetime (`Transient`; `SAVED`: kept for backward), where the block
            also frees tensors before backward (an encoder's dense outputs, dropout
            outputs and normed copies). Given, it replaces ``block_saved`` in forward
            (see `saved_by_block`).
        embedding_forward: The embeddings' tensors before the first residual, likewise
            (`SAVED` ones are freed after the last block's backward).
        head_forward: The head's tensors before the logits, likewise, lifetimes counted
            over the logits and the loss too; given, it replaces ``head_saved``.
        loss_saved: How many of ``loss``'s last tensors are saved for backward. More than
            one (a masked LM under CUDA autocast keeps its 16-bit log-softmax and
            ``nll_loss``'s fp32 copy of it) makes the loss's backward a chain: each of
            ``loss_grads`` is freed once the next exists, each saved tensor once its
            gradient exists.

    Example:
        >>> o = StepOutline(training=False, parameters=(1024, 4096), num_layers=2)
        >>> o.weights
        5120
    """

    training: bool
    parameters: tuple[int, ...]
    inputs: tuple[int, ...] = ()
    num_layers: int = 0
    residual: int = 0
    block_saved: tuple[int, ...] = ()
    block_transient: tuple[Transient, ...] = ()
    checkpointing: bool = False
    head_saved: tuple[int, ...] = ()
    block_copies: tuple[int, ...] = ()
    head_copy: int = 0
    logits: int = 0
    loss: tuple[int, ...] = ()
    loss_grads: tuple[int, ...] = ()
    block_grads: tuple[int, ...] = ()
    layer_gradients: tuple[int, ...] = ()
    head_gradients: tuple[int, ...] = ()
    tied_gradient: int = 0
    tied_in_place: bool = False
    embedding_gradients: tuple[int, ...] = ()
    states: tuple[int, ...] = ()
    step_temporaries: tuple[int, ...] = ()
    kv_cache: tuple[int, ...] = ()
    block_forward: tuple[Transient, ...] = ()
    embedding_forward: tuple[Transient, ...] = ()
    head_forward: tuple[Transient, ...] = ()
    loss_saved: int = 1

    def __post_init__(self) -> None:
        """Refuse negative sizes and lifetimes, and a sequence given twice."""
        checks.fields(self)
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool):
                continue
            items = value if isinstance(value, tuple) else (value,)
            numbers = [n for item in items for n in (item if isinstance(item, tuple) else (item,))]
            bad = [n for n in numbers if isinstance(n, bool) or not isinstance(n, int) or n < 0]
            if bad:
                raise ValueError(
                    f"StepOutline.{field.name} holds {bad[0]!r}; expected whole numbers of "
                    "bytes (or lifetimes) >= 0"
                )
        for sequence, kept in (("block_forward", "block_saved"), ("head_forward", "head_saved")):
            if getattr(self, sequence) and getattr(self, kept):
                raise ValueError(
                    f"StepOutline got both {sequence} and {kept}; expected one of them "
                    f"({sequence}'s SAVED tensors are what is kept): drop {kept}"
                )
        if not 1 <= self.loss_saved <= max(len(self.loss), 1):
            raise ValueError(
                f"StepOutline.loss_saved is {self.loss_saved}; expected 1 to "
                f"{max(len(self.loss), 1)}, the number of loss tensors"
            )

    @property
    def saved_by_block(self) -> tuple[int, ...]:
        """What one block keeps for backward: the `SAVED` tensors of ``block_forward``."""
        if not self.block_forward:
            return self.block_saved
        return tuple(n for n, lives in self.block_forward if lives == SAVED)

    @property
    def saved_by_head(self) -> tuple[int, ...]:
        """What the head keeps for backward before the logits (``head_forward``'s `SAVED`)."""
        if not self.head_forward:
            return self.head_saved
        return tuple(n for n, lives in self.head_forward if lives == SAVED)

    @property
    def weights(self) -> int:
        """Bytes of the weight tensors."""
        return sum(self.parameters)


@dataclasses.dataclass(frozen=True)
class RecordedStep:
    """A step's allocations and frees as a trace recorded them, its warm-up's before them.

    What a traced estimate carries instead of a `StepOutline`: `to_device` replays these
    exact events (``(key, nbytes)`` allocations, ``(key,)`` frees) through the
    caching-allocator model rather than a schedule synthesized from sizes.

    Attributes:
        warmup: The warm-up step's events, from an empty allocator.
        events: The measured step's events.
        training: The step runs a backward (on its own thread: a second cuBLAS workspace).
        resizable: ``(id, reduction)`` of the kernel-scratch events whose size depends on
            the card: each ``reduction.staging_bytes(sm_count, threads)`` (see
            `torchfit.memory.kernels.cuda_reduce`).
    """

    warmup: tuple[tuple[object, ...], ...]
    events: tuple[tuple[object, ...], ...]
    training: bool = False
    resizable: tuple[tuple[object, Resizable], ...] = ()

    def on_card(self, sm_count: int, threads: int) -> RecordedStep:
        """The same step with each resizable scratch sized for a card of ``sm_count`` SMs.

        Example:
            >>> class Half:
            ...     def staging_bytes(self, sm_count, threads): return sm_count * 512
            >>> events = (Event("alloc", 1, 9), Event("free", 1, 9))
            >>> RecordedStep((), events, resizable=((1, Half()),)).on_card(4, 2048).events
            (Event(kind='alloc', id=1, nbytes=2048), Event(kind='free', id=1, nbytes=2048))
        """
        if not self.resizable:
            return self
        sizes = {key: found.staging_bytes(sm_count, threads) for key, found in self.resizable}
        return dataclasses.replace(
            self, warmup=_resized(self.warmup, sizes), events=_resized(self.events, sizes)
        )


class Resizable(Protocol):
    """Kernel scratch whose bytes depend on the card (a CUDA reduction's staging buffer)."""

    def staging_bytes(self, sm_count: int, threads: int) -> int:
        """Its bytes on a card of ``sm_count`` SMs of ``threads`` resident threads each."""
        ...


def _resized(
    events: tuple[tuple[object, ...], ...], sizes: dict[object, int]
) -> tuple[tuple[object, ...], ...]:
    """``events`` with the bytes of each event whose id is in ``sizes`` replaced."""
    return tuple(
        event._replace(nbytes=sizes[event.id])
        if isinstance(event, Event) and event.id in sizes
        else event
        for event in events
    )


def live_peak(events: Sequence[tuple[object, ...]]) -> int:
    """The largest sum of live bytes over a trace's `Event` s (other events are skipped).

    Example:
        >>> live_peak([Event("alloc", 1, 5), Event("alloc", 2, 3), Event("free", 1, 5)])
        8
    """
    live = peak = 0
    for event in events:
        if isinstance(event, Event):
            live += event.nbytes if event.kind == "alloc" else -event.nbytes
            peak = max(peak, live)
    return peak
