"""Griffe extension for the docs build: house-style sections read as they are meant.

* ``Example:``: torchfit's docstrings use the singular heading (the house style;
  pydocstyle's Google convention accepts it). Griffe's Google parser knows only the plural
  form as the section that renders ``>>>`` lines as code; the singular form becomes an
  admonition of Markdown text, where doctest lines turn into block quotes and ``[...]``
  output into broken reference links. The heading is renamed.
* ``Returns:`` and ``Yields:``: one value described in prose over several lines
  (``A `MemoryEstimate` at the peak: weights, ...``). mkdocs.yml parses the section as one
  item; a colon in its first line would still be read as "type: description", so the
  first line gets an empty type (``: ...``) and griffe takes the type from the signature.

Only the text griffe parses is rewritten (the source files are not touched), before any
docstring is parsed.
"""
# ruff: noqa: INP001  # loaded by path from mkdocs.yml, not imported as a package

from __future__ import annotations

import re
from typing import Any

import griffe

_SINGULAR = re.compile(r"^(?P<indent>[ \t]*)Example:[ \t]*$", re.MULTILINE)
# A Returns:/Yields: heading, then its first line, indented deeper than the heading.
_VALUE_SECTION = re.compile(
    r"^(?P<indent>[ \t]*)(?P<heading>Returns|Yields):[ \t]*\n"
    r"(?P<body>(?P=indent)[ \t]+)(?=[^\s:])",  # not yet rewritten: idempotent
    re.MULTILINE,
)


def house_style(docstring: str) -> str:
    r"""The docstring with ``Example:`` renamed and each value section's type left empty.

    Example:
        >>> house_style("Do it.\n\nReturns:\n    A `Plan`: the verdict.\n")
        'Do it.\n\nReturns:\n    : A `Plan`: the verdict.\n'
    """
    text = _SINGULAR.sub(r"\g<indent>Examples:", docstring)
    return _VALUE_SECTION.sub(r"\g<indent>\g<heading>:\n\g<body>: ", text)


class ExampleSections(griffe.Extension):
    """Rewrite ``Example:`` headings and ``Returns:``/``Yields:`` first lines."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:  # noqa: ARG002
        """Rewrite as each object is created (aliases share the target's docstring)."""
        if obj.docstring is not None:
            obj.docstring.value = house_style(obj.docstring.value)
