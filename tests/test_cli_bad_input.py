"""Every flag of every subcommand, given a wrong value, exits 2 with one line naming it.

The table below gives each option of each subcommand (read from the argparse parser
itself, so a new flag cannot be forgotten) a `Flag`: the wrong values every run tries
and a strategy that draws more. Each call runs ``torchfit`` in-process with one wrong
value and expects exit status 2, nothing on stdout, and exactly one line on stderr,
``torchfit: error: ...``, that names the flag. Contradictory options are listed apart.
"""

from __future__ import annotations

import argparse
import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchfit.cli import app, main


@dataclasses.dataclass(frozen=True)
class Flag:
    """What a flag takes, as the wrong values it must refuse (``None``: it takes no value)."""

    canonical: tuple[str, ...]
    generated: st.SearchStrategy[str] = dataclasses.field(default_factory=st.nothing)

    def bad(self) -> st.SearchStrategy[str]:
        return st.one_of(st.sampled_from(self.canonical), self.generated)


_NONSENSE = st.text(alphabet="qxzj#%~", min_size=1, max_size=6).map(lambda s: "qq" + s)
_BLANK = st.sampled_from(["", " ", "\t"])
_NOT_WHOLE = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).filter(lambda x: not float(x).is_integer()),
    st.sampled_from([float("nan"), float("inf"), -float("inf")]),
).map(str)

COUNT = Flag(
    ("0", "-1", "2.5", "nan", "inf", "-inf", "", " ", "8x", "eight", "1e3"),
    st.one_of(st.integers(max_value=0).map(str), _NOT_WHOLE, _NONSENSE, _BLANK),
)
WHOLE = Flag(
    ("-1", "2.5", "nan", "inf", "", "x"),
    st.one_of(st.integers(max_value=-1).map(str), _NOT_WHOLE, _NONSENSE, _BLANK),
)
NAME = Flag(("", " ", "qqnope", "nan", "-1", "3"), st.one_of(_NONSENSE, _BLANK))
SIZE = Flag(
    ("-3GB", "nan", "inf", "", " ", "twelve", "12 parsecs", "GB12"),
    st.one_of(st.integers(max_value=-1).map(str), _NONSENSE, _BLANK),
)
GPU = Flag(("", " ", "qqnope", "0GB", "-3GB", "nan", "0"), st.one_of(_NONSENSE, _BLANK))
VERSION = Flag(("", " ", "qq", "nan"), st.one_of(_NONSENSE.filter(str.isalpha), _BLANK))
NAMES = Flag(("", " ", ",", "q_proj,,v_proj", "q_proj,"), _BLANK)
SHAPE = Flag(
    ("", "0", "-1", "3,0", "2.5", "a,b", "3,,4", "3,-224,224"),
    st.lists(st.integers(max_value=0), min_size=1, max_size=3).map(
        lambda xs: ",".join(map(str, xs))
    ),
)
FRACTION = Flag(
    ("-0.1", "1", "1.5", "nan", "inf", "", " ", "x", "5%"),
    st.one_of(st.floats(min_value=1.0).map(str), st.floats(max_value=-1e-9).map(str), _NONSENSE),
)
AMOUNT = Flag(("0", "-1", "nan", "inf", "", " ", "x", "1e9x"), st.one_of(_NONSENSE, _BLANK))
PRICE = Flag(("", "H100", "=2", "H100=", "H100=-1", "H100=x", "H100=inf"), _BLANK)
PATH = Flag(("", " ", "\t", ".png", " .png", "/no/such/folder/plan.png", "."), _BLANK)
TEXT = Flag(("", " ", "\t"), _BLANK)
#: --recipe: blank, no file, a folder (files that are no config: tests/test_cli_recipe.py).
RECIPE = Flag(("", " ", "/no/such/config.yaml", "."), _BLANK)
MODEL = Flag(("", " ", "\t"), _BLANK)
COMMAND = Flag(("", "qqnope", "plans", "PLAN"), _NONSENSE)
#: A flag that takes no value: given one (``--json=yes``), it is refused.
SWITCH = Flag(("yes", "1", "", "false"), st.one_of(st.text(max_size=4), _NONSENSE))

#: Every option of every subcommand ("" is the top level), by its first option string
#: (or its dest for a positional). ``None``: nothing to refuse (--help, --version).
FLAGS: dict[tuple[str, str], Flag | None] = {
    ("", "--help"): None, ("", "--version"): None, ("", "command"): COMMAND,
    ("plan", "--help"): None, ("plan", "model"): MODEL,
    ("plan", "--trust-remote-code"): SWITCH, ("plan", "--gpu"): GPU, ("plan", "--gpus"): COUNT,
    ("plan", "--strategy"): NAME, ("plan", "--gpus-per-node"): COUNT,
    ("plan", "--offload-optimizer"): SWITCH, ("plan", "--offload-params"): SWITCH,
    ("plan", "--param-dtype"): NAME, ("plan", "--train"): SWITCH,
    ("plan", "--inference"): SWITCH, ("plan", "--dtype"): NAME, ("plan", "--seq"): COUNT,
    ("plan", "--batch"): COUNT, ("plan", "--input-shape"): SHAPE, ("plan", "--optimizer"): NAME,
    ("plan", "--checkpointing"): SWITCH, ("plan", "--trainable-params"): WHOLE,
    ("plan", "--attn"): NAME, ("plan", "--trace"): SWITCH, ("plan", "--device-map"): SWITCH,
    ("plan", "--precision"): NAME, ("plan", "--accumulate"): COUNT,
    ("plan", "--zero-grad-in-place"): SWITCH, ("plan", "--keep-output"): SWITCH,
    ("plan", "--fp32-output"): SWITCH,
    ("plan", "--time"): SWITCH,
    ("plan", "--optimizer-in-backward"): SWITCH, ("plan", "--cuda-version"): VERSION,
    ("plan", "--context"): SIZE, ("plan", "--lora-rank"): COUNT,
    ("plan", "--lora-targets"): NAMES, ("plan", "--bitsandbytes-version"): VERSION,
    ("plan", "--torch-version"): VERSION,
    ("plan", "--no-double-quant"): SWITCH, ("plan", "--base-dtype"): NAME,
    ("plan", "--bnb-compute-dtype"): NAME,
    ("plan", "--quantize-head"): SWITCH, ("plan", "--loss-chunk"): COUNT,
    ("plan", "--new-tokens"): COUNT, ("plan", "--no-kbit-prepare"): SWITCH,
    ("plan", "--lora-dropout"): FRACTION, ("plan", "--recipe"): RECIPE,
    ("plan", "--json"): SWITCH, ("plan", "--plot"): PATH, ("plan", "--machine"): NAME,
    ("plan", "--tokens"): AMOUNT, ("plan", "--samples"): AMOUNT, ("plan", "--price"): PRICE,
    ("gpus", "--help"): None, ("gpus", "--json"): SWITCH,
    ("models", "--help"): None, ("models", "--search"): TEXT, ("models", "--json"): SWITCH,
}  # fmt: skip

BASES = {"": [], "plan": ["plan", "gpt2", "--gpu", "RTX 3060"], "gpus": ["gpus"],
         "models": ["models"]}  # fmt: skip
PAIRS = [(command, name) for (command, name), flag in FLAGS.items() if flag is not None]


def _actions(parser: argparse.ArgumentParser, command: str) -> dict[tuple[str, str], object]:
    found: dict[tuple[str, str], object] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found[command, action.dest] = action
            for name, sub in action.choices.items():
                found.update(_actions(sub, name))
        else:
            found[command, max(action.option_strings or [action.dest], key=len)] = action
    return found


ACTIONS = _actions(app._parser(), "")


def argv_with(command: str, name: str, value: str) -> list[str]:
    """The base command line of ``command`` with ``name`` given ``value``."""
    action = ACTIONS[command, name]
    base = list(BASES[command])
    if name == "command":
        return [value]
    if not action.option_strings:  # a positional: replace it in place
        return [base[0], value, *base[2:]]
    if name in base:  # a required flag already there
        base[base.index(name) + 1] = value
        return base
    return [*base, f"{name}={value}"]


def refused(argv: list[str], needles: tuple[str, ...], capsys) -> None:
    """``torchfit argv`` exits 2, prints nothing, and says one line naming a needle."""
    status = main(argv)
    out, err = capsys.readouterr()
    assert status == 2, f"torchfit {argv} exited {status}; stdout: {out[:300]!r}"
    assert not out, f"torchfit {argv} printed an answer: {out[:300]!r}"
    assert err.startswith("torchfit: error: "), f"torchfit {argv}: {err!r}"
    assert err.count("\n") == 1 and err.endswith("\n"), f"torchfit {argv}: {err!r}"
    assert any(needle in err for needle in needles), (
        f"torchfit {argv} names none of {needles}: {err!r}"
    )
    assert "Traceback" not in err


@pytest.fixture(autouse=True)
def _in_an_empty_folder(tmp_path, monkeypatch):
    """Run where a wrongly accepted --plot would write, and check nothing was written.

    Before --plot was checked, its blank values ("", " ", a tab) each wrote a picture
    named ".png", " .png" or "\t.png" into the folder the tests ran in.
    """
    monkeypatch.chdir(tmp_path)
    yield
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def _needles(command: str, name: str) -> tuple[str, ...]:
    action = ACTIONS[command, name]
    return (name,) if action.option_strings else (name, name.upper())


def test_the_table_names_every_flag_of_every_subcommand():
    missing = sorted(set(ACTIONS) - set(FLAGS))
    extra = sorted(set(FLAGS) - set(ACTIONS))
    assert not missing, f"add these to FLAGS in tests/test_cli_bad_input.py: {missing}"
    assert not extra, f"these are no longer flags: {extra}"


@pytest.mark.parametrize(("command", "name"), PAIRS, ids=lambda x: x or "torchfit")
def test_every_canonical_wrong_value_exits_2_naming_the_flag(command, name, capsys):
    for value in FLAGS[command, name].canonical:
        refused(argv_with(command, name, value), _needles(command, name), capsys)


@pytest.mark.parametrize(("command", "name"), PAIRS, ids=lambda x: x or "torchfit")
@settings(max_examples=4, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(data=st.data())
def test_generated_wrong_values_exit_2_naming_the_flag(command, name, data, capsys):
    value = data.draw(FLAGS[command, name].bad(), label=name)
    refused(argv_with(command, name, value), _needles(command, name), capsys)


PLAN = BASES["plan"]
#: Options that contradict each other or do nothing in this plan: the flags named.
CONTRADICTIONS = [
    ([*PLAN, "--train", "--inference"], ("--inference",)),
    ([*PLAN, "--device-map"], ("--inference",)),
    ([*PLAN, "--offload-params"], ("--strategy",)),
    ([*PLAN, "--offload-optimizer"], ("--strategy",)),
    ([*PLAN, "--param-dtype", "bf16"], ("--param-dtype",)),
    ([*PLAN, "--quantize-head"], ("--quantize-head",)),
    ([*PLAN, "--no-double-quant"], ("--no-double-quant",)),
    ([*PLAN, "--bitsandbytes-version", "0.41.1"], ("--bitsandbytes-version",)),
    ([*PLAN, "--base-dtype", "bf16"], ("--base-dtype",)),
    ([*PLAN, "--dtype", "int8", "--inference", "--base-dtype", "fp16"], ("--base-dtype",)),
    ([*PLAN, "--bnb-compute-dtype", "fp32"], ("--bnb-compute-dtype",)),
    ([*PLAN, "--dtype", "nf4", "--bnb-compute-dtype", "fp32"], ("--bnb-compute-dtype",)),
    (
        [*PLAN, "--dtype", "int8", "--inference", "--bnb-compute-dtype", "fp32"],
        ("--bnb-compute-dtype",),
    ),
    ([*PLAN, "--gpus-per-node", "4"], ("--gpus-per-node",)),
    ([*PLAN, "--input-shape", "3,224,224"], ("--input-shape",)),
    ([*PLAN, "--seq", "99999"], ("--seq",)),
    ([*PLAN, "--trace", "--dtype", "int8", "--inference"], ("--trace",)),
    (["plan", "gpt2"], ("--gpu",)),
    (["models", "--search", "zzqq"], ("--search", "zzqq")),
]


@pytest.mark.parametrize(("argv", "needles"), CONTRADICTIONS, ids=lambda x: " ".join(x)[5:60])
def test_contradictory_options_exit_2_naming_the_flags(argv, needles, capsys):
    refused(argv, needles, capsys)
