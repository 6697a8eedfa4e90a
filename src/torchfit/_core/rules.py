"""The value rules of `torchfit._core.checks`: one per kind of value, one message shape.

A rule is called as ``rule(name, value)`` and returns the value (normalized: numpy
integers become ``int``) or raises a ``TypeError`` (wrong kind) or ``ValueError`` (right
kind, wrong value) whose message names the parameter, the value, what was expected and,
where one helps, the fix::

    batch_size must be a whole number >= 1; got 0
"""

from __future__ import annotations

import math
import numbers
import os
from collections import abc
from collections.abc import Callable
from typing import Any

__all__ = [
    "Rule",
    "among",
    "each",
    "fail",
    "inputs",
    "model",
    "model_name",
    "model_ref",
    "number",
    "one_of",
    "parsed",
    "shape",
    "text",
    "whole",
]


def _got(value: object) -> str:
    """``value`` as a message shows it: its repr, and its type when the repr hides it."""
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    if isinstance(value, bool | int | float | str | tuple | list | dict | type(None)):
        return shown
    return f"{shown} ({type(value).__name__})"


def fail(
    name: str, expected: str, value: object, *, fix: str = "", kind: type[Exception] = ValueError
) -> Exception:
    """The error for ``name=value``: names the parameter, the value, the expectation, the fix.

    Example:
        >>> fail("batch_size", "a whole number >= 1", 0)
        ValueError('batch_size must be a whole number >= 1; got 0')
    """
    message = f"{name} must be {expected}; got {_got(value)}"
    return kind(f"{message}; {fix}" if fix else message)


class Rule:
    """A check of one value: ``rule(name, value)`` returns it (normalized) or raises.

    A value the annotation allows but ``kinds`` does not cover (a `Margin` where a
    fraction is also accepted, a card name where bytes are too) is not this rule's.
    """

    def __init__(self, check: Callable[[str, Any], Any], kinds: tuple[type, ...]) -> None:
        """Wrap ``check(name, value)``, which looks at values of ``kinds``."""
        self.check = check
        self.kinds = kinds

    def __call__(self, name: str, value: Any) -> Any:
        """Check ``value`` as ``name``."""
        return self.check(name, value)

    def applies(self, value: object) -> bool:
        """Whether ``value`` is of a kind this rule looks at."""
        return isinstance(value, self.kinds)


def whole(*, at_least: int = 0, at_most: int | None = None, fix: str = "") -> Rule:
    """Whole numbers in ``[at_least, at_most]``; numpy integers come back as ``int``.

    Example:
        >>> whole(at_least=1)("batch_size", 8)
        8
        >>> whole(at_least=1)("batch_size", 2.5)
        Traceback (most recent call last):
        TypeError: batch_size must be a whole number >= 1; got 2.5
    """
    expected = f"a whole number >= {at_least}"
    if at_most is not None:
        expected = f"a whole number from {at_least} to {at_most}"

    def check(name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise fail(name, expected, value, fix=fix, kind=TypeError)
        whole_number = int(value)
        if whole_number < at_least or (at_most is not None and whole_number > at_most):
            raise fail(name, expected, value, fix=fix)
        return whole_number

    return Rule(check, (numbers.Number,))


def number(
    *,
    above: float | None = None,
    at_least: float | None = None,
    below: float | None = None,
    integral: bool = False,
    fix: str = "",
) -> Rule:
    """Finite real numbers within the bounds given (``integral``: whole-valued, e.g. bytes).

    Example:
        >>> number(above=0)("time_budget", 2)
        2
        >>> number(at_least=0, below=1)("dropout", float("nan"))
        Traceback (most recent call last):
        ValueError: dropout must be a finite number >= 0 and < 1; got nan
    """
    bounds = [
        f"{op} {int(bound) if integral and float(bound).is_integer() else format(bound, 'g')}"
        for op, bound in ((">", above), (">=", at_least), ("<", below))
        if bound is not None
    ]
    expected = "a finite " + ("whole " if integral else "") + "number"
    expected += " " + " and ".join(bounds) if bounds else ""

    def check(name: str, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise fail(name, expected, value, fix=fix, kind=TypeError)
        x = float(value)
        if (
            not math.isfinite(x)
            or (integral and not x.is_integer())
            or (above is not None and not x > above)
            or (at_least is not None and not x >= at_least)
            or (below is not None and not x < below)
        ):
            raise fail(name, expected, value, fix=fix)
        return value

    return Rule(check, (numbers.Number,))


def text(*, fix: str = "") -> Rule:
    """A string with something in it (not empty, not only spaces).

    Example:
        >>> text()("vendor", " ")
        Traceback (most recent call last):
        ValueError: vendor must be a non-empty string; got ' '
    """

    def check(name: str, value: Any) -> Any:
        if not isinstance(value, str):
            raise fail(name, "a string", value, fix=fix, kind=TypeError)
        if not value.strip():
            raise fail(name, "a non-empty string", value, fix=fix)
        return value

    return Rule(check, (str,))


def one_of(*choices: str, fix: str = "") -> Rule:
    """One of ``choices`` (case and surrounding spaces ignored); returns it as given.

    Example:
        >>> one_of("cuda", "cpu")("device", "tpu")
        Traceback (most recent call last):
        ValueError: device must be one of 'cuda', 'cpu'; got 'tpu'
    """
    expected = "one of " + ", ".join(repr(c) for c in choices)
    keys = {c.lower() for c in choices}

    def check(name: str, value: Any) -> Any:
        if not isinstance(value, str) or value.strip().lower() not in keys:
            raise fail(name, expected, value, fix=fix)
        return value

    return Rule(check, (str,))


def among(*choices: object, fix: str = "") -> Rule:
    """One of ``choices``, objects compared with ``==`` (torch dtypes, say).

    Example:
        >>> import torch
        >>> among(torch.bfloat16, torch.float16)("autocast_dtype", torch.int8)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ValueError: autocast_dtype must be one of torch.bfloat16, torch.float16; got torch.int8 ...
    """
    expected = "one of " + ", ".join(str(c) for c in choices)

    def check(name: str, value: Any) -> Any:
        if isinstance(value, bool) or not any(value == c for c in choices):
            raise fail(name, expected, value, fix=fix)
        return value

    return Rule(check, (object,))


def parsed(parse: Callable[[Any], object], *, kinds: tuple[type, ...] = (object,)) -> Rule:
    """What ``parse`` accepts (its own message, prefixed with ``name=value``); value kept.

    Example:
        >>> from torchfit._core.units import parse_bytes
        >>> parsed(parse_bytes)("reserve", "-3GB")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ValueError: reserve='-3GB': cannot read '-3GB' as a size; ...
    """

    def check(name: str, value: Any) -> Any:
        try:
            parse(value)
        except (TypeError, ValueError) as error:
            said = str(error)  # the parser's own words, once, with the parameter's name
            named = said.lower().startswith(name.lower())  # margin: "Margin.fraction ..."
            said = said if named else f"{name}={_got(value)}: {said}"
            raise type(error)(said) from None
        return value

    return Rule(check, kinds)


def each(rule: Rule, *, fix: str = "") -> Rule:
    """A non-empty list or tuple whose every item passes ``rule`` (named ``name[i]``).

    Example:
        >>> each(whole(at_least=1))("batch_sizes", [8, 0])
        Traceback (most recent call last):
        ValueError: batch_sizes[1] must be a whole number >= 1; got 0
    """

    def check(name: str, value: Any) -> Any:
        if isinstance(value, str | bytes) or not isinstance(value, abc.Sequence):
            raise fail(name, "a list or tuple", value, fix=fix, kind=TypeError)
        if not value:
            raise fail(name, "a non-empty list or tuple", value, fix=fix)
        if isinstance(value, range):  # its ends bound it (and it may be long)
            rule(f"{name}[0]", value[0])
            rule(f"{name}[-1]", value[-1])
            return value
        items = [rule(f"{name}[{i}]", item) for i, item in enumerate(value)]
        return tuple(items) if isinstance(value, tuple) else items

    return Rule(check, (object,))


def shape(*, at_least: int = 1, fix: str = "") -> Rule:
    """A non-empty tuple (or list) of whole numbers >= ``at_least``, e.g. ``(3, 224, 224)``.

    Example:
        >>> shape()("input_shape", (0, 3))
        Traceback (most recent call last):
        ValueError: input_shape must be a non-empty tuple of whole numbers >= 1; got (0, 3)
    """
    expected = f"a non-empty tuple of whole numbers >= {at_least}"

    def check(name: str, value: Any) -> tuple[int, ...]:
        if not isinstance(value, tuple | list) or any(
            isinstance(d, bool) or not isinstance(d, numbers.Integral) for d in value
        ):
            raise fail(name, expected, value, fix=fix, kind=TypeError)
        if not value or min(value) < at_least:
            raise fail(name, expected, value, fix=fix)
        return tuple(int(d) for d in value)

    return Rule(check, (object,))


def model() -> Rule:
    """A ``torch.nn.Module`` instance (a model built, not a name, a class or a config).

    Example:
        >>> model()("model", "gpt2")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        TypeError: model must be an nn.Module; got 'gpt2'; build the model first ...
    """
    fix = (
        "build the model first (an instance, not its class); for a name or a config use "
        "torchfit.memory.estimate or torchfit.memory.catalog.build_model"
    )

    def check(name: str, value: Any) -> Any:
        from torch import nn  # noqa: PLC0415 - keeps this module free of torch at import

        if not isinstance(value, nn.Module):
            raise fail(name, "an nn.Module", value, fix=fix, kind=TypeError)
        return value

    return Rule(check, (object,))


_EMPTY_NAME = (
    "pass a catalog name such as 'llama-3.1-8b', a Hugging Face Hub id such as "
    "'meta-llama/Llama-3.1-8B', or a config.json path"
)


def model_name() -> Rule:
    """A model's name: a string with something in it (never sent to the Hub empty).

    Example:
        >>> model_name()("name", " ")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ValueError: name=' ' is an empty model name; pass a catalog name such as ...
    """

    def check(name: str, value: Any) -> Any:
        if isinstance(value, str) and not value.strip():
            raise ValueError(f"{name}={value!r} is an empty model name; {_EMPTY_NAME}")
        return value

    return Rule(check, (str,))


def model_ref() -> Rule:
    """What names a model: a non-empty name or path, a transformers config, an ``nn.Module``.

    Example:
        >>> model_ref()("config_or_name", 3)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        TypeError: config_or_name must be a model name (e.g. 'gpt2'), a config.json path, ...
    """
    expected = (
        "a model name (e.g. 'gpt2'), a config.json path, a transformers config or an nn.Module"
    )

    def check(name: str, value: Any) -> Any:
        from torch import nn  # noqa: PLC0415 - keeps this module free of torch at import

        if isinstance(value, str):
            return model_name()(name, value)
        config = hasattr(value, "model_type") and hasattr(value, "to_dict")
        if not (config or isinstance(value, os.PathLike | nn.Module)):
            raise fail(name, expected, value, kind=TypeError)
        return value

    return Rule(check, (object,))


def inputs() -> Rule:
    """A model's inputs: a tensor, a tuple or list (positional) or a dict (keywords).

    Example:
        >>> inputs()("example_inputs", None)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        TypeError: example_inputs must be a tensor, a tuple or list of inputs, or a dict ...
    """
    expected = "a tensor, a tuple or list of inputs, or a dict of keyword inputs"

    def check(name: str, value: Any) -> Any:
        import torch  # noqa: PLC0415 - keeps this module free of torch at import

        if not isinstance(value, torch.Tensor | tuple | list | abc.Mapping):
            raise fail(name, expected, value, kind=TypeError)
        return value

    return Rule(check, (object,))
