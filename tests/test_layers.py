"""Dependencies point one way: the import-linter contracts in pyproject.toml, and no cycles.

Function-level (lazy) imports count too: a cycle hidden inside a function is still a cycle
that decides what can be changed without the other side.
"""

import pathlib
import subprocess
import sys

import grimp
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_import_linter_contracts_hold():
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from importlinter.cli import lint_imports_command; lint_imports_command()",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _cycles(graph):  # noqa: PLR0912 - Tarjan's algorithm reads best in one piece
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in graph.modules:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_import_cycle_between_modules():
    graph = grimp.build_graph("torchfit")
    # A package's __init__ re-exports its modules; a module importing its own package's
    # public names would be a cycle through __init__, and that is what this finds.
    assert _cycles(graph) == []


@pytest.mark.parametrize(
    ("importer", "imported"),
    [("torchfit._core", "torchfit.memory"), ("torchfit.memory", "torchfit.quantize")],
)
def test_the_cycle_finder_can_fail(importer, imported):
    class Fake:
        modules = frozenset({importer, imported})

        @staticmethod
        def find_modules_directly_imported_by(module):
            return {imported} if module == importer else {importer}

    assert _cycles(Fake()) == [sorted({importer, imported})]
