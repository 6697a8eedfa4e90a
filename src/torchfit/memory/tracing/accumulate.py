"""Summing the gradients several nodes send to one input, as autograd's engine does.

Where several nodes send a gradient to one input (a residual stream, q, k and v reading
one norm's output, a tied head and embedding), autograd's engine adds them in that
input's buffer, into the first one's memory when it may (``accumulate`` in
``torch/csrc/autograd/input_buffer.cpp``: grad mode off, and the first gradient a plain,
non-overlapping and dense tensor of which the buffer holds the last reference). A fake
tensor is a tensor subclass, which that check refuses, so under the tracker every such
sum would be a new tensor where a real step writes into the first addend: on an H200
(torch 2.11) a Qwen2.5-0.5B step under bf16 autocast allocated 853 residual-sized fp32
tensors where the trace made 1,022 (seven more per layer) and 602 bf16 ones where it made
650 (two more per layer).

The tracker therefore runs the sum in place where the engine would: an ``add`` in
backward of two gradients of one shape and dtype whose first was made in backward by
another node than the running one (it waited in the buffer) and is not a view, whose
base would share its memory. A linear layer's weight gradient is a transposed view, so a
tied head's sum stays a new tensor, unless autocast's cast of the weight made the head's
gradient a fresh one. Checked against the engine itself: the same step on real CPU
tensors under ``torch.profiler`` makes the same out-of-place sums (GPT-2, a tied Llama,
BERT, a residual CNN and PyTorch's encoder layers, fp32 and bf16 autocast), and the H200
snapshots' allocations match the trace's size for size on Llama-3.2-1B, Llama-3.2-3B,
Qwen2.5-0.5B and ResNet-50.
"""

from __future__ import annotations

from typing import Any

import torch

from torchfit._core.ledger import Ledger

__all__ = ["GradientMakers"]

_ADD = torch.ops.aten.add.Tensor


class GradientMakers:
    """Which autograd node allocated each storage of a backward, and the sums they allow.

    Example:
        >>> makers = GradientMakers()
        >>> makers.sums_in_place(torch.ops.aten.mul.Tensor, object(), (), {}, Ledger())
        False
    """

    def __init__(self) -> None:
        """Know no storage yet."""
        self._by_id: dict[int, object] = {}  # storage id -> node (kept: ids stay unique)

    def clear(self) -> None:
        """Forget every storage (at a step's start and end: the nodes go with the graph)."""
        self._by_id.clear()

    def note(self, storage_id: int, node: object) -> None:
        """Remember that ``node``'s op allocated ``storage_id`` (the first node that did)."""
        self._by_id.setdefault(storage_id, node)

    def sums_in_place(
        self,
        func: Any,
        node: object,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        ledger: Ledger,
    ) -> bool:
        """Whether ``func(*args)``, run by ``node``, is the engine's sum, done in place.

        It is when ``func`` is ``aten.add.Tensor`` without ``alpha``, grad mode is off,
        the two addends have one shape and dtype and are not one tensor, and the first one
        was made by another node than ``node`` and is not a view (module notes).
        """
        if func is not _ADD or kwargs or len(args) != 2 or torch.is_grad_enabled():
            return False
        first, second = args
        if not (isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor)):
            return False
        if first.shape != second.shape or first.dtype != second.dtype:
            return False
        if first._is_view():  # noqa: SLF001 - the engine's own test, read from the tensor
            return False
        entry = ledger.get(first.untyped_storage())
        if entry is not None and entry is ledger.get(second.untyped_storage()):
            return False  # ``x + x``: the engine holds the first twice, so it adds anew
        maker = None if entry is None else self._by_id.get(entry.id)
        return maker is not None and maker is not node
