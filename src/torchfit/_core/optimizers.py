"""The optimizers torchfit has a memory model for, by name, and how a step builds them.

Named optimizers are built with their library's defaults, so that an estimate for
``"adamw"`` describes ``torch.optim.AdamW(params)`` and one for ``"paged-adamw-8bit"``
describes ``bitsandbytes.optim.PagedAdamW8bit(params)``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable

import torch
from torch import nn

from torchfit._core.imports import require

__all__ = [
    "BITSANDBYTES_OPTIMIZERS",
    "OptimizerFactory",
    "OptimizerName",
    "make_optimizer",
    "parse_optimizer",
]

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


class OptimizerName(enum.StrEnum):
    """Optimizers with a known memory model (state bytes per parameter in brackets).

    ``sgd`` [0], ``sgd-momentum`` [one buffer], ``adam``/``adamw`` [two moments],
    ``adamw-8bit`` [two uint8 moments + absmax] and ``paged-adamw-8bit`` /
    ``paged-adamw`` (bitsandbytes; paged state lives in CUDA unified memory, outside
    PyTorch's allocator), ``lion`` [one fp32 moment, bitsandbytes], ``adafactor``
    [factored second moment: a row and a column vector per matrix, ``torch.optim``].
    """

    NONE = "none"
    SGD = "sgd"
    SGD_MOMENTUM = "sgd-momentum"
    ADAM = "adam"
    ADAMW = "adamw"
    ADAMW_8BIT = "adamw-8bit"
    PAGED_ADAMW_8BIT = "paged-adamw-8bit"
    PAGED_ADAMW = "paged-adamw"
    LION = "lion"
    ADAFACTOR = "adafactor"

    @property
    def paged(self) -> bool:
        """State in CUDA unified memory (bitsandbytes' paged optimizers)."""
        return self in {OptimizerName.PAGED_ADAMW, OptimizerName.PAGED_ADAMW_8BIT}


_OPTIMIZER_ALIASES = {
    "momentum": OptimizerName.SGD_MOMENTUM,
    "sgd_momentum": OptimizerName.SGD_MOMENTUM,
    "adam8bit": OptimizerName.ADAMW_8BIT,
    "adamw8bit": OptimizerName.ADAMW_8BIT,
    "adam-8bit": OptimizerName.ADAMW_8BIT,
    "adamw_8bit": OptimizerName.ADAMW_8BIT,
    "adamw_bnb_8bit": OptimizerName.ADAMW_8BIT,  # transformers' TrainingArguments.optim
    "8bit-adam": OptimizerName.ADAMW_8BIT,
    "paged_adamw_8bit": OptimizerName.PAGED_ADAMW_8BIT,
    "pagedadamw8bit": OptimizerName.PAGED_ADAMW_8BIT,
    "paged_adamw_32bit": OptimizerName.PAGED_ADAMW,
    "paged-adamw-32bit": OptimizerName.PAGED_ADAMW,
    "pagedadamw": OptimizerName.PAGED_ADAMW,
    "adamw_torch": OptimizerName.ADAMW,
    "adamw_torch_fused": OptimizerName.ADAMW,
    "lion_32bit": OptimizerName.LION,
}

#: bitsandbytes class for each optimizer it provides (32-bit state for the non-8-bit ones).
BITSANDBYTES_OPTIMIZERS = {
    OptimizerName.ADAMW_8BIT: "AdamW8bit",
    OptimizerName.PAGED_ADAMW_8BIT: "PagedAdamW8bit",
    OptimizerName.PAGED_ADAMW: "PagedAdamW",
    OptimizerName.LION: "Lion",
}


def parse_optimizer(value: str | OptimizerName | None) -> OptimizerName:
    """An optimizer name as an `OptimizerName`; ``None`` means no optimizer.

    Also takes transformers' ``TrainingArguments.optim`` spellings of the same optimizers
    (``"adamw_torch_fused"``, ``"paged_adamw_8bit"``, ...).

    Example:
        >>> parse_optimizer("AdamW")
        <OptimizerName.ADAMW: 'adamw'>
        >>> parse_optimizer("paged_adamw_32bit")
        <OptimizerName.PAGED_ADAMW: 'paged-adamw'>
    """
    if value is None:
        return OptimizerName.NONE
    if not isinstance(value, str):
        raise TypeError(
            f"optimizer must be a name such as 'adamw' or None; got {type(value).__name__}"
        )
    key = value.strip().lower()
    if key in _OPTIMIZER_ALIASES:
        return _OPTIMIZER_ALIASES[key]
    try:
        return OptimizerName(key)
    except ValueError:
        names = ", ".join(repr(o.value) for o in OptimizerName)
        raise ValueError(
            f"unsupported optimizer {value!r}; expected one of {names}, "
            "or a factory such as lambda params: torch.optim.SGD(params, lr=0.1)"
        ) from None


def make_optimizer(
    optimizer: str | OptimizerName | OptimizerFactory | torch.optim.Optimizer | None,
    params: Iterable[nn.Parameter],
) -> torch.optim.Optimizer | None:
    """Build the optimizer a step uses: from a name, a factory, or as given.

    Named optimizers use their library's defaults (``foreach`` where PyTorch picks it).
    """
    if isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    if callable(optimizer) and not isinstance(optimizer, str):
        built = optimizer(params)
        if not isinstance(built, torch.optim.Optimizer):
            raise TypeError(
                f"the optimizer factory returned {type(built).__name__}, not a "
                "torch.optim.Optimizer; pass e.g. lambda params: torch.optim.SGD(params, lr=0.1)"
            )
        return built
    name = parse_optimizer(optimizer)
    trainable = [p for p in params if p.requires_grad]
    if name is OptimizerName.NONE:
        return None
    if name in BITSANDBYTES_OPTIMIZERS:
        bnb = require("bitsandbytes", feature=f"optimizer={name.value!r}")
        cls = getattr(bnb.optim, BITSANDBYTES_OPTIMIZERS[name])
        built_bnb: torch.optim.Optimizer = cls(trainable, lr=1e-3)
        return built_bnb
    return _TORCH_OPTIMIZERS[name](trainable)


_TORCH_OPTIMIZERS: dict[OptimizerName, OptimizerFactory] = {
    OptimizerName.SGD: lambda ps: torch.optim.SGD(ps, lr=1e-3),
    OptimizerName.SGD_MOMENTUM: lambda ps: torch.optim.SGD(ps, lr=1e-3, momentum=0.9),
    OptimizerName.ADAM: lambda ps: torch.optim.Adam(ps, lr=1e-3),
    OptimizerName.ADAMW: lambda ps: torch.optim.AdamW(ps, lr=1e-3),
    OptimizerName.ADAFACTOR: lambda ps: torch.optim.Adafactor(ps, lr=1e-3),
}
