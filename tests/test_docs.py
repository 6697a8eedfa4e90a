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
import itertools
import os
import re
import shlex
import subprocess
import sys
import unicodedata
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch

import torchfit
from torchfit import memory
from torchfit.cli import main as torchfit_main
from torchfit.host.forking import run_forked

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


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built once for this module with ``mkdocs build --strict``: no warning."""
    _require_mkdocs()
    out = tmp_path_factory.mktemp("site")
    command = [sys.executable, "-m", "mkdocs", "build", "--strict"]
    command += ["--config-file", str(CONFIG), "--site-dir", str(out)]
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=False,
    )
    log = result.stdout + result.stderr
    warnings = [line for line in log.splitlines() if re.match(r"^(WARNING|ERROR)\b", line)]
    assert result.returncode == 0, log
    assert not warnings, "\n".join(warnings)
    return out


def _html(site: Path, page: str) -> str:
    return (site / page / "index.html").read_text(encoding="utf-8")


def test_site_builds_strict_without_warnings(site):
    # The API reference was generated from the docstrings, not left empty.
    assert 'id="torchfit.fits"' in _html(site, "reference/plan")
    estimate = _html(site, "reference/estimate")
    for anchor in ("torchfit.memory.MemoryEstimate", "torchfit.memory.estimate"):
        assert f'id="{anchor}"' in estimate
    # Example: sections render as code (docs/_griffe_examples.py), not as block quotes.
    loaders = _html(site, "reference/loaders")
    assert "<blockquote>" not in loaders
    assert 'class="gp">&gt;&gt;&gt; </span>' in loaders


def test_site_shows_the_version_and_the_changelog(site):
    assert f"torchfit {torchfit.__version__}" in _html(site, "")
    assert "Unreleased" in _html(site, "changelog")


def test_site_has_an_address_wraps_outputs_and_scrolls_tables(site):
    # canonical links need site_url; without it the 404 page's links break on nested paths
    assert '<link rel="canonical" href="' in _html(site, "recipes")
    css = (site / "stylesheets" / "extra.css").read_text(encoding="utf-8")
    assert "white-space: pre-wrap" in css  # outputs wrap instead of being cut
    assert "overflow-x: auto" in css  # wide tables scroll inside the column
    assert 'class="language-text highlight"' in _html(site, "recipes")  # what the rule targets


def test_site_loads_nothing_from_other_servers(site):
    # Scripts, styles, fonts and images come with the site: it reads the same offline.
    external = re.compile(r"<(?:script|link|img)\b[^>]*\b(?:src|href)=\"(?:https?:)?//[^\"]*\"")
    found = {
        f"{page.relative_to(site)}: {match}"
        for page in site.rglob("*.html")
        for match in external.findall(page.read_text(encoding="utf-8"))
        if 'rel="canonical"' not in match  # the page's own address (site_url), not a load
    }
    assert sorted(found) == []


_HTML_HEADING_ID = re.compile(r"<h[1-6]\b[^>]*\bid=\"([^\"]*)\"")


def test_no_heading_id_in_the_built_site_starts_with_a_digit(site):
    # "#1-will-it-fit" is not a valid CSS selector: the theme's scripts stop on it.
    bad = {
        f"{page.relative_to(site)}: #{anchor}"
        for page in site.rglob("*.html")
        for anchor in _HTML_HEADING_ID.findall(page.read_text(encoding="utf-8"))
        if not anchor[:1].isalpha()
    }
    assert sorted(bad) == []
    assert len(_HTML_HEADING_ID.findall(_html(site, "getting-started"))) > 3  # ids were seen


def returns_rows(html: str, anchor: str) -> int:
    """Rows of the Returns table of the object whose heading has id ``anchor``."""
    start = html.index(f'id="{anchor}"')
    end = html.find('class="doc doc-heading"', html.index(">", start))  # the next object
    section = html[start : end if end != -1 else len(html)]
    returns = section.index("Returns:</span>")
    table = section[returns : section.index("</table>", returns)]
    return table.count('<tr class="doc-section-item">')


@pytest.mark.parametrize(
    ("page", "anchor"),
    [
        ("reference/trace", "torchfit.memory.trace"),
        ("reference/trace", "torchfit.memory.trace_step"),
        ("reference/measure", "torchfit.memory.measure_step"),
        ("reference/several-gpus", "torchfit.memory.shard_estimate"),
    ],
)
def test_a_multi_line_returns_section_is_one_entry(site, page, anchor):
    assert returns_rows(_html(site, page), anchor) == 1


def test_every_public_name_of_torchfit_memory_is_on_one_reference_page():
    directive = re.compile(r"^::: torchfit\.memory\.([\w.]+)\s*$", re.MULTILINE)
    documented = [
        path
        for page in sorted((DOCS / "reference").glob("*.md"))
        for path in directive.findall(page.read_text(encoding="utf-8"))
    ]
    names = [path.rpartition(".")[2] for path in documented]
    twice = sorted({name for name in names if names.count(name) > 1})
    assert twice == [], "each name once, under one path"
    top = {path for path in documented if "." not in path}
    assert sorted(set(memory.__all__) - top) == [], "add them to docs/reference/"
    assert sorted(top - set(memory.__all__)) == [], "not exported: use its stage's path"


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


def headings(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, text, explicit id or None) of every Markdown heading of a page, outside code."""
    found: list[tuple[int, str, str | None]] = []
    for number, line in _prose_lines(path.read_text(encoding="utf-8")):
        heading = _HEADING.match(line)
        if heading is not None:
            explicit = _EXPLICIT_ID.findall(heading.group(2))
            found.append((number, heading.group(2), explicit[-1] if explicit else None))
    return found


def heading_id_problems(path: Path) -> list[str]:
    """Headings without an explicit ``{#id}``, or whose id does not start with a letter."""
    problems: list[str] = []
    for number, text, anchor in headings(path):
        where = f"{path.name}:{number}: {text!r}"
        if anchor is None:
            problems.append(f"{where} has no explicit id: end it with {{#{_slug(text)}}}")
        elif not anchor[:1].isalpha():
            problems.append(f"{where}: #{anchor} starts with a digit (not a CSS selector)")
    return problems


@pytest.mark.parametrize("page", _doc_pages(), ids=lambda p: str(p.relative_to(DOCS)))
def test_every_heading_has_an_explicit_id_that_starts_with_a_letter(page):
    # Explicit ids keep links stable when a heading is reworded, and an id that starts
    # with a digit breaks the theme's scripts (section tracking, keyboard navigation).
    assert heading_id_problems(page) == []


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


@pytest.mark.parametrize(
    ("heading", "problem"),
    [
        ("## Fine {#fine}", None),
        ("## Also fine {: #also-fine .class }", None),
        ("## No id", "has no explicit id: end it with {#no-id}"),
        ("## 1. Will it fit? {#1-will-it-fit}", "starts with a digit"),
    ],
)
def test_heading_id_checker(tmp_path, heading, problem):
    page = tmp_path / "page.md"
    page.write_text(f"{heading}\n\n```python\n# a comment, not a heading\n```\n", "utf-8")
    problems = heading_id_problems(page)
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1
        assert problem in problems[0]


def _load_build_module(name: str) -> Any:
    """A build module beside the pages (docs/_hooks.py, docs/_griffe_examples.py)."""
    pytest.importorskip("griffe" if name == "_griffe_examples" else "markdown")
    spec = importlib.util.spec_from_file_location(name, DOCS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_hooks_read_the_version_and_keep_ids_away_from_digits(tmp_path):
    hooks = _load_build_module("_hooks")
    assert hooks.package_version() == torchfit.__version__
    init = tmp_path / "__init__.py"
    init.write_text('"""No version here."""\n', encoding="utf-8")
    with pytest.raises(ValueError, match="assigns no __version__"):
        hooks.package_version(init)
    assert hooks.heading_id("[0.2.0] - 2026-01-31", "-") == "section-020-2026-01-31"
    assert hooks.heading_id("Will it fit?", "-") == "will-it-fit"


def test_griffe_extension_reads_returns_as_one_value():
    extension = _load_build_module("_griffe_examples")
    doc = (
        "Trace a step.\n\n    Returns:\n        A `MemoryEstimate` at the peak: weights,\n"
        "        gradients.\n\n    Example:\n        >>> 1\n        1\n"
    )
    rewritten = extension.house_style(doc)
    assert "Returns:\n        : A `MemoryEstimate` at the peak: weights,\n" in rewritten
    assert "    Examples:\n" in rewritten
    assert extension.house_style(rewritten) == rewritten  # applied twice, changed once


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


#: Pages whose Python blocks are one script, run top to bottom as a reader would.
#: Blocks that load a real checkpoint ("path/to/...") are illustrations and left out.
SNIPPET_PAGES = (
    "recipes.md",
    "memory.md",
    "getting-started.md",
    "loaders.md",
    "precision.md",
    "quantize.md",
    "host.md",
    "integrations.md",
    "porting.md",
)


def page_script(page: Path) -> str:
    """The page's runnable Python blocks, in order, as one script."""
    return "\n".join(code for code, _ in page_snippets(page))


#: Printed after each block of a page's script: splits its output block by block.
BLOCK_END = "<<end of a docs block>>"
#: An output block whose info line says this shows one machine's measurement: not compared.
VARIES = "varies"


def page_snippets(page: Path) -> list[tuple[str, list[str] | None]]:
    """The page's runnable Python blocks, each with the ```text block right after it.

    The output is None where no text block follows, or where its info line says the
    output varies (a measurement of the machine the page was written on).
    """
    text = page.read_text(encoding="utf-8")
    blocks = list(_FENCED.finditer(text))
    found: list[tuple[str, list[str] | None]] = []
    for index, block in enumerate(blocks):
        if block["info"].strip() != "python" or "path/to/" in block["body"]:
            continue
        after = blocks[index + 1] if index + 1 < len(blocks) else None
        shown = None
        if (
            after is not None
            and after["info"].strip().startswith("text")
            and not text[block.end() : after.start()].strip()
            and VARIES not in after["info"]
        ):
            shown = [row.rstrip() for row in after["body"].rstrip().splitlines()]
        found.append((block["body"], shown))
    return found


def _porting_prints(printed: str) -> list[str]:
    """docs/porting.md compares with accelerate: torchfit must hit fewer OOMs than it."""
    oom_line = re.compile(r"^(accelerate|torchfit): batch \d+ after (\d+) out", re.MULTILINE)
    found = dict(oom_line.findall(printed))
    problems = []
    if not {"accelerate", "torchfit"} <= found.keys():
        problems.append("no 'accelerate: batch N after K out...' and 'torchfit: ...' lines")
    elif int(found["torchfit"]) >= int(found["accelerate"]):
        problems.append(f"torchfit hit {found['torchfit']} OOMs, accelerate {found['accelerate']}")
    lines = ("the loop returned a loss of", "binsearch, ported: batch")
    return problems + [f"{line!r} not printed" for line in lines if line not in printed]


#: What a page's script must print beyond the output blocks it shows: a check of the whole
#: output returning its problems.
PAGE_PRINTS = {"porting.md": _porting_prints}


@pytest.mark.slow
@pytest.mark.parametrize("page", SNIPPET_PAGES)
def test_guide_snippets_run_as_written(page, tmp_path):
    # A new user copies these word for word: each page must run, in a process of its own
    # (forked from one that imported torch, transformers and torchfit: tests/script_server.py).
    snippets = page_snippets(DOCS / page)
    assert any(code.strip() for code, _ in snippets), f"{page} has no Python blocks"
    script = tmp_path / "snippet.py"
    marker = f"\nprint({BLOCK_END!r}, flush=True)\n"
    script.write_text(marker.join(code for code, _ in snippets) + marker, encoding="utf-8")
    # this worker's share of the cores (tests/conftest.py): more threads would spin against
    # the other workers' (OMP_NUM_THREADS is read when torch starts: the server's start)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "OMP_NUM_THREADS": str(torch.get_num_threads())}  # fmt: skip
    stdout = tmp_path / "stdout.txt"
    request = {"script": str(script), "cwd": str(tmp_path), "stdout": str(stdout)}
    status, stderr = run_forked("script_server", request, env, timeout=600)
    assert status == 0, stderr[-2000:]
    output = stdout.read_text(encoding="utf-8")
    assert output.strip()  # every page prints what it shows
    # each output block shown after a Python block is what that block printed
    outputs = output.split(BLOCK_END + "\n")
    problems = []
    for (code, shown), printed in zip(snippets, outputs, strict=False):
        if shown is None:
            continue
        actual = [row.rstrip() for row in printed.strip("\n").splitlines()]
        problem = output_mismatch(shown, actual)
        if problem is not None:
            first = code.strip().splitlines()[0]
            problems.append(f"block {first!r}: {problem}\n" + "\n".join(actual))
    problems += PAGE_PRINTS.get(page, lambda _: [])(output)
    assert not problems, f"{page}: " + "\n\n".join(problems)


# -- commands shown with their output: the page cannot drift from what they print ---------

_FENCED = re.compile(r"^```(?P<info>[^\n]*)\n(?P<body>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
#: A line of an output block that stands for lines left out.
ELISION = "..."


class ShownCommand(NamedTuple):
    """A ``torchfit`` command in a ```bash block and the ```text block right after it."""

    page: Path
    line: int
    command: str
    output: list[str]


def shown_commands(page: Path) -> list[ShownCommand]:
    """Every ``torchfit`` command of a page that is followed by its output."""
    text = page.read_text(encoding="utf-8")
    blocks = list(_FENCED.finditer(text))
    shown: list[ShownCommand] = []
    for block, after in itertools.pairwise(blocks):
        command = block["body"].replace("\\\n", " ").strip()
        between = text[block.end() : after.start()]
        if block["info"].strip() != "bash" or not command.startswith("torchfit "):
            continue
        if "\n" in command or between.strip() or not after["info"].startswith("text"):
            continue
        line = text.count("\n", 0, block.start()) + 1
        output = [row.rstrip() for row in after["body"].rstrip().splitlines()]
        shown.append(ShownCommand(page, line, " ".join(command.split()), output))
    return shown


def output_mismatch(shown: list[str], actual: list[str]) -> str | None:
    """Why ``actual`` is not what ``shown`` shows, or None when it is.

    A line ``...`` in ``shown`` stands for any lines (none included); every other line must
    appear in ``actual`` as shown, in order, and the first and last lines are the output's
    own first and last lines unless an elision stands before or after them.
    """
    chunks: list[list[str]] = [[]]
    for row in shown:
        if row == ELISION:
            chunks.append([])
        else:
            chunks[-1].append(row)
    position = 0
    for index, chunk in enumerate(chunks):
        if not chunk:
            continue
        last = index == len(chunks) - 1
        if index == 0:
            candidates = [0]
        elif last:
            candidates = [len(actual) - len(chunk)]
        else:
            candidates = range(position, len(actual) - len(chunk) + 1)
        found = next(
            (at for at in candidates if at >= position and actual[at : at + len(chunk)] == chunk),
            None,
        )
        if found is None:
            where = "first" if index == 0 else "last" if last else "next"
            return f"the {where} shown lines are not the output's: {chunk[0]!r} ... {chunk[-1]!r}"
        position = found + len(chunk)
    if chunks[-1] and position != len(actual):
        return f"the output goes on after the last shown line: {actual[position]!r}"
    return None


SHOWN = [shown for page in [*_doc_pages(), REPO / "README.md"] for shown in shown_commands(page)]


@pytest.mark.parametrize("shown", SHOWN, ids=lambda s: f"{s.page.relative_to(REPO)}:{s.line}")
def test_a_shown_command_prints_what_the_page_shows(shown, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # --plot writes where the reader stands
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    argv = shlex.split(shown.command)
    assert torchfit_main(argv[1:]) == 0, capsys.readouterr().err
    actual = [row.rstrip() for row in capsys.readouterr().out.rstrip().splitlines()]
    problem = output_mismatch(shown.output, actual)
    assert problem is None, f"{problem}\n$ {shown.command}\n" + "\n".join(actual)


def test_every_recipe_command_shows_its_output():
    page = DOCS / "recipes.md"
    commands = [
        block["body"]
        for block in _FENCED.finditer(page.read_text(encoding="utf-8"))
        if block["info"].strip() == "bash" and block["body"].startswith("torchfit ")
    ]
    checked = shown_commands(page)
    assert len(checked) == len(commands) >= 12
    assert not [s for s in checked if not s.output], "an output block is empty"


@pytest.mark.parametrize(
    ("shown", "problem"),
    [
        (["a", "b", "c"], None),
        (["a", "...", "c"], None),
        (["...", "b", "..."], None),
        (["a", "...", "b", "...", "c"], None),
        (["a", "b"], "the output goes on"),
        (["b", "c"], "the first shown lines"),
        (["a", "...", "x", "...", "c"], "the next shown lines"),
        (["a", "...", "b", "...", "a"], "the last shown lines"),
        (["a", "b", "c", "d"], "the first shown lines"),
        (["...", "b"], "the last shown lines"),
        (["a", "..."], None),
    ],
)
def test_output_matcher(shown, problem):
    result = output_mismatch(shown, ["a", "b", "c"])
    assert result == problem or (problem is not None and result.startswith(problem))


def test_shown_commands_are_read_with_their_continuations(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        '# T {#t}\n\n```bash\ntorchfit plan gpt2 \\\n    --gpu "RTX 3060"\n```\n\n'
        '```text title="output"\nline 1\n...\n```\n\n```bash\ntorchfit gpus\n```\n\n'
        "Prose between: not an output.\n\n```text\nx\n```\n",
        encoding="utf-8",
    )
    assert shown_commands(page) == [
        ShownCommand(page, 3, 'torchfit plan gpt2 --gpu "RTX 3060"', ["line 1", "..."])
    ]


# -- the README's claims are what the code and the benchmarks say ------------------------


def _benchmark(name: str) -> Any:
    """A script of benchmarks/ as a module (it puts benchmarks/ on sys.path itself)."""
    if name in sys.modules:  # tests/benchmarks_published imports it by name too
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _words(text: str) -> str:
    return " ".join(text.split())


def test_the_readme_states_the_published_runs_as_the_benchmark_page_does():
    # benchmarks/published.py --readme prints this paragraph from a fresh run; the page
    # holds the run's summary lines, so README and page cannot tell different numbers
    published = _benchmark("published")
    page = (DOCS / "benchmarks.md").read_text(encoding="utf-8")
    tuning = published.read_summary(page, published.TUNING)
    heldout = published.read_summary(page, published.HELDOUT)
    assert tuning.figures > 0 and heldout.figures > 0  # the summaries were found
    paragraph = published.readme_paragraph(tuning, heldout)
    assert _words(paragraph) in _words((REPO / "README.md").read_text(encoding="utf-8"))


def test_a_summary_reads_back_as_printed():
    published = _benchmark("published")
    summary = published.Summary(44, 7, 0.026, -0.075, 0.193, 0, 7)
    report = "\n".join(["## Fully specified cases {#x}", "", *summary.lines(), ""])
    assert published.read_summary(report, published.TUNING) == summary
    no_figures = published.Summary(0, 1, agree=1)
    report = "\n".join(["### Held-out cases", "", *no_figures.lines()])
    assert published.read_summary(report, published.HELDOUT) == no_figures


def test_the_readme_examples_do_what_their_comments_say():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "# FITS, up to batch 6" in readme
    plan = torchfit.fits(
        "llama-2-13b",
        ["A100 40GB"] * 8,
        strategy="fsdp",
        param_dtype="bf16",
        gradient_checkpointing=True,
        seq_len=2048,
    )
    assert plan.fits and plan.largest_batch == 6
    assert "# layers 0-30 | 31-39" in readme
    placed = memory.plan_device_map("llama-2-13b", ["RTX 4090"] * 2, seq_len=4096)
    assert placed.fits
    assert [share.layers for share in placed.devices] == [tuple(range(31)), tuple(range(31, 40))]


def test_the_readme_step_example_says_its_estimate():
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    step = torchfit.Step.from_peft(
        peft.LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"),
        transformers.BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype="bfloat16",
        ),
        batch_size=1,
        seq_len=2048,
        gradient_checkpointing=True,
    )
    total = torchfit.estimate("llama-3.1-8b", step).total
    assert f"# {total / 2**30:.1f} GiB at the peak" in readme


def test_a_python_blocks_shown_output_is_the_text_block_right_after_it(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "```python\nprint(1)\n```\n\n```text\n1\n```\n\n"
        "```python\nprint(2)\n```\n\nSome words.\n\n```text\n2\n```\n\n"
        '```python\nprint(3)\n```\n```text title="output (varies)"\n3\n```\n\n'
        "```python\nload('path/to/model')\n```\n",
        encoding="utf-8",
    )
    shown = [("print(1)\n", ["1"]), ("print(2)\n", None), ("print(3)\n", None)]
    assert page_snippets(page) == shown
