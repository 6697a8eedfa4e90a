"""`StepFields`: what a framework's settings say about a `Step`, and `merge_fields`."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from torchfit._core.optimizers import parse_optimizer
from torchfit._core.step import parse_precision_name
from torchfit._core.units import parse_dtype

__all__ = [
    "FieldsRead",
    "NotModelledWarning",
    "StepFields",
    "made_from",
    "merge_fields",
    "step_field",
]


def step_field(*, default: Any, help: str, flag: str | None = None, kind: str = "") -> Any:  # noqa: A002
    """A `Step` field with its command-line flag (None: not a flag), kind and help."""
    return dataclasses.field(default=default, metadata={"flag": flag, "help": help, "kind": kind})


_Made = TypeVar("_Made")


class NotModelledWarning(UserWarning):
    """A setting that changes memory and that the estimate does not model (`StepFields.notes`)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepFields:
    """What a framework's settings say about a `Step`.

    Attributes:
        source: The object read, as messages name it (``"TrainingArguments"``).
        fields: `Step` fields and their values.
        read_from: For each field, the setting it was read from (``"bf16=True"``).
        agrees: For a field, the other values a caller may give without contradicting the
            settings (``"bf16-true"`` for ``bf16=True``: a model loaded in bf16).
        unsupported: Fields whose setting has no `Step` value, with the reason;
            `merge_fields` raises it unless the caller gives the field.
        notes: Settings that change memory and are not modelled, in words.
        defaults: The fields are a recipe's defaults that a caller changes freely (a
            recipe written in code): a given field replaces one, it cannot contradict it.
    """

    source: str
    fields: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    read_from: Mapping[str, str] = dataclasses.field(default_factory=dict)
    agrees: Mapping[str, tuple[Any, ...]] = dataclasses.field(default_factory=dict)
    unsupported: Mapping[str, str] = dataclasses.field(default_factory=dict)
    notes: tuple[str, ...] = ()
    defaults: bool = False

    def warn(self, *, stacklevel: int = 1) -> None:
        """Emit each note as a `NotModelledWarning`.

        ``stacklevel=1`` names the line that calls `warn`; a constructor that calls it for
        its caller passes 2.
        """
        for note in self.notes:
            warnings.warn(f"{self.source}: {note}", NotModelledWarning, stacklevel=stacklevel + 1)


@dataclasses.dataclass
class FieldsRead:
    """A `StepFields` as a reader collects it: each field with the setting it came from."""

    fields: dict[str, Any] = dataclasses.field(default_factory=dict)
    read_from: dict[str, str] = dataclasses.field(default_factory=dict)
    unsupported: dict[str, str] = dataclasses.field(default_factory=dict)
    notes: list[str] = dataclasses.field(default_factory=list)

    def set(self, setting: str, **fields: Any) -> None:
        """``fields`` read from ``setting`` (the words a contradiction error quotes)."""
        self.fields.update(fields)
        self.read_from.update(dict.fromkeys(fields, setting))

    def done(self, source: str, *, defaults: bool = False) -> StepFields:
        """The collected fields as the `StepFields` of ``source``."""
        return StepFields(
            defaults=defaults,
            source=source,
            fields=self.fields,
            read_from=self.read_from,
            unsupported=self.unsupported,
            notes=tuple(self.notes),
        )


def _canonical(name: str, value: Any) -> Any:
    """A field's value as `Step` would hold it, for comparing two spellings of it."""
    try:
        if name == "precision" and isinstance(value, str):
            return parse_precision_name(value).value
        if name == "optimizer" and (isinstance(value, str) or not callable(value)):
            return parse_optimizer(value).value
        if name in {"quantization", "base_dtype"} and isinstance(value, str):
            return parse_dtype(value).value
    except (TypeError, ValueError):
        return value  # `Step` refuses it with its own message
    return value


def merge_fields(derived: StepFields, given: Mapping[str, Any]) -> dict[str, Any]:
    """The `Step` keywords of ``derived`` and ``given`` together.

    A given field that the settings also name must agree: the same value in any spelling
    (``"adamw_torch_fused"`` is ``"adamw-fused"``), or one of ``derived.agrees``. An
    optimizer factory (a callable) is taken as given. A field in ``derived.unsupported``
    is refused unless given: the caller's value then stands for the setting.

    Args:
        derived: What the settings say (`training_arguments_fields`, `lightning_fields`).
        given: The fields the caller passes (``seq_len=2048``, ...).

    Returns:
        The keywords for ``Step.of``: ``derived.fields`` updated with ``given``.

    Raises:
        ValueError: a given field that contradicts the settings (both named), or a
            setting torchfit has no value for that the caller did not replace.

    Example:
        >>> read = StepFields(source="TrainingArguments", fields={"precision": "bf16-mixed"},
        ...                   read_from={"precision": "bf16=True"},
        ...                   agrees={"precision": ("bf16-true",)})
        >>> merge_fields(read, {"seq_len": 2048, "precision": "bf16-true"})  # a bf16 model
        {'precision': 'bf16-true', 'seq_len': 2048}
        >>> merge_fields(read, {"precision": "32-true"})
        Traceback (most recent call last):
        ...
        ValueError: precision='32-true' contradicts the TrainingArguments, which says ...
    """
    for name, reason in derived.unsupported.items():
        if name not in given:
            raise ValueError(f"{derived.source}: {reason}")
    for name, value in given.items():
        if derived.defaults or name not in derived.fields:
            continue
        if name == "optimizer" and _is_factory(value):
            continue
        read = derived.fields[name]
        mine = _canonical(name, value)
        accepted = [_canonical(name, v) for v in (read, *derived.agrees.get(name, ()))]
        if mine not in accepted:
            also = [v for v in derived.agrees.get(name, ()) if v != read]
            alternatives = f" (or {', '.join(map(repr, also))})" if also else ""
            raise ValueError(
                f"{name}={value!r} contradicts the {derived.source}, which says {read!r}"
                f"{alternatives} ({derived.read_from[name]}); leave {name}= out to take that "
                f"value, change it in the {derived.source}, or make the step and then "
                f"step.replace({name}=...)"
            )
    return {**derived.fields, **given}


def _is_factory(value: Any) -> bool:
    """An optimizer factory (``lambda params: ...``), not a name or a built optimizer."""
    return callable(value) and not isinstance(value, str)


def made_from(make: Callable[..., _Made], read: StepFields, given: Mapping[str, Any]) -> _Made:
    """``make`` (``Step.of``) called with `merge_fields` of ``read`` and ``given``.

    The notes of ``read`` are then warned as `NotModelledWarning`, naming the line that
    called the ``Step.from_*`` constructor that called this.
    """
    step = make(**merge_fields(read, given))
    read.warn(stacklevel=3)
    return step
