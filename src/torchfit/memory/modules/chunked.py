"""A causal LM's loss taken in chunks of positions, for the meta pass of any family.

LitGPT (``model(input_ids, lm_head_chunk_size=128)`` with ``chunked_cross_entropy``) and
torchtune (``CEWithChunkedOutputLoss``) never build the logits' fp32 gradient for the
whole sequence: the head and the cross-entropy run on one slice of positions at a time,
so backward makes the logit gradients of one slice at a time. `ChunkedLoss` runs a
transformers causal LM that way on meta tensors: its backbone (``base_model``) gives the
last hidden states, each chunk of positions goes through the output head (and Gemma 2's
final soft-capping where the config has it), and the list of chunks goes to the loss:
per chunk an fp32 upcast (torchtune's; the closed
forms count the log-softmax in fp32 too) and ``cross_entropy``. What
autograd saves is then the same as in those recipes: the head's input (when the head
trains), and each chunk's fp32 log-softmax, until backward.

`chunk_refusal` says why a model cannot be run so (no separate head, an encoder-decoder).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional

__all__ = ["ChunkedLoss", "chunk_refusal"]


def _language_model(model: nn.Module) -> Any:
    """The transformers model inside a PEFT wrapper, or ``model`` itself."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def chunk_refusal(model: nn.Module) -> str | None:
    """Why ``model``'s loss cannot be taken in chunks here, or None when it can."""
    lm = _language_model(model)
    config = getattr(lm, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        return "an encoder-decoder computes its loss on the decoder's side"
    head = lm.get_output_embeddings() if hasattr(lm, "get_output_embeddings") else None
    backbone = getattr(lm, "base_model", lm)
    if head is None or backbone is lm:
        return f"{type(lm).__name__} has no output head apart from its backbone"
    return None


class ChunkedLoss(nn.Module):
    """``model``'s mean token cross-entropy, with the head run ``chunk`` positions at a time.

    Example:
        >>> from transformers import BloomConfig, BloomForCausalLM
        >>> with torch.device("meta"):
        ...     lm = BloomForCausalLM(BloomConfig(hidden_size=8, n_layer=1, n_head=2,
        ...                                       vocab_size=32))
        >>> ids = torch.zeros(2, 10, dtype=torch.long, device="meta")
        >>> ChunkedLoss(lm, chunk=4)(input_ids=ids, labels=ids).shape
        torch.Size([])
    """

    def __init__(self, model: nn.Module, *, chunk: int) -> None:
        """Wrap ``model``; ValueError (with the reason) when `chunk_refusal` refuses it."""
        super().__init__()
        reason = chunk_refusal(model)
        if reason is not None:
            raise ValueError(
                f"loss_chunk_size={chunk} cannot be modelled for this model: {reason}; leave "
                "it out, or trace your own training step with torchfit.memory.trace_step"
            )
        self.model = model
        self.chunk = chunk

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """The loss over every position, from the head's output one chunk at a time."""
        lm = _language_model(self.model)
        hidden = lm.base_model(input_ids=input_ids, **kwargs)[0]
        head = lm.get_output_embeddings()
        cap = getattr(lm.config, "final_logit_softcapping", None)
        chunks = [head(states) for states in torch.split(hidden, self.chunk, dim=1)]
        if cap:
            chunks = [torch.tanh(logits / cap) * cap for logits in chunks]
        pairs = zip(chunks, torch.split(labels, self.chunk, dim=1), strict=True)
        losses = [
            functional.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="sum")
            for logits, y in pairs
        ]
        return torch.stack(losses).sum() / labels.numel()
