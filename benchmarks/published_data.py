"""Published GPU memory measurements, read from ``published_runs.toml`` and checked.

Each `Case` is one figure (or one fits / out-of-memory verdict) exactly as a public
source printed it, with the citation that lets anyone open the same text, the quantity
that was measured, the figure converted to bytes, and the run's setup as far as the
source states it. Nothing is estimated; a field the source does not give is None, and a
case whose setup is not fully stated (a missing sequence length, an unnamed statistic,
figures that contradict the stated config) has ``ambiguous=True`` and says why in
``notes``. ``benchmarks/published_sources.md`` describes every source.

The data file states each source once (``[sources.<key>]``: its citation, the setup
paragraphs its runs share, the fields all its runs have in common) and each run once
(``[[runs]]``, naming its source by key). `load` turns it back into `Case` objects and
refuses a record it cannot read: an unknown field, a missing one, a value of the wrong
type, an unknown source or setup, a field stated both by a run and by its source.

``PublishedData.cases`` and ``PublishedData.heldout`` split the runs: nothing may be
tuned on the held-out ones, which are all fully specified. Ambiguous cases are all in
``cases`` and are meant to be reported apart.

This module is pure data: it imports nothing from torchfit.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

#: The data file `load` reads by default.
DATA_FILE = Path(__file__).with_name("published_runs.toml")

MEASURED = frozenset(
    {
        "nvidia-smi",  # NVML / nvidia-smi "used" memory: the whole device, context included
        "max_memory_allocated",  # torch.cuda.max_memory_allocated()
        "max_memory_reserved",  # torch.cuda.max_memory_reserved()
        "active_bytes.all.peak",  # torch.cuda.memory_stats()["active_bytes.all.peak"]
        "torch.cuda.memory_allocated",  # current allocation at one point in time
        "unspecified peak",  # a peak whose statistic the source does not name
        "fits",  # verdict: the run completed on the named card
        "oom",  # verdict: the run ran out of memory on the named card
    }
)
MODES = frozenset({"train", "inference"})
METHODS = frozenset({"full", "lora", "qlora", "inference"})
VERDICTS = frozenset({"fits", "oom"})

#: Units a run's ``figure`` is given in: the divisor the source's printing code used.
#: ``GB`` / ``MB`` are powers of ten; ``GiB`` / ``MiB`` (an ``MB`` printed from
#: ``x // 1024**2`` is MiB) powers of two; ``B`` is a byte count as logged.
UNITS: Mapping[str, int] = {"B": 1, "MB": 10**6, "MiB": 2**20, "GB": 10**9, "GiB": 2**30}


@dataclasses.dataclass(frozen=True)
class Case:
    """One published measurement or verdict and the setup it was taken under."""

    key: str
    source: str
    quote: str
    measured: str
    value_bytes: int | None
    model: str
    mode: str
    method: str
    precision: str | None
    gpu: str | None
    ambiguous: bool
    notes: str
    params: int | None = None
    optimizer: str | None = None
    batch_size: int | None = None
    seq_len: int | None = None
    gradient_accumulation_steps: int | None = None
    gradient_checkpointing: bool | None = None
    attention: str | None = None
    lora: str | None = None
    other_tricks: tuple[str, ...] = ()
    framework: str | None = None
    cuda_torch: str | None = None
    #: Inference by ``generate``: tokens generated after a prompt of ``seq_len - new_tokens``.
    new_tokens: int | None = None
    #: The heading the report groups this case under (its source's ``publication``).
    publication: str = ""
    #: The key of its ``[sources.<key>]`` table.
    source_key: str = ""
    #: A maximum-context table's row: ``fits`` at ``seq_len``, the longest length that fit
    #: on ``gpu``, or ``oom`` without a ``seq_len``, none of the lengths tried fitting.
    longest: bool = False

    def __post_init__(self) -> None:
        """Refuse a case that names an unknown quantity, mode or method, or lacks a citation."""
        checks = (
            (
                self.measured not in MEASURED,
                f"measured={self.measured!r} is not one of {sorted(MEASURED)}",
            ),
            (self.mode not in MODES, f"mode={self.mode!r} is not one of {sorted(MODES)}"),
            (self.method not in METHODS, f"method={self.method!r} is not one of {sorted(METHODS)}"),
            (
                (self.mode == "inference") != (self.method == "inference"),
                f"mode {self.mode!r} does not go with method {self.method!r}",
            ),
            (not self.key.strip(), "the key is empty"),
            (not self.source.strip(), "the citation (source) is missing"),
            (not self.quote.strip(), "the quote is missing"),
            (
                (self.measured in VERDICTS) != (self.value_bytes is None),
                "a verdict carries no figure and a measured quantity needs value_bytes",
            ),
            (self.value_bytes is not None and self.value_bytes <= 0, "value_bytes must be > 0"),
            (self.ambiguous and not self.notes.strip(), "an ambiguous case must say why in notes"),
            (
                self.measured in VERDICTS and not self.gpu,
                "a verdict needs the card it was reached on",
            ),
            (
                self.longest
                and (self.measured, self.seq_len is None) not in {("fits", False), ("oom", True)},
                (
                    "longest = true marks a 'fits' verdict at the longest seq_len that fit, "
                    "or an 'oom' verdict without seq_len (no length fit)"
                ),
            ),
        )
        problems = [message for failed, message in checks if failed]
        if problems:
            raise ValueError(f"published case {self.key!r}: " + "; ".join(problems))


@dataclasses.dataclass(frozen=True)
class Source:
    """One publication, as its ``[sources.<key>]`` table states it."""

    key: str
    publication: str
    title: str
    url: str
    citation: str
    date: str | None = None
    #: Setup paragraphs its runs share, by name; a run names one and its notes end with it.
    setups: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: The recipe its runs' settings state: the documented file or page, at a version.
    recipe: str | None = None
    #: What of that recipe torchfit cannot express (its runs say so, not a fudged figure).
    not_modelled: str | None = None


@dataclasses.dataclass(frozen=True)
class PublishedData:
    """Every source and run of the data file, the runs split for tuning and held out."""

    sources: Mapping[str, Source]
    cases: tuple[Case, ...]
    heldout: tuple[Case, ...]


_STR, _INT, _BOOL, _STRS = "a string", "an integer", "true or false", "a list of strings"
_TABLE, _LIST = "a table", "a list of tables"

#: Every field a ``[[runs]]`` record may hold, with its TOML type.
RUN_FIELDS: Mapping[str, str] = {
    "key": _STR,
    "source": _STR,
    "heldout": _BOOL,
    "setup": _STR,
    "quote": _STR,
    "measured": _STR,
    "figure": _STR,
    "unit": _STR,
    "model": _STR,
    "mode": _STR,
    "method": _STR,
    "precision": _STR,
    "optimizer": _STR,
    "batch_size": _INT,
    "seq_len": _INT,
    "new_tokens": _INT,
    "gradient_accumulation_steps": _INT,
    "gradient_checkpointing": _BOOL,
    "attention": _STR,
    "lora": _STR,
    "other_tricks": _STRS,
    "gpu": _STR,
    "framework": _STR,
    "cuda_torch": _STR,
    "params": _INT,
    "longest": _BOOL,
    "ambiguous": _BOOL,
    "notes": _STR,
}
#: Run fields a source may not share: what makes each run its own.
_OWN = frozenset({"key", "source", "heldout", "setup", "quote", "figure", "unit", "notes"})
_REQUIRED_RUN = ("key", "source", "quote", "measured", "model", "mode", "method")
SOURCE_FIELDS: Mapping[str, str] = {
    "publication": _STR,
    "title": _STR,
    "url": _STR,
    "date": _STR,
    "citation": _STR,
    "setups": _TABLE,
    "shared": _TABLE,
    "recipe": _STR,
    "not_modelled": _STR,
}
_REQUIRED_SOURCE = ("publication", "title", "url", "citation")


_TYPES = {
    _STR: lambda value: isinstance(value, str),
    _INT: lambda value: isinstance(value, int) and not isinstance(value, bool),
    _BOOL: lambda value: isinstance(value, bool),
    _STRS: lambda value: isinstance(value, list) and all(isinstance(v, str) for v in value),
    _TABLE: lambda value: isinstance(value, dict),
    _LIST: lambda value: isinstance(value, list) and all(isinstance(v, dict) for v in value),
}


def _short(value: object) -> str:
    """``repr(value)``, cut to one line of an error message."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_fields(
    record: Mapping[str, Any], fields: Mapping[str, str], required: tuple[str, ...], where: str
) -> None:
    """Raise ValueError naming ``where`` for an unknown, missing or mistyped field."""
    unknown = sorted(set(record) - set(fields))
    if unknown:
        raise ValueError(
            f"{where}: unknown field(s) {unknown}; expected some of {sorted(fields)}; "
            "fix the spelling, or add the field to published_data and Case"
        )
    missing = [name for name in required if name not in record]
    if missing:
        raise ValueError(f"{where}: missing field(s) {missing}; each record needs {list(required)}")
    for name, value in record.items():
        if not _TYPES[fields[name]](value):
            raise ValueError(f"{where}: {name} = {_short(value)} should be {fields[name]}")


def _source(key: str, table: Mapping[str, Any], origin: str) -> tuple[Source, dict[str, Any]]:
    """The `Source` of one ``[sources.<key>]`` table and the run fields it shares."""
    where = f"{origin}: [sources.{key}]"
    if not isinstance(table, dict):
        # a bad record of the data file, refused like every other one
        raise ValueError(f"{where} should be a table, got {_short(table)}")  # noqa: TRY004
    _check_fields(table, SOURCE_FIELDS, _REQUIRED_SOURCE, where)
    setups = table.get("setups", {})
    _check_fields(setups, dict.fromkeys(setups, _STR), (), f"{where}.setups")
    shared = dict(table.get("shared", {}))
    shareable = {name: kind for name, kind in RUN_FIELDS.items() if name not in _OWN}
    _check_fields(shared, shareable, (), f"{where}.shared")
    return (
        Source(
            key,
            publication=table["publication"],
            title=table["title"],
            url=table["url"],
            citation=table["citation"],
            date=table.get("date"),
            setups=setups,
            recipe=table.get("recipe"),
            not_modelled=table.get("not_modelled"),
        ),
        shared,
    )


def _value_bytes(run: Mapping[str, Any], where: str) -> int | None:
    """``figure`` in ``unit`` as bytes (truncated, as the figure was printed); None for neither."""
    if ("figure" in run) != ("unit" in run):
        raise ValueError(f"{where}: figure and unit go together; give both or (a verdict) neither")
    if "figure" not in run:
        return None
    if run["unit"] not in UNITS:
        raise ValueError(f"{where}: unit {run['unit']!r} is not one of {list(UNITS)}")
    try:
        number = Decimal(run["figure"])
    except InvalidOperation:
        raise ValueError(f"{where}: figure {run['figure']!r} is not a number") from None
    return int(number * UNITS[run["unit"]])


def _case(
    run: Mapping[str, Any],
    index: int,
    sources: Mapping[str, tuple[Source, dict[str, Any]]],
    origin: str,
) -> Case:
    """The `Case` one ``[[runs]]`` record describes, its source's shared fields merged in."""
    where = f"{origin}: run {run.get('key', '?')!r} (runs[{index}])"
    _check_fields(run, RUN_FIELDS, ("key", "source"), where)
    if run["source"] not in sources:
        raise ValueError(
            f"{where}: source {run['source']!r} is not defined; defined sources: "
            f"{sorted(sources)}; fix the key or add a [sources.{run['source']}] table"
        )
    source, shared = sources[run["source"]]
    twice = sorted(set(run) & set(shared))
    if twice:
        raise ValueError(
            f"{where}: {twice} stated by the run and by [sources.{source.key}.shared]; "
            "keep one (the source's value holds for every run of it)"
        )
    fields = {**shared, **run}
    _check_fields(fields, RUN_FIELDS, _REQUIRED_RUN, where)
    notes = fields.get("notes", "")
    if "setup" in fields:
        if fields["setup"] not in source.setups:
            raise ValueError(
                f"{where}: setup {fields['setup']!r} is not one of [sources.{source.key}.setups]"
                f" {sorted(source.setups)}"
            )
        setup = source.setups[fields["setup"]]
        notes = f"{notes} {setup}" if notes else setup
    plain = {k: v for k, v in fields.items() if k not in _OWN and k != "other_tricks"}
    try:
        return Case(
            key=fields["key"],
            source=source.citation,
            quote=fields["quote"],
            value_bytes=_value_bytes(fields, where),
            notes=notes,
            other_tricks=tuple(fields.get("other_tricks", ())),
            publication=source.publication,
            source_key=source.key,
            **{"precision": None, "gpu": None, "ambiguous": False, **plain},
        )
    except ValueError as error:  # Case's own checks: name the record in the file too
        raise ValueError(f"{where}: {error}") from error


def parse(document: Mapping[str, Any], *, origin: str = "<data>") -> PublishedData:
    """Check a parsed data file and turn it into `Case` objects.

    Args:
        document: the file as ``tomllib`` reads it: ``sources`` and ``runs``.
        origin: where it came from, for error messages.

    Returns:
        The sources by key, and the runs split into tuning and held-out cases.

    Raises:
        ValueError: a record the loader cannot read, naming the record and the fix.

    Example:
        >>> data = parse({"sources": {}, "runs": []})
        >>> data.cases, data.heldout
        ((), ())
    """
    _check_fields(document, {"sources": _TABLE, "runs": _LIST}, ("sources", "runs"), origin)
    sources = {key: _source(key, table, origin) for key, table in document["sources"].items()}
    cases, heldout, seen = [], [], set()
    for index, run in enumerate(document["runs"]):
        case = _case(run, index, sources, origin)
        if case.key in seen:
            raise ValueError(f"{origin}: run key {case.key!r} appears twice; keys must be unique")
        seen.add(case.key)
        if run.get("heldout", False):
            if case.ambiguous:
                raise ValueError(
                    f"{origin}: run {case.key!r} is held out but ambiguous; "
                    "held-out runs must be fully specified"
                )
            heldout.append(case)
        else:
            cases.append(case)
    return PublishedData({k: s for k, (s, _) in sources.items()}, tuple(cases), tuple(heldout))


def loads(text: str, *, origin: str = "<string>") -> PublishedData:
    """`parse` TOML text (a syntax error names ``origin`` too)."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{origin}: not valid TOML: {error}") from error
    return parse(document, origin=origin)


def load(path: Path = DATA_FILE) -> PublishedData:
    """Read and check the data file (by default ``benchmarks/published_runs.toml``)."""
    return loads(path.read_text(encoding="utf-8"), origin=path.name)
