"""The public surface: every name in an ``__all__`` exists, is public, and lives at a public path.

A name's ``__module__`` must be importable without a private (``_``) component and must
give back the same object under the name's ``__qualname__``: that is the path users,
pickle and the API reference see.
"""

import ast
import importlib
import pathlib
import pkgutil

import pytest

import torchfit

PUBLIC_PACKAGES = [
    "torchfit",
    "torchfit.memory",
    "torchfit.loaders",
    "torchfit.precision",
    "torchfit.quantize",
    "torchfit.host",
    "torchfit.speed",
]
#: The stages of torchfit.memory: each exports its own public names beyond the few that
#: torchfit.memory re-exports.
MEMORY_STAGES = [
    f"torchfit.memory.{stage}"
    for stage in (
        "allocator",
        "analytic",
        "batch",
        "catalog",
        "device_map",
        "gpus",
        "modules",
        "plan",
        "sharding",
        "tracing",
    )
]

SRC = pathlib.Path(torchfit.__file__).parent


def _public_names(package):
    return [(package, name) for name in importlib.import_module(package).__all__]


@pytest.mark.parametrize(
    ("package", "name"),
    [pair for pkg in PUBLIC_PACKAGES + MEMORY_STAGES for pair in _public_names(pkg)],
)
def test_every_exported_name_exists_is_public_and_has_a_public_home(package, name):
    module = importlib.import_module(package)
    assert not name.startswith("_") or name == "__version__"
    obj = getattr(module, name)  # AttributeError: __all__ names something missing
    home = getattr(obj, "__module__", None)
    if home is None or not (callable(obj) or isinstance(obj, type)):
        return  # constants and submodules have no home of their own
    assert not any(part.startswith("_") for part in home.split(".")), (
        f"{package}.{name} is defined in the private module {home}; define it in a public "
        "module or give it the public package as __module__"
    )
    found = importlib.import_module(home)
    for part in obj.__qualname__.split("."):
        found = getattr(found, part)
    assert found is obj, f"{home}.{obj.__qualname__} is not {package}.{name}"


def test_memory_all_is_grouped_by_comment():
    tree = ast.parse((SRC / "memory" / "__init__.py").read_text())
    source = (SRC / "memory" / "__init__.py").read_text()
    start = source.index("__all__ = [")
    groups = [
        line.strip().removeprefix("# ").split(" - ")[0]
        for line in source[start:].splitlines()
        if line.strip().startswith("#")
    ]
    assert groups[:4] == ["plan", "estimate", "trace", "measure"]
    assert {"catalog", "allocator", "several GPUs"} <= set(groups)
    assert any(isinstance(node, ast.Assign) for node in tree.body)


def test_torchfit_memory_exports_only_what_most_runs_need():
    assert len(torchfit.memory.__all__) <= 20, (
        "torchfit.memory exports the names most runs need; export the others from their "
        "stage (torchfit.memory.batch, .allocator, ...)"
    )


def test_no_public_name_means_two_things():
    meanings: dict[str, set[str]] = {}
    for package in PUBLIC_PACKAGES + MEMORY_STAGES:
        module = importlib.import_module(package)
        for name in module.__all__:
            obj = getattr(module, name)
            where = getattr(obj, "__module__", package) if callable(obj) else package
            meanings.setdefault(name, set()).add(f"{where}.{getattr(obj, '__qualname__', name)}")
    twice = {name: sorted(homes) for name, homes in meanings.items() if len(homes) > 1}
    assert twice == {}, "one name, one meaning: rename one of them"


def _all_modules():
    return sorted(
        info.name
        for info in pkgutil.walk_packages([str(SRC)], prefix="torchfit.")
        if not info.name.endswith(".__main__")  # running it is the command itself
    )


def test_no_submodule_shares_a_name_with_what_its_package_exports():
    for name in _all_modules():
        parent, _, leaf = name.rpartition(".")
        package = importlib.import_module(parent)
        exported = getattr(package, "__all__", ())
        if getattr(package, leaf, None) is importlib.import_module(name):
            continue  # the package exports the submodule itself (torchfit.memory)
        assert leaf not in exported, (
            f"module {name} is named after {parent}.{leaf}, which {parent} re-exports: "
            f"`import {name} as m` would not give the module"
        )


def test_documented_import_paths_keep_working():
    from torchfit import memory

    assert callable(memory.estimate)
    assert callable(memory.trace)
    assert callable(torchfit.memory.plan.plan_card)
    assert torchfit.fits.__module__ == "torchfit.whole"
    assert memory.estimate.__name__ == "estimate"
    assert memory.trace.__name__ == "trace"


def test_no_private_file_names_inside_packages():
    offenders = [
        str(path.relative_to(SRC))
        for path in SRC.rglob("*.py")
        if path.name.startswith("_") and path.name not in {"__init__.py", "__main__.py"}
    ]
    assert offenders == [], "a prefix is a folder trying to exist: move these into a package"


def test_no_file_past_the_size_guideline():
    long = {
        str(path.relative_to(SRC)): len(path.read_text().splitlines()) for path in SRC.rglob("*.py")
    }
    assert {name: n for name, n in long.items() if n > 420} == {}
