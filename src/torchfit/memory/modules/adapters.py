"""LoRA adapters on a model without a closed form: PEFT's own layers, on the meta device.

`with_adapters` copies the meta-device model and wraps it with ``peft.get_peft_model``,
so the meta pass sees exactly the layers PEFT would add (targets resolved by PEFT,
defaults for the model type included) and a frozen base. `frozen_base_weights` gives the
weights' bytes with the base in its own dtype: under mixed precision a LoRA base stays
in the checkpoint's dtype (``from_pretrained``'s default), only the adapters in fp32.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from torch import nn

from torchfit._core.imports import require
from torchfit._core.units import DType
from torchfit.memory.analytic.lora import DEFAULT_RANK

__all__ = ["frozen_base_weights", "with_adapters"]


def with_adapters(
    model: nn.Module,
    *,
    lora: Any = None,
    rank: int | None = None,
    targets: str | Iterable[str] | None = None,
    dropout: float | None = None,
) -> nn.Module:
    """A copy of ``model`` with PEFT's LoRA layers: from ``lora`` or rank/targets/dropout.

    Without targets, PEFT picks its default for the model type (and says when it has none).

    Raises:
        ValueError: ``lora`` together with rank or targets, or targets PEFT cannot find.
        ImportError: peft is not installed.
    """
    peft = require("peft", feature="LoRA on a model without a closed form")
    if lora is not None and (rank is not None or targets is not None):
        raise ValueError(
            "lora= (a peft.LoraConfig) and lora_rank=/lora_targets= both describe the "
            "adapters; pass one of them"
        )
    if lora is not None:
        lora = copy.deepcopy(lora)  # PEFT fills in fields of the config it is given
    else:
        named = (
            [targets] if isinstance(targets, str) else None if targets is None else list(targets)
        )
        lora = peft.LoraConfig(
            r=DEFAULT_RANK if rank is None else rank,
            target_modules=named,
            lora_dropout=0.0 if dropout is None else dropout,
        )
    try:
        wrapped: nn.Module = peft.get_peft_model(copy.deepcopy(model), lora)
    except ValueError as error:
        raise ValueError(
            f"PEFT cannot place LoRA adapters on {type(model).__name__}: {error} (name the "
            "modules with lora_targets=, e.g. ['query_key_value'])"
        ) from error
    return wrapped


def frozen_base_weights(model: nn.Module, *, trainable: DType, frozen: DType) -> int:
    """Weights' bytes: parameters that train in ``trainable``, frozen ones in ``frozen``."""
    total = 0.0
    for param in model.parameters():
        dtype = trainable if param.requires_grad else frozen
        total += param.numel() * dtype.itemsize
    return int(total)
