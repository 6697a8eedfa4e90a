"""Which layers get quantized: settings, the skip list and the selection.

`select_layers` decides, on a real or meta-device model, which ``nn.Linear``/``Conv1D`` layers
bitsandbytes will replace: the default skip list (``lm_head``, tied embeddings, the last
module) *merged with* the user's, each user name checked against the real module names.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import importlib
import re
from collections.abc import Iterable

import torch
from torch import nn

from torchfit._core import checks
from torchfit._core.imports import require

__all__ = [
    "LayerSelection",
    "QuantSettings",
    "QuantType",
    "default_skip",
    "is_hf",
    "is_linear",
    "select_layers",
    "out_in",
    "skip_list",
    "skip_matches",
]


class QuantType(enum.StrEnum):
    """4-bit data types of bitsandbytes."""

    NF4 = "nf4"
    FP4 = "fp4"


@dataclasses.dataclass(frozen=True)
class QuantSettings:
    """What to quantize to, validated at the door.

    Example:
        >>> QuantSettings(bits=4, quant_type="nf4", double_quant=True).method
        'nf4 + double quant'
        >>> QuantSettings(bits=3)
        Traceback (most recent call last):
        ...
        ValueError: bits=3 is not supported; expected 4 (NF4/FP4 with blocks of 64) or 8 (LLM.int8)
    """

    bits: int = 4
    quant_type: QuantType | str = QuantType.NF4
    double_quant: bool = True

    def __post_init__(self) -> None:
        """Refuse bits other than 4 or 8, an unknown quant_type, a non-bool double_quant."""
        checks.fields(self, "bits")
        if isinstance(self.bits, bool) or self.bits not in (4, 8):
            raise ValueError(
                f"bits={self.bits!r} is not supported; expected 4 (NF4/FP4 with blocks of 64) "
                "or 8 (LLM.int8)"
            )
        try:
            quant_type = QuantType(str(self.quant_type).strip().lower())
        except ValueError:
            raise ValueError(
                f"unknown quant_type {self.quant_type!r}; expected 'nf4' or 'fp4'"
            ) from None
        object.__setattr__(self, "quant_type", quant_type)
        if not isinstance(self.double_quant, bool):
            raise TypeError(f"double_quant must be True or False; got {self.double_quant!r}")

    @property
    def method(self) -> str:
        """``"nf4 + double quant"``, ``"fp4"`` or ``"int8"``."""
        if self.bits == 8:
            return "int8"
        return f"{self.quant_type}{' + double quant' if self.double_quant else ''}"

    @property
    def quantized_kind(self) -> str:
        """The bitsandbytes module that replaces a quantized layer."""
        return "Linear4bit" if self.bits == 4 else "Linear8bitLt"


@dataclasses.dataclass(frozen=True)
class LayerSelection:
    """The layers to quantize and the skip list transformers gets.

    Attributes:
        quantize: Module names that bitsandbytes will replace.
        skip: The merged skip list (defaults + the user's), as passed on to transformers.
        defaults: The default part of `skip`.
    """

    quantize: tuple[str, ...]
    skip: tuple[str, ...]
    defaults: tuple[str, ...]


def is_hf(model: nn.Module) -> bool:
    """True for a transformers ``PreTrainedModel`` (checked without importing transformers)."""
    return any(c.__name__ == "PreTrainedModel" for c in type(model).__mro__)


def is_linear(module: nn.Module, *, subclasses: bool = True) -> bool:
    """An ``nn.Linear`` (its subclasses too, unless ``subclasses=False``) or transformers' Conv1D.

    transformers 5 quantizes exactly ``nn.Linear`` and its own ``Conv1D``
    (integrations/bitsandbytes.py, ``replace_with_bnb_linear``): ``subclasses=False``.
    transformers 4.x replaced every ``nn.Linear`` instance, and PEFT adapts them.
    """
    cls = type(module)
    linear = isinstance(module, nn.Linear) if subclasses else cls is nn.Linear
    return linear or (cls.__name__ == "Conv1D" and cls.__module__.startswith("transformers"))


def out_in(module: nn.Module) -> tuple[int, int]:
    weight = module.weight
    if not isinstance(weight, torch.Tensor):  # pragma: no cover - candidates have weights
        raise TypeError(f"{type(module).__name__} has no weight tensor")
    if isinstance(module, nn.Linear):  # subclasses too (Falcon's FalconLinear)
        return int(weight.shape[0]), int(weight.shape[1])
    return int(weight.shape[1]), int(weight.shape[0])  # Conv1D stores (in, out)


# A skip name matches a module path from its start up to a "." boundary, as a regular
# expression, or as a plain suffix: the rule of transformers 5.x
# (quantizers/quantizers_utils.py, should_convert_module).
_BOUNDARY = r"(?:(?<=\.)|(?=\.|$))"


def skip_matches(key: str, name: str) -> bool:
    """True when the skip entry ``key`` protects the module called ``name``.

    Example:
        >>> skip_matches("lm_head", "lm_head"), skip_matches("layers.1", "layers.11.mlp")
        (True, False)
        >>> skip_matches("c_proj", "transformer.h.0.mlp.c_proj")
        True
    """
    return name.endswith(key) or re.match(f"(?:{key}){_BOUNDARY}", name) is not None


def _hf_defaults(model: nn.Module) -> list[str]:
    require("transformers", feature="torchfit.quantize")
    # transformers 5 keeps the default skip list in quantizers/base.py; 4.x kept it in
    # integrations/bitsandbytes.py.
    for where in ("transformers.quantizers.base", "transformers.integrations.bitsandbytes"):
        finder = getattr(importlib.import_module(where), "get_keys_to_not_convert", None)
        if finder is not None:
            return list(finder(model)) + _fp32_modules(model)
    raise ImportError(  # pragma: no cover - every supported transformers has one
        "this transformers has no get_keys_to_not_convert; pip install -U 'torchfit[quantize]'"
    )


def default_skip(model: nn.Module) -> list[str]:
    """The skip list transformers' bitsandbytes loading gives a transformers ``model``.

    The output head, tied embeddings, the module of the last parameter and the model's
    ``_keep_in_fp32_modules`` (`select_layers` merges the user's entries into it).
    """
    return _hf_defaults(model)


def _fp32_modules(model: nn.Module) -> list[str]:
    # transformers adds `_keep_in_fp32_modules` (not the `_strict` set) to the skip list
    # itself (quantizer_bnb_4bit.py / quantizer_bnb_8bit.py, get_modules_to_not_convert).
    return list(getattr(model, "_keep_in_fp32_modules", None) or ())


def _plain_defaults(model: nn.Module) -> list[str]:
    # The same idea as transformers' default for any nn.Module: keep the module that owns
    # the last parameter (the output head) and every layer whose weight is shared.
    owners: dict[int, list[str]] = {}
    last = ""
    for name, module in model.named_modules():
        for param in module.parameters(recurse=False):
            owners.setdefault(id(param), []).append(name)
            last = name
    shared = {n for names in owners.values() if len(names) > 1 for n in names}
    return sorted(shared | ({last} if last else set()))


def _check_user_skips(model: nn.Module, user: list[str]) -> None:
    names = [n for n, _ in model.named_modules() if n]
    for key in user:
        if not isinstance(key, str) or not key:
            raise TypeError(f"skip_modules entries must be non-empty strings; got {key!r}")
        try:
            re.compile(key)
        except re.error as e:
            raise ValueError(
                f"skip_modules entry {key!r} is not a valid regular expression ({e}); "
                "transformers matches entries as regular expressions: escape '.', '[', '('"
            ) from e
        if not any(skip_matches(key, n) for n in names):
            tails = sorted({n.rsplit(".", 1)[-1] for n in names} | set(names))
            close = difflib.get_close_matches(key, tails, n=3)
            hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
            raise ValueError(
                f"skip_modules entry {key!r} matches no module of {type(model).__name__}, so "
                f"it would protect nothing{hint}. An entry matches a module path from its "
                "start ('model.layers.0') or its end ('lm_head', 'mlp.down_proj')"
            )


def skip_list(skip_modules: Iterable[str]) -> list[str]:
    """``skip_modules`` as a list, refusing a bare string (a common slip)."""
    if isinstance(skip_modules, str):
        raise TypeError(
            f"skip_modules must be a list of module names; got the string {skip_modules!r} "
            f"(write skip_modules=[{skip_modules!r}])"
        )
    return list(skip_modules)


def select_layers(
    model: nn.Module,
    settings: QuantSettings,
    skip_modules: Iterable[str],
    *,
    saved_skip: Iterable[str] = (),
) -> LayerSelection:
    """Decide which layers of ``model`` (real or on the meta device) get quantized.

    ``saved_skip`` is the skip list stored with a checkpoint saved quantized: transformers
    uses it in place of the default list.

    Raises:
        TypeError: ``skip_modules`` is a single string or holds something else.
        ValueError: a skip entry matches no module, or nothing is left to quantize.
    """
    user = skip_list(skip_modules)
    _check_user_skips(model, user)
    saved = list(saved_skip)
    exact: set[str] = set()  # plain modules: default names match whole paths only
    if saved:
        defaults = saved + _fp32_modules(model)
    elif is_hf(model):
        defaults = _hf_defaults(model)
    else:
        defaults = _plain_defaults(model)
        exact = set(defaults)
    skip = tuple(dict.fromkeys([*defaults, *user]))
    patterns = [k for k in skip if k not in exact or k in user]
    candidates = [n for n, m in model.named_modules() if is_linear(m, subclasses=False)]
    chosen = tuple(
        n for n in candidates if n not in exact and not any(skip_matches(k, n) for k in patterns)
    )
    if not chosen:
        what = (
            f"all {len(candidates)} of its nn.Linear/Conv1D layers are skipped ({list(skip)})"
            if candidates
            else "it has no nn.Linear or transformers Conv1D layer"
        )
        fix = (
            "shorten skip_modules"
            if user
            else "the default skip list keeps the output head and tied embeddings"
        )
        raise ValueError(
            f"{type(model).__name__} has nothing to quantize: {what}. bitsandbytes "
            f"{settings.bits}-bit replaces only nn.Linear/Conv1D layers; {fix}, or keep this "
            "model in 16-bit"
        )
    return LayerSelection(quantize=chosen, skip=skip, defaults=tuple(dict.fromkeys(defaults)))
