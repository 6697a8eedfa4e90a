"""Whether a value is of an annotated type, at run time: the type half of `checks`.

Annotations are resolved from their strings in the function's module; a name that is
only imported for type checkers (``GPU`` under ``TYPE_CHECKING``) is matched by class
name along the value's MRO, so a union that mentions one still checks its other members.
Containers are checked with their items (``tuple[int, ...]``, ``Sequence[int]``), except
iterables, which a check would use up.
"""

from __future__ import annotations

import dataclasses
import numbers
import re
import types
import typing
from collections import abc
from typing import Any, TypeVar

__all__ = ["Named", "describe", "matches", "members", "resolve"]


@dataclasses.dataclass(frozen=True)
class Named:
    """A class known only by name here (imported for type checkers only)."""

    name: str


def _split_union(text: str) -> list[str]:
    """``"str | GPU | None"`` -> its members, ``|`` inside brackets left alone."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char in "[(":
            depth += 1
        elif char in "])":
            depth -= 1
        if char == "|" and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    return [*parts, text[start:].strip()]


def resolve(annotation: object, namespace: dict[str, Any]) -> tuple[object, ...]:
    """The members of an annotation (a string from ``from __future__ import annotations``).

    Example:
        >>> resolve("int | Missing | None", {})
        (<class 'int'>, Named(name='Missing'), <class 'NoneType'>)
    """
    if not isinstance(annotation, str):
        return members(annotation)
    found: list[object] = []
    for part in _split_union(annotation):
        try:
            found.extend(members(eval(part, namespace)))  # noqa: S307 - our own annotations
        except Exception:  # noqa: BLE001 - a TYPE_CHECKING-only name, or a generic of one
            name = re.match(r"[\w.]*", part)
            found.append(Named(name.group(0).rsplit(".", 1)[-1]) if name else Any)
    return tuple(found)


def members(annotation: object) -> tuple[object, ...]:
    """The members of a union (``None`` as ``NoneType``), or the annotation alone."""
    if annotation is None:
        return (type(None),)
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        return tuple(m for arg in typing.get_args(annotation) for m in members(arg))
    return (annotation,)


_NAMES: dict[object, str] = {
    int: "a whole number",
    float: "a number",
    str: "a string",
    bool: "True or False",
    type(None): "None",
    tuple: "a tuple",
    abc.Sequence: "a list or tuple",
    list: "a list",
    abc.Callable: "a callable",
    abc.Mapping: "a dict",
    dict: "a dict",
    abc.Iterable: "an iterable",
}
_PLURALS: dict[object, str] = {int: "whole numbers", float: "numbers", str: "strings"}


def _name(annotation: object) -> str:
    if isinstance(annotation, Named):
        return annotation.name
    origin = typing.get_origin(annotation) or annotation
    return _NAMES.get(origin) or str(getattr(origin, "__name__", origin))


def describe(annotation: object) -> str:
    """What a message says is expected (``a list or tuple of whole numbers``).

    Example:
        >>> from collections.abc import Sequence
        >>> describe(Sequence[int]), describe(tuple[int, ...])
        ('a list or tuple of whole numbers', 'a tuple of whole numbers')
    """
    origin = typing.get_origin(annotation) or annotation
    args = [m for a in typing.get_args(annotation) if a is not Ellipsis for m in members(a)]
    if origin in (tuple, abc.Sequence, list) and args:
        items = (_PLURALS.get(a) or _name(a).removeprefix("a ") + "s" for a in args)
        return f"{_name(annotation)} of " + " or ".join(dict.fromkeys(items))
    return _name(annotation)


def matches(annotation: object, value: object) -> bool:  # noqa: PLR0911 - one per kind
    """Whether ``value`` is of type ``annotation`` (containers: their items too).

    Example:
        >>> matches(int, True), matches(float, 3), matches(tuple[int, ...], (1, 2.5))
        (False, True, False)
    """
    if annotation is Any or annotation is object or isinstance(annotation, TypeVar):
        return True
    if isinstance(annotation, Named):
        # case-insensitive: transformers renamed PretrainedConfig to PreTrainedConfig
        name = annotation.name.lower()
        return any(cls.__name__.lower() == name for cls in type(value).__mro__)
    if annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation in (int, float):
        kind = numbers.Integral if annotation is int else numbers.Real
        return isinstance(value, kind) and not isinstance(value, bool)
    origin = typing.get_origin(annotation)
    if origin is None:
        return not isinstance(annotation, type) or isinstance(value, annotation)
    return _generic(origin, typing.get_args(annotation), value)


def _any_member(annotation: object, value: object) -> bool:
    return any(matches(member, value) for member in members(annotation))


def _generic(origin: object, args: tuple[Any, ...], value: object) -> bool:  # noqa: PLR0911
    """``value`` against ``origin[args]``: a literal, a callable, a tuple, a sequence, ..."""
    if origin is typing.Literal:
        return value in args
    if origin is abc.Callable:
        return callable(value)
    if origin is tuple:  # a list of the right items is taken where a tuple is annotated
        return isinstance(value, tuple | list) and _items(args, value)
    if origin in (abc.Sequence, list):
        if isinstance(value, str | bytes) or not isinstance(value, abc.Sequence):
            return False
        if origin is list and not isinstance(value, list):
            return False
        # a range holds whole numbers by construction (and may be long)
        return not args or isinstance(value, range) or _items((args[0], ...), value)
    if origin is abc.Iterable:
        # Items are not looked at (an iterator would be used up); a bare string is a
        # mistake where several strings are wanted.
        strings = args == (str,) and isinstance(value, str)
        return isinstance(value, abc.Iterable) and not strings
    return not isinstance(origin, type) or isinstance(value, origin)


def _items(args: tuple[Any, ...], items: abc.Sequence[object]) -> bool:
    """The items of a tuple or sequence against ``args`` (``(X, ...)``: every item an X)."""
    if len(args) == 2 and args[1] is Ellipsis:
        return args[0] is Ellipsis or all(_any_member(args[0], item) for item in items)
    pairs = zip(args, items, strict=False)
    return len(args) == len(items) and all(_any_member(a, item) for a, item in pairs)
