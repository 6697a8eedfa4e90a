"""The repository checks out everywhere, and carries what a package is expected to carry.

Every committed path must check out on Linux, macOS and Windows: no control characters
(a tab in a name breaks a Windows checkout), no space at either end of a name, none of the
characters or names Windows reserves, no two paths that differ only in case. Stray
outputs are refused too: a figure named only ``.png`` is one saved under an empty name.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
import unicodedata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: Characters Windows refuses in a file name.
_WINDOWS_CHARS = set('<>:"|?*\\')
#: Names Windows reserves, with any extension (CON, CON.txt, ...).
_WINDOWS_NAMES = re.compile(r"^(con|prn|aux|nul|com[0-9]|lpt[0-9])(\..*)?$", re.IGNORECASE)
#: What matplotlib writes when asked to save a figure under an empty name.
_FIGURE_SUFFIXES = {".png", ".pdf", ".svg", ".jpg", ".jpeg", ".eps", ".ps"}


def name_problems(path: str) -> list[str]:
    """Why ``path`` (slash-separated, relative) would not check out everywhere."""
    problems: list[str] = []
    for name in path.split("/"):
        shown = f"{path!r}: {name!r}"
        if any(unicodedata.category(c) == "Cc" for c in name):
            problems.append(f"{shown} has a control character (tab, newline)")
        if name != name.strip() or name.endswith("."):
            problems.append(f"{shown} starts or ends with a space or ends with a dot")
        if _WINDOWS_CHARS & set(name) or _WINDOWS_NAMES.match(name):
            problems.append(f"{shown} is not a valid Windows file name")
        if name.strip().lower() in _FIGURE_SUFFIXES:
            problems.append(f"{shown} is a figure saved under an empty name")
    return problems


def committed_paths() -> list[str]:
    """The paths git tracks in this checkout (skips with a reason outside a git checkout)."""
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is not installed: the committed paths cannot be listed")
    listed = subprocess.run(
        [git, "ls-files", "-z"], cwd=REPO, capture_output=True, check=False, timeout=60
    )
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout: {listed.stderr.decode(errors='replace').strip()}")
    return [p for p in listed.stdout.decode("utf-8").split("\0") if p]


def test_every_committed_path_checks_out_everywhere():
    paths = committed_paths()
    assert "pyproject.toml" in paths  # the listing worked
    assert [problem for path in paths for problem in name_problems(path)] == []
    by_case: dict[str, list[str]] = {}
    for path in paths:
        by_case.setdefault(path.lower(), []).append(path)
    assert [group for group in by_case.values() if len(group) > 1] == []


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("src/torchfit/cli/app.py", None),
        (".ci/run", None),
        (".pre-commit-config.yaml", None),
        ("docs/img/memory_vs_batch.png", None),
        ("\t.png", "control character"),
        (" .png", "starts or ends with a space"),
        (".png", "figure saved under an empty name"),
        ("docs/a\nb.md", "control character"),
        ("docs/what?.md", "not a valid Windows file name"),
        ("aux.py", "not a valid Windows file name"),
        ("notes.", "ends with a dot"),
    ],
)
def test_name_checker(path, problem):
    found = name_problems(path)
    if problem is None:
        assert found == []
    else:
        assert any(problem in line for line in found), found


def test_the_license_is_the_one_pyproject_declares():
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    text = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert text.lstrip().startswith("Apache License\n")
    assert "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def _readme_commands() -> list[str]:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    return [
        block.strip()
        for block in re.findall(r"^```bash\n(.*?)^```", readme, re.DOTALL | re.MULTILINE)
    ]


def test_ci_runs_the_readme_test_command_word_for_word_under_ci():
    command = next(c for c in _readme_commands() if c.endswith("&& pytest"))
    script = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert command in script
    # CI=1 picks the hypothesis "ci" profile (tests/conftest.py) before the tests run
    assert script.index("export CI=1") < script.index(command)
    # options CI needs live in pyproject's addopts, so the README's plain `pytest` has them
    options = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    addopts = options["tool"]["pytest"]["ini_options"]["addopts"].split()
    assert "--durations=15" in addopts
    assert addopts[addopts.index("-n") + 1] == "auto"  # every core of the machine


def test_the_torch_floor_is_the_torch_the_readme_installs():
    # the declared requirement is what the tests run on, not an older torch nobody tried
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    floor = next(d for d in project["dependencies"] if d.startswith("torch"))
    pinned = {m[1] for c in _readme_commands() if (m := re.search(r"torch==(\d+\.\d+)\.\d+", c))}
    assert len(pinned) == 1
    assert floor == f"torch>={pinned.pop()}"


def test_pre_commit_runs_ci_lint_format_and_types_with_the_projects_tools():
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text(encoding="utf-8"))
    [repo] = config["repos"]
    assert repo["repo"] == "local"  # the tools of the dev extra, not downloaded copies
    hooks = {hook["id"]: hook for hook in repo["hooks"]}
    assert sorted(hooks) == ["mypy", "ruff", "ruff-format"]
    assert all(hook["language"] == "system" for hook in hooks.values())
    script = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    # the same commands as CI (pre-commit's format fixes where CI's --check reports)
    assert hooks["ruff"]["entry"] in script
    assert hooks["ruff-format"]["entry"].replace("ruff format", "ruff format --check") in script
    assert hooks["mypy"]["entry"] in script
