"""mkdocs hooks for the docs build: the version in the header, ids that are selectors.

* The version is read from ``src/torchfit/__init__.py`` as text (the build imports neither
  torchfit nor torch), so the site cannot show a version the package does not have.
* A heading id made from the heading's text never starts with a digit: ``#1-will-it-fit``
  is not a valid CSS selector, and the theme's scripts stop on it. The guides give their
  headings explicit ids; this covers the text the site includes (CHANGELOG.md's
  ``## [0.1.0]``).
"""
# ruff: noqa: INP001  # loaded by path from mkdocs.yml, not imported as a package

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from markdown.extensions.toc import slugify

_VERSION = re.compile(r"""^__version__\s*=\s*["']([^"']+)["']""", re.MULTILINE)
_INIT = Path(__file__).resolve().parents[1] / "src" / "torchfit" / "__init__.py"


def package_version(init: Path = _INIT) -> str:
    """The ``__version__`` string assigned in a package's ``__init__.py``.

    Raises:
        ValueError: The file assigns no ``__version__``.
    """
    match = _VERSION.search(init.read_text(encoding="utf-8"))
    if match is None:
        raise ValueError(f"{init} assigns no __version__ = '...'")
    return match.group(1)


def heading_id(text: str, separator: str) -> str:
    """Python-Markdown's id for a heading, with ``section-`` before a leading digit.

    Example:
        >>> heading_id("[0.1.0] - 2025-06-01", "-"), heading_id("Added", "-")
        ('section-010-2025-06-01', 'added')
    """
    anchor = slugify(text, separator)
    return f"section{separator}{anchor}" if anchor[:1].isdigit() else anchor


def on_config(config: Any, **kwargs: Any) -> Any:  # noqa: ARG001
    """Name the site with its version (header, page titles); ids that are selectors."""
    version = package_version()
    config["site_name"] = f"{config['site_name']} {version}"
    config["copyright"] = f"torchfit {version} · Apache-2.0"
    config["mdx_configs"].setdefault("toc", {})["slugify"] = heading_id
    return config
