"""Arguments checked at the public door, once: one rule per kind of value, one message shape.

Every public function of torchfit is decorated with `arguments`, which checks each
argument a caller passed before the body runs: first against the parameter's type
annotation (an ``int`` is a whole number and not ``True``, a ``float`` is finite, a
``str`` is not empty, a class is an instance of it, a ``tuple[int, ...]`` holds ints;
`torchfit._core.annotations`), then against the value rules named for it (`whole`,
`number`, `shape`, `parsed`, ...). Dataclasses check their fields the same way
(`fields`). Each failure is a ``TypeError`` (wrong kind) or ``ValueError`` (right kind,
wrong value) whose message names the parameter, the value, what was expected and, where
one helps, the fix::

    batch_size must be a whole number >= 1; got 0

Defaults are not checked (they are ours), and ``*args``/``**kwargs`` not at all.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any, TypeVar

from torchfit._core.annotations import describe, matches, resolve
from torchfit._core.rules import (
    Rule,
    among,
    each,
    fail,
    inputs,
    model,
    model_name,
    model_ref,
    number,
    one_of,
    parsed,
    shape,
    text,
    whole,
)

__all__ = [
    "Rule",
    "among",
    "arguments",
    "each",
    "fail",
    "fields",
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

_F = TypeVar("_F", bound=Callable[..., Any])

# -- parameters and fields ----------------------------------------------------------------

_DEFAULTS: dict[object, Rule] = {int: whole(), float: number(), str: text()}


class _Parameter:
    """How one parameter (or field) is checked: its annotation's members, then its rules."""

    def __init__(
        self, name: str, kinds: tuple[object, ...], rules: tuple[Rule, ...], default: object
    ) -> None:
        self.name = name
        self.kinds = kinds
        self.rules = rules
        self.optional = type(None) in kinds or default is None
        self.empty = isinstance(default, str) and not default  # "" is a value here

    def check(self, value: Any) -> Any:
        """``value`` checked (and normalized), or the error that names this parameter."""
        if value is None and self.optional:
            return value
        matched = next((k for k in self.kinds if matches(k, value)), _MISSING)
        if matched is _MISSING:
            for rule in self.rules:  # a rule's message is more specific than the type's
                rule(self.name, value)
            if any(r.applies(value) and object not in r.kinds for r in self.rules):
                return value  # a kind the rule names and reads (bytes as a float, say)
            expected = " or ".join(dict.fromkeys(describe(k) for k in self.kinds))
            raise fail(self.name, expected, value, kind=TypeError)
        own = [rule for rule in self.rules if rule.applies(value)]
        default = _DEFAULTS.get(matched)
        if default is not None and not own and not (self.empty and value == ""):
            value = default(self.name, value)  # the type's rule, unless one is named for it
        for rule in own:
            value = rule(self.name, value)
        return value


_MISSING = object()


def _parameter(
    name: str, annotation: object, rules: object, namespace: dict[str, Any], default: object
) -> _Parameter:
    kinds = resolve(annotation, namespace) if annotation is not inspect.Parameter.empty else (Any,)
    own = rules if isinstance(rules, tuple) else (rules,) if rules is not None else ()
    return _Parameter(name, kinds, own, default)


def _checked_call(
    plan: dict[str, _Parameter],
    positional: list[str],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> list[Any]:
    """``args`` checked by position (``kwargs`` checked in place), without inspect's bind.

    This runs on every call of a public function, so it only walks what was passed.
    """
    values = list(args)
    for index, name in enumerate(positional[: len(args)]):
        parameter = plan.get(name)
        if parameter is not None:
            values[index] = parameter.check(values[index])
    for name, value in kwargs.items():
        parameter = plan.get(name)
        if parameter is not None:
            kwargs[name] = parameter.check(value)
    return values


def arguments(**rules: Rule | tuple[Rule, ...]) -> Callable[[_F], _F]:
    """Check every argument a caller passes: the annotation's type, then ``rules[name]``.

    The annotations are resolved on the first call (importing torchfit stays as fast);
    a rule's return value replaces the argument (numpy integers become ``int``).

    Raises:
        TypeError: (at decoration) a rule names a parameter the function does not have.

    Example:
        >>> @arguments(batch_size=whole(at_least=1))
        ... def steps(batch_size: int, *, seq_len: int | None = None) -> int:
        ...     return batch_size * (seq_len or 1)
        >>> steps(4, seq_len=8)
        32
        >>> steps(4, seq_len="8")
        Traceback (most recent call last):
        TypeError: seq_len must be a whole number or None; got '8'
    """

    def decorate(func: _F) -> _F:
        signature = inspect.signature(func)
        unknown = set(rules) - set(signature.parameters)
        if unknown:
            raise TypeError(f"{func.__qualname__} has no parameter {sorted(unknown)}")
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        positional = [name for name, p in signature.parameters.items() if p.kind in kinds]
        spread = any(p.kind is p.VAR_POSITIONAL for p in signature.parameters.values())
        plans: list[dict[str, _Parameter]] = []

        @functools.wraps(func)
        def checked(*args: Any, **kwargs: Any) -> Any:
            if not plans:
                namespace = dict(func.__globals__)
                plans.append({
                    name: _parameter(name, p.annotation, rules.get(name), namespace, p.default)
                    for name, p in signature.parameters.items()
                    if name not in {"self", "cls"}
                    and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                })  # fmt: skip
            if len(args) > len(positional) and not spread:
                try:  # Python's own words for a call that does not fit
                    signature.bind(*args, **kwargs)
                except TypeError as error:
                    raise TypeError(f"{func.__qualname__}(): {error}") from None
            return func(*_checked_call(plans[0], positional, args, kwargs), **kwargs)

        return typing.cast("_F", checked)

    return decorate


def fields(obj: Any, *names: str, **rules: Rule | tuple[Rule, ...]) -> None:
    """Check a dataclass's fields (``names`` and those in ``rules``; all without names).

    Call it from ``__post_init__``; a normalized value is written back (frozen too). The
    checks are built on a class's first call and kept: give the same rules every time.

    Example:
        >>> @dataclasses.dataclass(frozen=True)
        ... class Card:
        ...     memory: int
        ...     name: str = "card"
        ...     def __post_init__(self) -> None:
        ...         fields(self, memory=whole(at_least=1))
        >>> Card(0)
        Traceback (most recent call last):
        ValueError: Card.memory must be a whole number >= 1; got 0
    """
    cls = type(obj)
    plan = _FIELD_PLANS.get((cls, names))
    if plan is None:
        namespace = dict(vars(inspect.getmodule(cls)))
        every = {f.name for f in dataclasses.fields(obj)}
        wanted = set(names) | set(rules) if names else every
        plan = [
            _parameter(f"{cls.__name__}.{f.name}", f.type, rules.get(f.name), namespace, f.default)
            for f in dataclasses.fields(obj)
            if f.name in wanted
        ]
        _FIELD_PLANS[cls, names] = plan
    for checked in plan:
        name = checked.name.rsplit(".", 1)[1]
        value = getattr(obj, name)
        new = checked.check(value)
        if new is not value:
            object.__setattr__(obj, name, new)


_FIELD_PLANS: dict[tuple[type, tuple[str, ...]], list[_Parameter]] = {}
