"""Catalog entries: the data file, `ModelEntry`, and forgiving name lookup.

Pure data: nothing here imports transformers until a config is asked for
(`ModelEntry.config`). The public names are re-exported by `torchfit.memory.catalog`.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import functools
import json
import re
from collections.abc import Iterable
from importlib import resources
from typing import TYPE_CHECKING, Any, cast

from torchfit._core import checks
from torchfit._core.imports import require

if TYPE_CHECKING:
    from types import ModuleType

    from transformers import PretrainedConfig

__all__ = ["ModelEntry", "ModelTask", "close_names", "list_models", "model_entry", "search_models"]

_FEATURE = "torchfit's model catalog (model_config, build_model)"
_DATA_FILE = "models.json"


class ModelTask(enum.StrEnum):
    """What a catalog model does, which decides the transformers class that is built."""

    CAUSAL_LM = "causal-lm"  # AutoModelForCausalLM: with the LM head
    ENCODER = "encoder"  # AutoModel: the base model, no task head
    SEQ2SEQ = "seq2seq"  # AutoModelForSeq2SeqLM: encoder, decoder and LM head (T5, BART)
    SPEECH = "speech-seq2seq"  # AutoModelForSpeechSeq2Seq: audio encoder, text decoder
    VISION = "vision"  # AutoModelForImageClassification (transformer backbone)
    CNN = "cnn"  # AutoModelForImageClassification (convolutional backbone)


def _parse_task(value: str | ModelTask) -> ModelTask:
    key = str(value).strip().lower().replace("_", "-").replace(" ", "-")
    aliases = {
        "causallm": "causal-lm",
        "lm": "causal-lm",
        "decoder": "causal-lm",
        "speech": "speech-seq2seq",
    }
    key = aliases.get(key, key)
    try:
        return ModelTask(key)
    except ValueError:
        names = ", ".join(repr(t.value) for t in ModelTask)
        raise ValueError(f"unknown model task {value!r}; expected one of {names}") from None


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    """One catalog model: what it is, where its numbers come from, how big it is.

    Attributes:
        name: Canonical catalog name (``"llama-2-7b"``).
        family: Model family (``"llama-2"``, ``"resnet"``).
        model_type: The transformers ``model_type`` (``"llama"``).
        task: What is built for it, see `ModelTask`.
        architecture: The transformers class that `build_model` builds and `params` counts.
        params: Exact number of distinct parameters of that class (tied weights once).
        source: Where the hyperparameters come from (a hub repo id's config.json, a paper).
        aliases: Other spellings that resolve to this entry (hub ids among them).
        dtype: dtype of the published weights (``"bfloat16"``), ``None`` when none is published.
        notes: Which head is counted and why `params` may differ from a published figure.
        config_json: The config as JSON text (use `config` or `config_dict`).
        builder: For a plain torch model (LeNet, AlexNet), the `CLASSICS` builder that
            makes it; ``None`` for transformers models.
        input_shape: One sample as the model expects it (vision models), or ``None``.

    Example:
        >>> entry = model_entry("mistral-7b")
        >>> entry.architecture, f"{entry.params:,}", entry.dtype
        ('MistralForCausalLM', '7,241,732,096', 'bfloat16')
        >>> entry.config_dict()["num_key_value_heads"]
        8
    """

    name: str
    family: str
    model_type: str
    task: ModelTask
    architecture: str
    params: int
    source: str
    aliases: tuple[str, ...] = ()
    dtype: str | None = None
    notes: str = ""
    config_json: str = dataclasses.field(default="{}", repr=False)
    builder: str | None = None
    input_shape: tuple[int, ...] | None = None

    def config_dict(self) -> dict[str, Any]:
        """The config as a fresh dict, as it would appear in ``config.json``."""
        data: dict[str, Any] = json.loads(self.config_json)
        return data

    def config(self) -> PretrainedConfig:
        """A new transformers config for this entry (needs ``torchfit[hf]``).

        Raises:
            ValueError: a plain torch model (``builder`` set) has no transformers config.
        """
        if self.builder is not None:
            raise ValueError(
                f"{self.name} is a plain torch model without a transformers config: "
                f"build_model({self.name!r}) builds it and estimate({self.name!r}, ...) "
                "plans it"
            )
        return _config_from_dict(self.config_dict())

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain Python values, the config as a dict."""
        data = dataclasses.asdict(self)
        data["task"] = self.task.value
        data["aliases"] = list(self.aliases)
        data["config"] = self.config_dict()
        data["input_shape"] = None if self.input_shape is None else list(self.input_shape)
        del data["config_json"]
        return data

    def __str__(self) -> str:
        """A two-column table of the entry."""
        rows = [
            ("family", f"{self.family} (transformers model_type {self.model_type!r})"),
            ("task", self.task.value),
            ("class", self.architecture),
            ("parameters", f"{self.params:,} ({_short_count(self.params)})"),
            ("weights dtype", self.dtype or "not published"),
            ("source", self.source),
            ("aliases", ", ".join(self.aliases) or "-"),
        ]
        width = max(len(label) for label, _ in rows)
        lines = [f"ModelEntry {self.name}"]
        lines += [f"  {label:<{width}}  {value}" for label, value in rows]
        if self.notes:
            lines.append(f"  note: {self.notes}")
        return "\n".join(lines)


def _short_count(count: int) -> str:
    for unit, size in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if count >= size:
            return f"{count / size:.2f}{unit}"
    return str(count)


def _normalize(text: str) -> str:
    """Lower case, letters and digits only: "Llama-2-7B", "llama_2_7b" -> "llama27b"."""
    return re.sub(r"[^0-9a-z]", "", text.lower())


def _entry_from_record(record: dict[str, Any]) -> ModelEntry:
    config = record.get("config", {})
    architecture = record["architecture"]
    shape = record.get("input_shape")
    if "builder" in record:
        config = {"model_type": "torch"}
    elif config.get("architectures") != [architecture]:
        raise ValueError(f"{_DATA_FILE}: {record['name']}: config.architectures != {architecture}")
    return ModelEntry(
        name=record["name"],
        family=record["family"],
        model_type=config["model_type"],
        task=ModelTask(record["task"]),
        architecture=architecture,
        params=int(record["params"]),
        source=record["source"],
        aliases=tuple(record.get("aliases", ())),
        dtype=config.get("dtype"),
        notes=record.get("notes", ""),
        config_json=json.dumps(config, sort_keys=True),
        builder=record.get("builder"),
        input_shape=None if shape is None else tuple(int(s) for s in shape),
    )


@functools.cache
def _catalog() -> tuple[tuple[ModelEntry, ...], dict[str, ModelEntry]]:
    """The entries in display order, and every normalized spelling -> its entry."""
    text = (
        resources.files("torchfit.memory.catalog").joinpath(_DATA_FILE).read_text(encoding="utf-8")
    )
    entries = [_entry_from_record(record) for record in json.loads(text)["models"]]
    entries.sort(key=lambda e: (e.family, e.params, e.name))
    index: dict[str, ModelEntry] = {}
    for entry in entries:
        for spelling in (entry.name, *entry.aliases):
            known = index.setdefault(_normalize(spelling), entry)
            if known is not entry:
                raise ValueError(
                    f"{_DATA_FILE}: {spelling!r} of {entry.name} reads like {known.name}"
                )
    return tuple(entries), index


@checks.arguments()
def list_models(*, task: str | ModelTask | None = None) -> list[ModelEntry]:
    """The catalog, sorted by family, then size; optionally only one task.

    Works without transformers installed.

    Example:
        >>> [e.name for e in list_models(task="cnn")][:3]
        ['alexnet', 'convnext-tiny', 'convnext-base']
        >>> print(list_models(task="encoder")[0])  # doctest: +ELLIPSIS
        ModelEntry bert-base
          family         bert (transformers model_type 'bert')
          task           encoder
          class          BertModel
          parameters     109,482,240 (109.48M)
        ...
    """
    entries, _ = _catalog()
    if task is None:
        return list(entries)
    wanted = _parse_task(task)
    return [entry for entry in entries if entry.task is wanted]


@checks.arguments(name=checks.model_name())
def model_entry(name: str | ModelEntry) -> ModelEntry:
    """Look a model up by name, forgivingly: case, ``-``/``_``/spaces/dots and hub ids.

    Args:
        name: A catalog name or alias: ``"llama-2-7b"``, ``"Llama-2-7B"``,
            ``"llama_2_7b"``, ``"meta-llama/Llama-2-7b-hf"``, ``"GPT-2"``.

    Returns:
        The catalog entry (works without transformers installed).

    Raises:
        TypeError: ``name`` is not a string.
        ValueError: the name matches no entry (the message lists close matches) or
            the start of several (the message lists them).

    Example:
        >>> model_entry("Llama-2-7B").params
        6738415616
        >>> model_entry("meta-llama/Llama-2-7b-hf").name
        'llama-2-7b'
        >>> model_entry("llama-2")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: 'llama-2' is ambiguous: it matches llama-2-7b, llama-2-13b, llama-2-70b; ...
    """
    if isinstance(name, ModelEntry):
        return name
    if not isinstance(name, str):
        raise TypeError(f"a model name must be a string such as 'gpt2'; got {type(name).__name__}")
    entries, index = _catalog()
    key = _normalize(name)
    if not key:
        raise ValueError(
            f"an empty model name ({name!r}); pass a catalog name such as 'llama-3.1-8b', a "
            "Hugging Face Hub id such as 'meta-llama/Llama-3.1-8B', or a config.json path"
        )
    if key in index:
        return index[key]
    starting = _distinct(index[k] for k in index if key and k.startswith(key))
    if len(starting) > 1:
        names = ", ".join(e.name for e in _in_catalog_order(starting))
        raise ValueError(f"{name!r} is ambiguous: it matches {names}; pass one of these names")
    suggestions = _suggestions(key, starting)
    hint = f"; close matches: {', '.join(e.name for e in suggestions)}" if suggestions else ""
    raise ValueError(
        f"unknown model {name!r}{hint}. Pass a catalog name (list_models() shows all "
        f"{len(entries)}), the path of a local config.json or of a folder holding one, or a "
        "transformers config object"
    )


def _suggestions(key: str, starting: list[ModelEntry]) -> list[ModelEntry]:
    index = _catalog()[1]
    close = _distinct(index[k] for k in difflib.get_close_matches(key, index, n=10, cutoff=0.6))
    return _distinct([*starting, *close])[:5]


def close_names(name: str, *, limit: int = 5) -> list[str]:
    """Catalog names close to ``name`` (a Hub id's model part counts): for error messages.

    Example:
        >>> close_names("meta-llama/Llama-3.1-8B-Instruct-XL")[:1]
        ['llama-3.1-8b']
    """
    index = _catalog()[1]
    found: list[ModelEntry] = []
    for part in (name, name.rpartition("/")[2]):
        key = _normalize(part)
        if key:
            starting = _distinct(index[k] for k in index if k.startswith(key))
            found += [*(e for e in _suggestions(key, starting) if e not in found)]
    return [e.name for e in found[:limit]]


def search_models(text: str) -> list[ModelEntry]:
    """Entries whose name, family, model type, class or aliases contain ``text``.

    Case, ``-``, ``_``, spaces and dots are ignored; an empty text gives every entry.

    Example:
        >>> [e.name for e in search_models("tinyllama")]
        ['tinyllama-1.1b']
    """
    key = _normalize(text)
    entries = _catalog()[0]

    def haystack(entry: ModelEntry) -> str:
        fields = (entry.name, entry.family, entry.model_type, entry.architecture, *entry.aliases)
        return " ".join(_normalize(field) for field in fields)

    return [entry for entry in entries if key in haystack(entry)]


def _distinct(entries: Iterable[ModelEntry]) -> list[ModelEntry]:
    out: list[ModelEntry] = []
    for entry in entries:
        if entry not in out:
            out.append(entry)
    return out


def _in_catalog_order(entries: list[ModelEntry]) -> list[ModelEntry]:
    order = {entry.name: i for i, entry in enumerate(_catalog()[0])}
    return sorted(entries, key=lambda e: order[e.name])


def _transformers() -> ModuleType:
    return require("transformers", feature=_FEATURE)


def _transformers_major(transformers: ModuleType) -> int:
    return int(str(transformers.__version__).split(".", 1)[0])


def _config_from_dict(data: dict[str, Any]) -> PretrainedConfig:
    transformers = _transformers()
    data = dict(data)
    model_type = data.pop("model_type")
    if _transformers_major(transformers) < 5 and "dtype" in data:
        data["torch_dtype"] = data.pop("dtype")  # transformers 4 names the field torch_dtype
    return cast("PretrainedConfig", transformers.CONFIG_MAPPING[model_type].from_dict(data))
