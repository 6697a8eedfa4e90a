"""Wrong values by kind of parameter, for tests/test_bad_input.py.

A `Kind` says what a parameter takes; its ``bad`` strategy draws values it must refuse
(wrong types, negative/zero/NaN/inf numbers, empty and unknown strings) and ``canonical``
lists the ones every run tries. None is added for a parameter that does not accept it.
"""

from __future__ import annotations

import dataclasses
import inspect
import math

import torch
from hypothesis import strategies as st

NAN, INF = math.nan, math.inf


@dataclasses.dataclass(frozen=True)
class Kind:
    """What a parameter takes, and the values it must refuse."""

    name: str
    canonical: tuple[object, ...]
    generated: st.SearchStrategy[object] = dataclasses.field(default_factory=st.nothing)

    def bad(self) -> st.SearchStrategy[object]:
        return st.one_of(st.sampled_from(self.canonical), self.generated)


def _texts() -> st.SearchStrategy[str]:
    """Strings no option takes: empty, spaces, and nonsense."""
    nonsense = st.text(alphabet="qxzj#%!~", min_size=1, max_size=6).map(lambda s: "qq" + s)
    return st.one_of(st.sampled_from(["", " ", "\t"]), nonsense)


_FLOATS = st.floats(allow_nan=True, allow_infinity=True)
_NOT_NUMBER = st.one_of(
    st.sampled_from(["8", "", [1], {"a": 1}, True, False, object()]),
    st.text(max_size=4),
    st.lists(st.integers(), max_size=2),
)
_NOT_INT = st.one_of(_NOT_NUMBER, _FLOATS)

#: A whole number >= 1 (a batch size, a count of layers).
COUNT = Kind(
    "count",
    (0, -1, 2.5, NAN, INF, "8", True, [8]),
    st.one_of(st.integers(max_value=0), _NOT_INT),
)
#: A whole number >= 0 (bytes, a count that may be zero).
NON_NEGATIVE = Kind(
    "non-negative int",
    (-1, -(2**40), 2.5, NAN, INF, "8", True, [8]),
    st.one_of(st.integers(max_value=-1), _NOT_INT),
)
#: True or False.
FLAG = Kind("flag", (0, 1, "yes", "", 2.5, [True]), st.one_of(st.integers(), st.text(max_size=3)))
#: A finite real number (any sign).
REAL = Kind("real", (NAN, INF, -INF, "1.0", True, [1.0]), _NOT_NUMBER)
#: A number > 0 (a time, a scale).
POSITIVE = Kind(
    "positive number",
    (0, 0.0, -1.0, NAN, INF, "1.0", True, [1.0]),
    st.one_of(st.floats(max_value=0), st.just(NAN), st.just(INF), _NOT_NUMBER),
)
#: A number >= 0.
NON_NEGATIVE_NUMBER = Kind(
    "non-negative number",
    (-1.0, -0.5, NAN, INF, "1.0", True, [1.0]),
    st.one_of(st.floats(max_value=-1e-9), st.just(NAN), st.just(INF), _NOT_NUMBER),
)
#: A fraction in [0, 1).
FRACTION = Kind(
    "fraction",
    (1.0, 1.5, -0.1, NAN, INF, "0.1", True, [0.1]),
    st.one_of(st.floats(min_value=1.0), st.floats(max_value=-1e-9), st.just(NAN), _NOT_NUMBER),
)
#: A probability in [0, 1].
PROBABILITY = Kind(
    "probability",
    (1.5, -0.1, NAN, INF, "0.1", True, [0.1]),
    st.one_of(st.floats(min_value=1.001), st.floats(max_value=-1e-9), st.just(NAN), _NOT_NUMBER),
)
#: A name from a fixed set (a dtype, an optimizer, a mode, a strategy).
NAME = Kind("name", ("", " ", "qqnope", 3, 2.5, ["x"], True), st.one_of(_texts(), st.integers()))
#: Free text that must not be empty (a GPU's name).
TEXT = Kind(
    "text", ("", " ", 3, 2.5, ["x"], True), st.one_of(st.sampled_from(["", " "]), st.integers())
)
#: Bytes: a whole number >= 0 or a size string.
SIZE = Kind(
    "size",
    (-1, NAN, INF, -INF, "-3GB", "twelve", "12 parsecs", "", True, [1]),
    st.one_of(
        st.integers(max_value=-1), st.just(NAN), _texts(), st.lists(st.integers(), max_size=2)
    ),
)
#: Bytes > 0 (a card's capacity).
CAPACITY = Kind(
    "capacity",
    (0, "0GB", -1, NAN, INF, "-3GB", "twelve", "", True, [1]),
    st.one_of(
        st.integers(max_value=0), st.just(NAN), _texts(), st.lists(st.integers(), max_size=2)
    ),
)
#: A built ``nn.Module``.
MODULE = Kind(
    "module",
    ("gpt2", 3, torch.nn.Linear, {"weights": 1}, [torch.nn.Linear(2, 2)], torch.zeros(2)),
    st.one_of(st.text(max_size=4), st.integers()),
)
#: A shape of one sample: whole numbers >= 1.
SHAPE = Kind(
    "shape",
    ((), (0,), (-1,), (0, 3), (3, -224), (2.5,), ("3",), "3,224", 3, (True,)),
    st.lists(st.integers(max_value=0), min_size=1, max_size=3).map(tuple),
)
#: A callable.
CALLABLE = Kind(
    "callable", (3, "step", [print], 2.5), st.one_of(st.integers(), st.text(max_size=3))
)
#: A device name torch reads.
DEVICE = Kind("device", ("tpu", "", " ", "gpu", 2.5, [0], True), _texts())
#: A dtype: a name, a torch.dtype or a DType.
DTYPE = Kind(
    "dtype", ("", " ", "int3", "qqnope", 3, 2.5, torch.int32, [torch.float16], True), _texts()
)
#: A model: a name, a config, a folder or a module (the catalog resolves it).
MODEL = Kind(
    "model",
    ("", " ", 3, 2.5, True, [1]),
    st.one_of(st.sampled_from(["", " ", "\n"]), st.integers()),
)
#: A GPU: a catalog name or a GPU record.
CARD = Kind("card", ("", " ", 2.5, True, [1.5], {"name": "x"}), st.sampled_from(["", " "]))
#: A sequence of whole numbers >= 1.
COUNTS = Kind(
    "counts",
    ([], [0], [-8], [2.5], ["8"], "8", 8, [True], [NAN]),
    st.lists(st.integers(max_value=0), min_size=1, max_size=3),
)
#: A transformers BitsAndBytesConfig, or its dict.
BNB_CONFIG = Kind(
    "bitsandbytes config",
    ("nf4", 3, True, [], {}, {"load_in_4bit": True, "bnb_4bit_quant_type": "int3"}),
    st.one_of(st.text(max_size=3), st.integers()),
)
#: A floating autocast dtype.
AUTOCAST = Kind("autocast dtype", (torch.int8, torch.int64, torch.bool, "bf16", 16, True))


# -- the public callables, each with valid base arguments and a kind per parameter ------

#: A parameter that takes any object (a user's callable's extra arguments, a config
#: object handed to another library): nothing to refuse.
FREE = None


@dataclasses.dataclass(frozen=True)
class Case:
    """A public callable: how to get it, valid base arguments, and what each parameter takes.

    ``make`` returns the callable afresh (a bound method needs its object set up; a
    wrapper names the callable it stands for in ``spec``);
    ``kinds`` maps every parameter of its signature to a `Kind` (or `FREE`);
    ``bases`` overrides the base arguments for one parameter (an input shape needs a
    model that takes one); ``names`` lists other words an error may use for a
    parameter (``parse_dtype(value)`` says "dtype").
    """

    name: str
    make: object
    args: tuple[object, ...] = ()
    kwargs: dict[str, object] = dataclasses.field(default_factory=dict)
    kinds: dict[str, Kind | None] = dataclasses.field(default_factory=dict)
    bases: dict[str, dict[str, object]] = dataclasses.field(default_factory=dict)
    names: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    spec: object = None  # whose signature ``make()``'s wrapper stands for
    partial: bool = False  # a second look at some parameters (another setup)
    base_raises: type[Exception] | None = None  # the base call needs a GPU this may lack

    def signature(self) -> inspect.Signature:
        """The parameters of the public callable (without ``self``)."""
        target = self.make() if self.spec is None else self.spec
        signature = inspect.signature(target)
        params = [p for name, p in signature.parameters.items() if name != "self"]
        return signature.replace(parameters=params)
