"""What a transformers model takes as one batch, as meta tensors, and how long it may be.

`example_batch` makes the keyword arguments of one step for a model built from its
config: int64 token ids of ``(batch, seq)`` for text models, the label ids a training
step's loss needs, decoder ids for encoder-decoders (T5, BART), and Whisper's log-mel
features. `sequence_limit` is the longest sequence a config allows.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["DEFAULT_SEQUENCE", "example_batch", "loss_tokens", "sequence_limit"]

#: The sequence planned for a model whose config records no limit (T5's relative
#: positions): the length T5 was pre-trained with.
DEFAULT_SEQUENCE = 512
_LIMITS = ("max_position_embeddings", "n_positions", "n_ctx", "max_target_positions")


def sequence_limit(config: Any) -> int | None:
    """The longest (decoder) sequence a config allows, or ``None`` when it sets none.

    Whisper's limit is its decoder's (``max_target_positions``): its encoder always
    takes 30 s of audio.

    Example:
        >>> from transformers import GPT2Config, T5Config, WhisperConfig
        >>> sequence_limit(GPT2Config()), sequence_limit(WhisperConfig())
        (1024, 448)
        >>> sequence_limit(T5Config()) is None
        True
    """
    names = ("max_target_positions", *_LIMITS) if _is_speech(config) else _LIMITS
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _is_speech(config: Any) -> bool:
    return hasattr(config, "num_mel_bins")


def example_batch(
    model: nn.Module, *, batch_size: int, seq_len: int, training: bool
) -> dict[str, torch.Tensor]:
    """The keyword arguments of one step of ``model``, as meta tensors.

    Decoders and encoders get ``input_ids``; a training step of a model with an LM head
    also gets ``labels`` (the model computes its loss from them); encoder-decoders get
    ``decoder_input_ids`` as long as the input (Whisper's decoder: at most
    ``max_target_positions``), so no config field is needed to shift the labels;
    Whisper's encoder gets ``input_features`` of ``(batch, num_mel_bins, 2 *
    max_source_positions)``: 30 s of audio.

    Example:
        >>> from transformers import T5Config, T5ForConditionalGeneration
        >>> with torch.device("meta"):
        ...     t5 = T5ForConditionalGeneration(T5Config(num_layers=1, d_model=8, d_ff=8))
        >>> batch = example_batch(t5, batch_size=2, seq_len=16, training=True)
        >>> {k: tuple(v.shape) for k, v in batch.items()}
        {'input_ids': (2, 16), 'decoder_input_ids': (2, 16), 'labels': (2, 16)}
    """
    config: Any = getattr(model, "config", None)
    batch: dict[str, torch.Tensor] = {}
    target = seq_len
    if _is_speech(config):
        frames = 2 * int(config.max_source_positions)
        features = (batch_size, int(config.num_mel_bins), frames)
        batch["input_features"] = torch.empty(features, dtype=_float_dtype(model), device="meta")
        target = min(seq_len, int(getattr(config, "max_target_positions", seq_len)))
    else:
        batch["input_ids"] = _ids(batch_size, seq_len)
    if getattr(config, "is_encoder_decoder", False):
        batch["decoder_input_ids"] = _ids(batch_size, target)
    head = getattr(model, "get_output_embeddings", lambda: None)()
    if training and head is not None:
        batch["labels"] = _ids(batch_size, target)
    return batch


def _ids(batch_size: int, length: int) -> torch.Tensor:
    return torch.empty((batch_size, length), dtype=torch.long, device="meta")


def loss_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Tokens the loss of `example_batch`'s batch is taken over (0 without labels)."""
    labels = batch.get("labels")
    return 0 if labels is None else labels.numel()


def _float_dtype(model: nn.Module) -> torch.dtype:
    for param in model.parameters():
        if param.is_floating_point():
            return param.dtype
    return torch.get_default_dtype()
