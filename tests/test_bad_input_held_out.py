"""A second set of wrong values, kept apart from the main table, run by the same harness.

tests/test_bad_input.py tries the values of tests/bad_inputs.py, which the checks were
written against. The values here were not: numpy scalars of the wrong kind, huge and
negative-zero numbers, ``bytes``, ``Decimal`` and ``Fraction``, complex numbers, units in
the wrong place, containers of the wrong length or with one wrong item. Each must be
refused with a ValueError or TypeError naming the parameter, as in the main table.
"""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
import torch

from test_bad_input import PAIRS, _refused

#: Values no parameter of any kind takes (a parameter's own kind adds more below).
ANYWHERE: tuple[object, ...] = (b"8", complex(1, 1), Decimal("NaN"), np.float64("nan"))

#: Held-out wrong values by the name of a parameter's kind (tests/bad_inputs.py).
HELD_OUT: dict[str, tuple[object, ...]] = {
    "count": (np.int64(0), np.int64(-3), np.float64(8.0), -0.0, Decimal(8), Fraction(8, 1),
              -(2**70), torch.tensor(8)),
    "non-negative int": (np.int64(-1), np.int32(-2**31), Decimal(-1), -0.0, Fraction(1, 2),
                         np.float32(2.0), -(2**100)),
    "flag": ("True", "false", np.int64(1), 1.0, Decimal(1), b"yes", (True,)),
    "real": (Decimal("Infinity"), np.float64("inf"), np.float32("-inf"), "1e3", np.float16("-inf")),
    "positive number": (-0.0, np.float64(-1.0), Decimal(0), Fraction(-1, 3), np.float32("inf"),
                        -1e-300, "2"),
    "non-negative number": (np.float64(-1e-300), Decimal(-1), np.float32("nan"), "0"),
    "fraction": (np.float64(1.0), Fraction(3, 2), -1e-300, np.float32("nan"), "0.25"),
    "probability": (np.float64(1.0000001), Fraction(-1, 10), np.float32("nan"), "0.5"),
    "name": (b"fp16", "nf4nf4", "\u2603", "qq-" * 3, np.float64(1.0), ("adamw",)),
    "text": (b"name", "\n\t", np.int64(3)),
    "size": ("GB12", "12GB12", "1.5.2GB", "-0.5GB", np.float64("nan"), np.int64(-1),
             Decimal("NaN"), b"12GB", "12 parsec"),
    "capacity": ("0.0GB", "0", np.int64(0), b"1GB", "GB", "-0.5GB", np.float64(-1.0)),
    "module": (torch.nn.Module, b"gpt2", np.float64(1.0), (torch.nn.Linear(2, 2),),
               {"layer": torch.nn.Linear(2, 2)}),
    "shape": ((np.int64(0),), (3, 224, 224, 0), ((3,),), (b"3",), (3.0,), (-0.0,), "(3, 224)",
              (2**70 * -1,)),
    "callable": (b"f", np.int64(1), (print,), "print"),
    "device": (b"cpu", "cuda:x", "tpu:0", "cpu cpu", np.float64(0.0)),
    "dtype": (b"bf16", "float17", "fp16fp16", np.float64(16.0), torch.complex64),
    "model": (b"gpt2", ("gpt2",), Decimal(1), np.float64(2.0)),
    "card": (b"A100", ("A100",), np.float64(2.5), {"memory": 1}),
    "counts": ((np.int64(0),), [b"8"], [Decimal(8)], [8, -0.0], range(3), np.array([8])),
    "autocast dtype": (torch.complex64, torch.float64, torch.uint8, b"bf16"),
}  # fmt: skip


def _values(kind_name: str) -> tuple[object, ...]:
    return HELD_OUT.get(kind_name, ()) + ANYWHERE


@pytest.mark.parametrize(("case", "name"), PAIRS, ids=lambda x: getattr(x, "name", x))
def test_every_held_out_wrong_value_is_refused_by_name(case, name):
    for value in _values(case.kinds[name].name):
        _refused(case, name, value)


def test_the_held_out_set_differs_from_the_main_table():
    import bad_inputs
    from bad_inputs import Kind

    kinds = {k.name: k for k in vars(bad_inputs).values() if isinstance(k, Kind)}
    assert set(HELD_OUT) <= set(kinds)
    for name, values in HELD_OUT.items():
        main = kinds[name].canonical if name in kinds else ()
        shared = [v for v in values if any(v is m or repr(v) == repr(m) for m in main)]
        assert not shared, f"{name}: {shared} are in the main table too"
