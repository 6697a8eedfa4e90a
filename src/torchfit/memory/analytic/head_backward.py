"""The head's backward when its Linear has a bias: a moment of the step with CUDA's staging.

A masked-LM head (BERT's ``cls.predictions.decoder``) adds a bias to the logits, so its
backward sums the logits' gradient over every token (``grad.sum(0)``) into a
vocabulary-sized bias gradient. On CUDA that sum stages partial sums of each vocabulary
entry over several thread blocks (`torchfit._core.reduction`): on an H200, a BERT-base
decoder over 16,384 tokens stages 62.5 MB, allocated beside the logits' 16-bit gradient
and the decoder's input and weight gradients. Where the logits are small next to that
(a small vocabulary, few tokens) this is the step's peak, after the loss's own backward.
Sized for the reference card (`REFERENCE_SMS`): smaller cards stage less or nothing.
"""

from __future__ import annotations

import math

from torchfit._core.reduction import REFERENCE_SMS, REFERENCE_THREADS, Reduction, output_vector
from torchfit.memory.analytic.arch import Family, TransformerSpec
from torchfit.memory.analytic.blocks import loss_bytes
from torchfit.memory.analytic.formulas import FP32  # CUDA sums 16- and 32-bit values in float
from torchfit.memory.analytic.settings import BlockSettings

__all__ = ["head_bias_staging", "head_backward"]


def head_bias_staging(spec: TransformerSpec, tokens: int) -> int:
    """The staging buffer of the head's bias gradient on the reference card (0: no bias).

    Example:
        >>> from torchfit.memory.analytic.arch import spec_from_config
        >>> from transformers import BertConfig
        >>> head_bias_staging(spec_from_config(BertConfig()), tokens=32 * 512)
        62509056
    """
    if spec.family is not Family.BERT:
        return 0
    vector = output_vector(spec.vocab)
    found = Reduction(spec.vocab, tokens, along_fastest=False, vector=vector, accumulator=FP32)
    return found.staging_bytes(REFERENCE_SMS, REFERENCE_THREADS)


def head_backward(
    spec: TransformerSpec,
    settings: BlockSettings,
    *,
    tokens: int,
    activations: int,
    gradients: int,
    copies: int,
) -> tuple[int, str, int, int, int, int] | None:
    """The head's bias-gradient sum as a moment (`training_peak`'s tuple), or None.

    Alive: the activations but the loss's saved log-softmax (freed by its backward), the
    logits' gradient in their dtype, the decoder's input and weight gradients, and the
    staging buffer.
    """
    staging = head_bias_staging(spec, tokens)
    if not staging:
        return None
    e = settings.dtype.itemsize
    saved_loss = math.ceil(tokens * loss_bytes(spec, settings)[0].per_token)
    act = activations - saved_loss
    workspace = math.ceil(tokens * spec.vocab * e + (tokens + spec.vocab) * spec.hidden * e)
    workspace += staging
    total = act + gradients + workspace + copies
    return (
        total,
        "head's backward (its bias gradient's staging buffer)",
        act,
        gradients,
        workspace,
        copies,
    )
