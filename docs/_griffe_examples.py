"""Griffe extension for the docs build: read ``Example:`` as an examples section.

torchfit's docstrings use the singular ``Example:`` heading (the house style; pydocstyle's
Google convention accepts it). Griffe's Google parser knows only the plural form as the
section that renders ``>>>`` lines as code; the singular form becomes an admonition of
Markdown text, where doctest lines turn into block quotes and ``[...]`` output into broken
reference links. This extension renames the heading in the text griffe parses (the source
files are not touched), before any docstring is parsed.
"""
# ruff: noqa: INP001  # loaded by path from mkdocs.yml, not imported as a package

from __future__ import annotations

import re
from typing import Any

import griffe

_SINGULAR = re.compile(r"^(?P<indent>[ \t]*)Example:[ \t]*$", re.MULTILINE)


class ExampleSections(griffe.Extension):
    """Rewrite a docstring's ``Example:`` heading as ``Examples:``."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:  # noqa: ARG002
        """Rename the heading as each object is created (aliases share the target's)."""
        if obj.docstring is not None:
            obj.docstring.value = _SINGULAR.sub(r"\g<indent>Examples:", obj.docstring.value)
