"""The documentation site builds without a warning, and every relative link resolves.

`mkdocs build --strict` checks the pages it builds (links, anchors, the nav, the API
reference generated from the docstrings). The link and nav checks below read the Markdown
files themselves, so they also run where mkdocs is not installed and they cover every
page under docs/, in the nav or not, plus README.md.

Without mkdocs the build test skips locally and fails in CI (``CI`` set), so a CI job
that forgot the ``docs`` extra cannot pass by skipping it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
CONFIG = REPO / "mkdocs.yml"

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target "title") and ![alt](target); the target may be wrapped in <...>.
_INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+[\"'][^)]*)?\)")
_REF_DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
_HTML_LINK = re.compile(r"\b(?:href|src)=[\"']([^\"']*)[\"']")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")
_EXPLICIT_ID = re.compile(r"\{[^}]*#([\w.:-]+)[^}]*\}")
_NAV_PAGE = re.compile(r"^\s*-\s+(?:[^:#]+:\s+)?([\w./-]+\.md)\s*$")


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, with inline code removed."""
    lines: list[tuple[int, str]] = []
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        match = _FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)
            continue
        if fence is not None:
            if line.strip().startswith(fence[0] * len(fence)) and not line.strip().strip(fence[0]):
                fence = None
            continue
        lines.append((number, _INLINE_CODE.sub("", line)))
    return lines


def _slug(text: str) -> str:
    """The id python-markdown's toc extension gives a heading (its default slugify)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text, not its target
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(path: Path) -> set[str]:
    """The ids a Markdown page defines: heading slugs (deduplicated as toc does), explicit ids."""
    found: set[str] = set()
    for _, line in _prose_lines(path.read_text(encoding="utf-8")):
        found.update(_EXPLICIT_ID.findall(line))
        heading = _HEADING.match(line)
        if heading is None:
            continue
        text = _EXPLICIT_ID.sub("", heading.group(2))
        slug = base = _slug(text)
        count = 0
        while slug in found:
            count += 1
            slug = f"{base}_{count}"
        found.add(slug)
    return found


def link_targets(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every link and image in a Markdown file, outside code."""
    targets: list[tuple[int, str]] = []
    for number, line in _prose_lines(path.read_text(encoding="utf-8")):
        for pattern in (_INLINE_LINK, _HTML_LINK):
            targets += [(number, target) for target in pattern.findall(line)]
        definition = _REF_DEFINITION.match(line)
        if definition:
            targets.append((number, definition.group(1)))
    return targets


def broken_links(page: Path, *, root: Path) -> list[str]:
    """Relative links of ``page`` that do not resolve to a file (and anchor) under ``root``."""
    problems: list[str] = []
    for number, target in link_targets(page):
        if not target or _SCHEME.match(target) or target.startswith("//"):
            continue  # an external URL, mailto:, or an empty autorefs anchor [](){#id}
        where = f"{page}:{number}: {target!r}"
        if target.startswith("/"):
            problems.append(f"{where} is absolute; link relative to the page")
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (page.parent / file_part).resolve() if file_part else page.resolve()
        if not resolved.is_relative_to(root.resolve()):
            problems.append(f"{where} points outside {root}")
        elif not resolved.is_file():
            problems.append(f"{where} does not exist ({resolved})")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{where}: no heading or id {anchor!r} in {resolved.name}")
    return problems


def nav_pages(config: Path) -> list[str]:
    """The Markdown files the ``nav`` of an mkdocs.yml names, relative to docs/."""
    pages: list[str] = []
    in_nav = False
    for line in config.read_text(encoding="utf-8").splitlines():
        if re.match(r"^nav:\s*$", line):
            in_nav = True
            continue
        if in_nav and line and not line[0].isspace() and not line.startswith("-"):
            break  # the next top-level key
        match = _NAV_PAGE.match(line) if in_nav else None
        if match:
            pages.append(match.group(1))
    return pages


def _doc_pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def _require_mkdocs() -> None:
    missing = [name for name in ("mkdocs", "mkdocstrings_handlers.python") if _find(name) is None]
    if not missing:
        return
    message = f"{', '.join(missing)} not installed: pip install -e '.[docs]'"
    if os.environ.get("CI"):
        pytest.fail(f"{message} (CI is set: the docs build must run in CI, not skip)")
    pytest.skip(message)


def _find(name: str) -> object:
    try:
        return importlib.util.find_spec(name)
    except ModuleNotFoundError:  # the parent package is missing
        return None


def test_site_builds_strict_without_warnings(tmp_path):
    _require_mkdocs()
    site = tmp_path / "site"
    command = [sys.executable, "-m", "mkdocs", "build", "--strict"]
    command += ["--config-file", str(CONFIG), "--site-dir", str(site)]
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        check=False,
    )
    log = result.stdout + result.stderr
    warnings = [line for line in log.splitlines() if re.match(r"^(WARNING|ERROR)\b", line)]
    assert result.returncode == 0, log
    assert not warnings, "\n".join(warnings)
    # The API reference was generated from the docstrings, not left empty.
    memory = (site / "reference" / "memory" / "index.html").read_text(encoding="utf-8")
    for anchor in ("torchfit.memory.MemoryEstimate", "torchfit.memory.estimate"):
        assert f'id="{anchor}"' in memory
    # Example: sections render as code (docs/_griffe_examples.py), not as block quotes.
    loaders = (site / "reference" / "loaders" / "index.html").read_text(encoding="utf-8")
    assert "<blockquote>" not in loaders
    assert 'class="gp">&gt;&gt;&gt; </span>' in loaders


@pytest.mark.parametrize("page", _doc_pages(), ids=lambda p: str(p.relative_to(DOCS)))
def test_relative_links_in_docs_resolve(page):
    assert broken_links(page, root=DOCS) == []


def test_relative_links_in_readme_resolve():
    assert broken_links(REPO / "README.md", root=REPO) == []


def test_every_page_is_in_the_nav_and_every_nav_entry_exists():
    nav = nav_pages(CONFIG)
    pages = {str(p.relative_to(DOCS)) for p in _doc_pages()}
    assert "index.md" in nav  # the parser found the nav at all
    assert sorted(pages - set(nav)) == [], "pages missing from the nav in mkdocs.yml"
    assert sorted(set(nav) - pages) == [], "nav entries with no file under docs/"


# -- the checkers themselves catch what they are for --------------------------------------


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("[ok](other.md) and [ok](other.md#a-heading) and [self](#title)", None),
        ("[gone](missing.md)", "does not exist"),
        ("[bad anchor](other.md#no-such-heading)", "no heading or id 'no-such-heading'"),
        ("[bad self anchor](#nothing)", "no heading or id 'nothing'"),
        ("![image](img/missing.png)", "does not exist"),
        ('<a href="missing.html">raw html</a>', "does not exist"),
        ("[ref]: missing.md", "does not exist"),
        ("[out](../README.md)", "points outside"),
        ("[abs](/index.md)", "is absolute"),
        ("[web](https://example.com/x.md) [mail](mailto:a@b.c) [api][torchfit.fits]", None),
        ("`[code](missing.md)` and ```[code](missing.md)```", None),
        ("[explicit id](other.md#custom-id) [autorefs anchor](other.md#torchfit.x)", None),
        ("[duplicate heading](other.md#a-heading_1)", None),
    ],
)
def test_link_checker(tmp_path, line, problem):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "other.md").write_text(
        "# Other\n\n## A heading\n\n## A heading\n\n## Custom {#custom-id}\n\n"
        "[](){#torchfit.x}\n\n```\n# not a heading\n```\n",
        encoding="utf-8",
    )
    page = docs / "page.md"
    page.write_text(f"# Title\n\n{line}\n\n```python\n[fenced](missing.md)\n```\n", "utf-8")
    problems = broken_links(page, root=docs)
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1
        assert problem in problems[0]


def test_slug_matches_python_markdown_toc():
    assert _slug("`decode`: 5.21 ms/sample wall, 1.96 ms CPU; batch 16") == (
        "decode-521-mssample-wall-196-ms-cpu-batch-16"
    )
    assert _slug("Load a checkpoint in 4 bits, and check the bytes") == (
        "load-a-checkpoint-in-4-bits-and-check-the-bytes"
    )


def test_nav_parser(tmp_path):
    config = tmp_path / "mkdocs.yml"
    config.write_text(
        "site_name: x\nnav:\n  - Home: index.md\n  - Guides:\n      - A b: guides/a.md\n"
        "      - c.md\n  - Site: https://example.com\nplugins:\n  - search\n",
        encoding="utf-8",
    )
    assert nav_pages(config) == ["index.md", "guides/a.md", "c.md"]


def python_blocks(page: Path) -> list[str]:
    """The ```python blocks of a page, in order."""
    return re.findall(
        r"^```python\n(.*?)^```", page.read_text(encoding="utf-8"), re.DOTALL | re.MULTILINE
    )


#: Pages whose Python blocks are one script, run top to bottom as a reader would.
#: Blocks that load a real checkpoint ("path/to/...") are illustrations and left out.
SNIPPET_PAGES = (
    "getting-started.md",
    "loaders.md",
    "precision.md",
    "quantize.md",
    "integrations.md",
)


def page_script(page: Path) -> str:
    """The page's runnable Python blocks, in order, as one script."""
    return "\n".join(block for block in python_blocks(page) if "path/to/" not in block)


@pytest.mark.slow
@pytest.mark.parametrize("page", SNIPPET_PAGES)
def test_guide_snippets_run_as_written(page, tmp_path):
    # A new user copies these word for word: each page must run, in a fresh interpreter.
    code = page_script(DOCS / page)
    assert code.strip(), f"{page} has no Python blocks"
    script = tmp_path / "snippet.py"
    script.write_text(code, encoding="utf-8")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip()  # every page prints what it shows
