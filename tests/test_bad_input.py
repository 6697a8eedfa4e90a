"""Every public callable, given one wrong value at a time, refuses it and names the parameter.

The table (tests/bad_input_cases.py) gives each public callable valid base arguments and
a `Kind` per parameter; each test replaces one argument with a value of the wrong type,
out of range, NaN/inf, empty or unknown, and expects a ValueError or TypeError whose
message names that parameter. A call that returns is a silent answer and fails, and so
does any other exception (an AttributeError from inside). The table must list every
public name and every parameter, so a new one cannot be forgotten.
"""

from __future__ import annotations

import importlib
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bad_input_cases import CASES, RECORDS

PACKAGES = ["torchfit", "torchfit.memory", "torchfit.precision", "torchfit.loaders",
            "torchfit.quantize", "torchfit.memory.device_map", "torchfit.memory.gpus",
            "torchfit.memory.measure", "torchfit.memory.result",
            "torchfit.memory.sharding"]  # fmt: skip
PAIRS = [(case, name) for case in CASES for name, kind in case.kinds.items() if kind is not None]


def _signature(case):
    return case.signature()


def _optional(parameter) -> bool:
    return parameter.default is None or "None" in str(parameter.annotation)


def _call(case, name=None, value=None):
    """Call ``case``'s callable with its base arguments, ``name`` set to ``value``."""
    func = case.make()
    args, kwargs = list(case.args), dict(case.bases.get(name, case.kwargs))
    if name is not None:
        names = list(case.signature().parameters)
        index = names.index(name)
        if index < len(args):
            args[index] = value
        else:
            kwargs[name] = value
    return func(*args, **kwargs)


def _answered(case, name, value) -> None:
    """Call with ``name=value``; an answer is a failure (a silent wrong result)."""
    result = _call(case, name, value)
    pytest.fail(f"{case.name}({name}={value!r}) answered silently: {result!r}")


def _refused(case, name, value) -> None:
    words = (name, *case.names.get(name, ()))
    with pytest.raises((ValueError, TypeError)) as refusal:
        _answered(case, name, value)
    message = str(refusal.value)
    assert any(word in message for word in words), (
        f"{case.name}({name}={value!r}) raised {refusal.typename} without naming {name}: {message}"
    )
    assert "\n" not in message.strip() or len(message) < 2000


def _short(value: object) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return repr(value)[:20]


def test_the_table_names_every_public_callable():
    covered = {case.name.split(".")[0].split(" ")[0] for case in CASES}
    missing = [
        f"{package}.{name}"
        for package in PACKAGES
        for name in importlib.import_module(package).__all__
        if name not in covered and name not in RECORDS
    ]
    assert not missing, f"add these to tests/bad_input_cases.py: {missing}"


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_the_table_names_every_parameter(case):
    if case.partial:
        assert set(case.kinds) <= set(_signature(case).parameters), case.name
        return
    assert set(case.kinds) == set(_signature(case).parameters), case.name


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_the_base_arguments_are_valid(case):
    if case.base_raises is not None:
        with pytest.raises(case.base_raises):
            _call(case)
        return
    _call(case)
    for name in case.bases:
        func = case.make()
        func(*case.args, **case.bases[name])


@pytest.mark.parametrize(("case", "name"), PAIRS, ids=lambda x: getattr(x, "name", x))
def test_every_canonical_wrong_value_is_refused_by_name(case, name):
    parameter = _signature(case).parameters[name]
    values = list(case.kinds[name].canonical)
    if not _optional(parameter) and parameter.kind is not parameter.VAR_POSITIONAL:
        values.append(None)
    for value in values:
        _refused(case, name, value)


@pytest.mark.parametrize(("case", "name"), PAIRS, ids=lambda x: getattr(x, "name", x))
@settings(max_examples=3, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_generated_wrong_values_are_refused_by_name(case, name, data):
    value = data.draw(case.kinds[name].bad(), label=name)
    _refused(case, name, value)
