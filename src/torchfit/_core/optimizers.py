"""The optimizers torchfit has a memory model for, by name, and how a step builds them.

Named optimizers are built with their library's defaults, so that an estimate for
``"adamw"`` describes ``torch.optim.AdamW(params)`` and one for ``"paged-adamw-8bit"``
describes ``bitsandbytes.optim.PagedAdamW8bit(params)``. ``torch.optim``'s Adam and AdamW
come in three implementations with different temporaries (`AdamImplementation`), named
with a suffix: ``"adamw-foreach"``, ``"adamw-fused"``, ``"adamw-for-loop"``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable

import torch
from torch import nn

from torchfit._core.imports import require

__all__ = [
    "BITSANDBYTES_OPTIMIZERS",
    "AdamImplementation",
    "OptimizerFactory",
    "OptimizerName",
    "adam_implementation",
    "make_optimizer",
    "optimizer_name_of",
    "parse_optimizer",
]

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


class AdamImplementation(enum.StrEnum):
    """How ``torch.optim.Adam``/``AdamW`` run their step (torch 2.13, torch/optim/adam.py).

    The three differ in the temporaries the step allocates beside the state:

    - ``FOREACH`` (``_multi_tensor_adam``, ``foreach=True``): ``torch._foreach_sqrt`` of
      the second moments makes one new list over all the parameters of a (device, dtype)
      group, divided and shifted in place into the denominators: one tensor the size of
      every trained parameter, in the state's dtype.
    - ``FOR_LOOP`` (``_single_tensor_adam``, ``foreach=False``): one parameter at a time,
      ``(exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)``: the square root and the
      quotient, two tensors of that parameter's size, so the largest parameter decides.
    - ``FUSED`` (``_fused_adam`` calling ``torch._fused_adamw_``, ``fused=True``, CUDA
      and, since torch 2.4, CPU): one in-place kernel, no parameter-sized temporaries.
    - ``DEFAULT``: neither flag given. ``adam()`` then asks
      ``_default_to_fused_or_foreach(params, differentiable, use_fused=False)``
      (torch/optim/optimizer.py): never fused; foreach when every parameter is on a
      device of ``_get_foreach_kernels_supported_devices()`` (CUDA, XPU, MTIA, not CPU)
      and ``differentiable=False``; otherwise the for-loop.
    """

    DEFAULT = "default"
    FOREACH = "foreach"
    FUSED = "fused"
    FOR_LOOP = "for-loop"

    def on(self, device: str) -> AdamImplementation:
        """The implementation that runs on ``device`` (``DEFAULT`` resolved as torch does).

        Example:
            >>> AdamImplementation.DEFAULT.on("cuda"), AdamImplementation.DEFAULT.on("cpu")
            (<AdamImplementation.FOREACH: 'foreach'>, <AdamImplementation.FOR_LOOP: 'for-loop'>)
        """
        if self is not AdamImplementation.DEFAULT:
            return self
        return AdamImplementation.FOR_LOOP if device == "cpu" else AdamImplementation.FOREACH


class OptimizerName(enum.StrEnum):
    """Optimizers with a known memory model (state bytes per parameter in brackets).

    ``sgd`` [0], ``sgd-momentum`` [one buffer], ``adam``/``adamw`` [two moments],
    ``adamw-8bit`` [two uint8 moments + absmax] and ``paged-adamw-8bit`` /
    ``paged-adamw`` (bitsandbytes; paged state lives in CUDA unified memory, outside
    PyTorch's allocator), ``lion`` [one fp32 moment, bitsandbytes], ``adafactor``
    [factored second moment: a row and a column vector per matrix, ``torch.optim``].
    ``adam``/``adamw`` are torch's default implementation for the device; a suffix
    ``-foreach``, ``-fused`` or ``-for-loop`` names one (`AdamImplementation`).
    """

    NONE = "none"
    SGD = "sgd"
    SGD_MOMENTUM = "sgd-momentum"
    ADAM = "adam"
    ADAM_FOREACH = "adam-foreach"
    ADAM_FUSED = "adam-fused"
    ADAM_FOR_LOOP = "adam-for-loop"
    ADAMW = "adamw"
    ADAMW_FOREACH = "adamw-foreach"
    ADAMW_FUSED = "adamw-fused"
    ADAMW_FOR_LOOP = "adamw-for-loop"
    ADAMW_8BIT = "adamw-8bit"
    PAGED_ADAMW_8BIT = "paged-adamw-8bit"
    PAGED_ADAMW = "paged-adamw"
    LION = "lion"
    ADAFACTOR = "adafactor"

    @property
    def paged(self) -> bool:
        """State in CUDA unified memory (bitsandbytes' paged optimizers)."""
        return self in {OptimizerName.PAGED_ADAMW, OptimizerName.PAGED_ADAMW_8BIT}

    @property
    def base(self) -> OptimizerName:
        """The optimizer without its implementation: ``adamw-fused`` -> ``adamw``.

        Example:
            >>> OptimizerName.ADAMW_FUSED.base, OptimizerName.LION.base
            (<OptimizerName.ADAMW: 'adamw'>, <OptimizerName.LION: 'lion'>)
        """
        return _ADAM_VARIANTS.get(self, (self, AdamImplementation.DEFAULT))[0]

    @property
    def is_torch_adam(self) -> bool:
        """``torch.optim.Adam`` or ``AdamW``, in any implementation."""
        return self.base in {OptimizerName.ADAM, OptimizerName.ADAMW}

    @property
    def implementation(self) -> AdamImplementation:
        """The Adam implementation named (``DEFAULT`` for every other optimizer)."""
        return _ADAM_VARIANTS.get(self, (self, AdamImplementation.DEFAULT))[1]


#: Each named implementation of torch's Adam and AdamW: (the optimizer, the implementation).
_ADAM_VARIANTS = {
    OptimizerName.ADAM_FOREACH: (OptimizerName.ADAM, AdamImplementation.FOREACH),
    OptimizerName.ADAM_FUSED: (OptimizerName.ADAM, AdamImplementation.FUSED),
    OptimizerName.ADAM_FOR_LOOP: (OptimizerName.ADAM, AdamImplementation.FOR_LOOP),
    OptimizerName.ADAMW_FOREACH: (OptimizerName.ADAMW, AdamImplementation.FOREACH),
    OptimizerName.ADAMW_FUSED: (OptimizerName.ADAMW, AdamImplementation.FUSED),
    OptimizerName.ADAMW_FOR_LOOP: (OptimizerName.ADAMW, AdamImplementation.FOR_LOOP),
}


def adam_implementation(name: OptimizerName, device: str) -> AdamImplementation | None:
    """Which Adam implementation a step with ``name`` runs on ``device``; None if not Adam.

    Example:
        >>> adam_implementation(OptimizerName.ADAMW, "cuda")
        <AdamImplementation.FOREACH: 'foreach'>
        >>> adam_implementation(OptimizerName.ADAMW_FUSED, "cpu")
        <AdamImplementation.FUSED: 'fused'>
    """
    return name.implementation.on(device) if name.is_torch_adam else None


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
    # transformers' TrainingArguments.optim (trainer_optimizer.py, ``_get_adamw_torch``):
    # torch.optim.AdamW with the device's default implementation, or with fused=True
    "adamw_torch": OptimizerName.ADAMW,
    "adamw_torch_fused": OptimizerName.ADAMW_FUSED,
    "adamw-forloop": OptimizerName.ADAMW_FOR_LOOP,
    "adam-forloop": OptimizerName.ADAM_FOR_LOOP,
    "adamw-multi-tensor": OptimizerName.ADAMW_FOREACH,
    "adam-multi-tensor": OptimizerName.ADAM_FOREACH,
    "lion_32bit": OptimizerName.LION,
}

_NAMES = frozenset(o.value for o in OptimizerName)

#: bitsandbytes class for each optimizer it provides (32-bit state for the non-8-bit ones).
BITSANDBYTES_OPTIMIZERS = {
    OptimizerName.ADAMW_8BIT: "AdamW8bit",
    OptimizerName.PAGED_ADAMW_8BIT: "PagedAdamW8bit",
    OptimizerName.PAGED_ADAMW: "PagedAdamW",
    OptimizerName.LION: "Lion",
}


def parse_optimizer(value: str | OptimizerName | torch.optim.Optimizer | None) -> OptimizerName:
    """An optimizer name as an `OptimizerName`; ``None`` means no optimizer.

    Also takes transformers' ``TrainingArguments.optim`` spellings of the same optimizers
    (``"adamw_torch"``: the device's default implementation; ``"adamw_torch_fused"``,
    ``"paged_adamw_8bit"``, ...), underscores for hyphens (``"adamw_for_loop"``), and a
    built optimizer, named by `optimizer_name_of`.

    Raises:
        TypeError: neither a name, an optimizer nor None.
        ValueError: an unknown name; the message lists the valid ones.

    Example:
        >>> parse_optimizer("AdamW")
        <OptimizerName.ADAMW: 'adamw'>
        >>> parse_optimizer("paged_adamw_32bit")
        <OptimizerName.PAGED_ADAMW: 'paged-adamw'>
        >>> parse_optimizer("adamw_torch_fused")
        <OptimizerName.ADAMW_FUSED: 'adamw-fused'>
    """
    if value is None:
        return OptimizerName.NONE
    if isinstance(value, torch.optim.Optimizer):
        return optimizer_name_of(value)
    if not isinstance(value, str):
        raise TypeError(
            f"optimizer must be a name such as 'adamw' or None; got {type(value).__name__}"
        )
    key = value.strip().lower()
    for spelling in (key, key.replace("_", "-")):
        if spelling in _OPTIMIZER_ALIASES:
            return _OPTIMIZER_ALIASES[spelling]
        if spelling in _NAMES:
            return OptimizerName(spelling)
    names = ", ".join(repr(o.value) for o in OptimizerName)
    raise ValueError(
        f"unsupported optimizer {value!r}; expected one of {names} (or transformers' "
        "'adamw_torch', 'adamw_torch_fused'), or a factory such as "
        "lambda params: torch.optim.SGD(params, lr=0.1)"
    )


def optimizer_name_of(optimizer: torch.optim.Optimizer) -> OptimizerName:
    """The `OptimizerName` of a built optimizer, its Adam implementation included.

    ``torch.optim.Adam``/``AdamW`` read their ``fused``/``foreach`` flags as ``adam()``
    does (torch 2.13, torch/optim/adam.py): ``fused=True`` is fused, ``foreach`` given is
    foreach or the for-loop, ``differentiable=True`` (or a Tensor ``lr`` without
    ``capturable``) keeps torch off foreach, and neither flag is the device's default.

    Raises:
        TypeError: an optimizer torchfit has no closed form for.
        ValueError: param groups that run different implementations.

    Example:
        >>> p = [torch.nn.Parameter(torch.zeros(2))]
        >>> optimizer_name_of(torch.optim.AdamW(p, foreach=False))
        <OptimizerName.ADAMW_FOR_LOOP: 'adamw-for-loop'>
        >>> optimizer_name_of(torch.optim.SGD(p, lr=0.1, momentum=0.9))
        <OptimizerName.SGD_MOMENTUM: 'sgd-momentum'>
    """
    if isinstance(optimizer, torch.optim.Adam):
        decoupled = isinstance(optimizer, torch.optim.AdamW) or optimizer.defaults.get(
            "decoupled_weight_decay", False
        )
        family = OptimizerName.ADAMW if decoupled else OptimizerName.ADAM
        found = {_group_implementation(g) for g in optimizer.param_groups}
        if len(found) > 1:
            raise ValueError(
                f"{type(optimizer).__name__}'s param groups run different implementations "
                f"({', '.join(sorted(i.value for i in found))}); give each group the same "
                "foreach/fused flags, or trace the step with torchfit.memory.trace"
            )
        implementation = found.pop() if found else AdamImplementation.DEFAULT
        return next((n for n, v in _ADAM_VARIANTS.items() if v == (family, implementation)), family)
    if isinstance(optimizer, torch.optim.SGD):
        momentum = any(g.get("momentum", 0) for g in optimizer.param_groups)
        return OptimizerName.SGD_MOMENTUM if momentum else OptimizerName.SGD
    if isinstance(optimizer, torch.optim.Adafactor):
        return OptimizerName.ADAFACTOR
    cls = type(optimizer)
    if cls.__module__.startswith("bitsandbytes"):
        for name, class_name in BITSANDBYTES_OPTIMIZERS.items():
            if cls.__name__ == class_name:
                return name
    raise TypeError(
        f"torchfit has no closed form for {cls.__module__}.{cls.__name__}; name one of "
        f"{', '.join(repr(o.value) for o in OptimizerName)}, or trace the real step "
        "with torchfit.memory.trace(model, inputs, optimizer=...)"
    )


def _group_implementation(group: dict[str, object]) -> AdamImplementation:
    """The implementation ``adam()`` runs for one param group (`optimizer_name_of`)."""
    if group.get("fused"):
        return AdamImplementation.FUSED
    foreach = group.get("foreach")
    if foreach is not None:
        return AdamImplementation.FOREACH if foreach else AdamImplementation.FOR_LOOP
    tensor_lr = isinstance(group.get("lr"), torch.Tensor) and not group.get("capturable")
    if group.get("differentiable") or tensor_lr:
        return AdamImplementation.FOR_LOOP
    return AdamImplementation.DEFAULT


def make_optimizer(
    optimizer: str | OptimizerName | OptimizerFactory | torch.optim.Optimizer | None,
    params: Iterable[nn.Parameter],
) -> torch.optim.Optimizer | None:
    """Build the optimizer a step uses: from a name, a factory, or as given.

    Named optimizers use their library's defaults (``foreach`` where PyTorch picks it);
    a named Adam implementation sets ``foreach=True``, ``foreach=False`` or ``fused=True``.

    Example:
        >>> opt = make_optimizer("adamw-fused", [torch.nn.Parameter(torch.zeros(2))])
        >>> type(opt).__name__, opt.defaults["fused"]
        ('AdamW', True)
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
    if name.is_torch_adam:
        adam = torch.optim.AdamW if name.base is OptimizerName.ADAMW else torch.optim.Adam
        foreach, fused = _IMPLEMENTATION_FLAGS[name.implementation]
        return adam(trainable, lr=1e-3, foreach=foreach, fused=fused)
    return _TORCH_OPTIMIZERS[name](trainable)


#: The ``foreach`` and ``fused`` arguments of ``torch.optim.Adam``/``AdamW`` for each one.
_IMPLEMENTATION_FLAGS: dict[AdamImplementation, tuple[bool | None, bool | None]] = {
    AdamImplementation.DEFAULT: (None, None),
    AdamImplementation.FOREACH: (True, None),
    AdamImplementation.FOR_LOOP: (False, None),
    AdamImplementation.FUSED: (None, True),
}

_TORCH_OPTIMIZERS: dict[OptimizerName, OptimizerFactory] = {
    OptimizerName.SGD: lambda ps: torch.optim.SGD(ps, lr=1e-3),
    OptimizerName.SGD_MOMENTUM: lambda ps: torch.optim.SGD(ps, lr=1e-3, momentum=0.9),
    OptimizerName.ADAFACTOR: lambda ps: torch.optim.Adafactor(ps, lr=1e-3),
}
