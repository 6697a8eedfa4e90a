"""Name the first module whose forward output went inf/nan.

A probe watches the user's own forward pass with temporary forward hooks: it adds no
forward of its own (which would move BatchNorm statistics or RNG state) and removes
every hook on exit. Flags stay on the device as 0-d tensors until the answer is read,
so a watched forward costs a few small kernels per module and no synchronisation.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Any, Self

import torch
from torch import nn

from torchfit._core import checks

__all__ = ["NonFinite", "NonFiniteCause", "NonFiniteProbe", "find_nonfinite"]


class NonFiniteCause(enum.StrEnum):
    """Where the bad values came from, as far as one module can tell."""

    INPUT = "input"  # its inputs were already inf/nan: the cause is upstream, outside a module
    PARAMETER = "parameter"  # its own parameters or buffers hold inf/nan
    COMPUTED = "computed"  # finite inputs and weights: its own math overflowed


@dataclasses.dataclass(frozen=True)
class NonFinite:
    """The first module (in completion order) whose forward output held inf or nan.

    Modules finish before their parents, so this is the innermost module where the
    values appeared.

    Attributes:
        module: qualified name, as in ``model.named_modules()`` (``"(root)"`` for the model).
        module_type: the module's class name.
        has_nan: the output held nan.
        has_inf: the output held +inf or -inf.
        cause: `NonFiniteCause`.
        call: index of this forward call among all watched module calls (0-based).
    """

    module: str
    module_type: str
    has_nan: bool
    has_inf: bool
    cause: NonFiniteCause
    call: int

    def to_dict(self) -> dict[str, Any]:
        """Plain types only."""
        data = dataclasses.asdict(self)
        data["cause"] = str(self.cause)
        return data

    def __str__(self) -> str:
        """A small table naming the module and what went wrong."""
        values = " and ".join(v for v, on in (("nan", self.has_nan), ("inf", self.has_inf)) if on)
        rows = [
            ("module", f"{self.module} ({self.module_type})"),
            ("output", f"has {values}"),
            ("cause", str(self.cause)),
            ("call", str(self.call)),
        ]
        return "\n".join(["NonFinite"] + [f"  {name:<6}  {value}" for name, value in rows])


def _tensors(obj: object) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point() or obj.is_complex():
            yield obj
    elif isinstance(obj, Mapping):
        for value in obj.values():
            yield from _tensors(value)
    elif isinstance(obj, tuple | list):
        for value in obj:
            yield from _tensors(value)


def _fold(flags: Iterator[torch.Tensor]) -> torch.Tensor | None:
    """OR of 0-d bool tensors, on the first one's device; None for no flags."""
    folded: torch.Tensor | None = None
    for flag in flags:
        folded = flag if folded is None else folded | flag.to(folded.device)
    return folded


def _any_bad(tensors: Iterator[torch.Tensor]) -> torch.Tensor | None:
    return _fold(~torch.isfinite(t.detach()).all() for t in tensors)


@dataclasses.dataclass
class _Record:
    name: str
    module_type: str
    out_nan: torch.Tensor
    out_inf: torch.Tensor
    in_bad: torch.Tensor | None
    param_bad: torch.Tensor | None


def _to_bools(flags: list[torch.Tensor]) -> list[bool]:
    """Read many 0-d flags with one transfer per device."""
    by_device: dict[torch.device, list[int]] = {}
    for index, flag in enumerate(flags):
        by_device.setdefault(flag.device, []).append(index)
    out = [False] * len(flags)
    for indices in by_device.values():
        values = torch.stack([flags[i] for i in indices]).tolist()
        for index, value in zip(indices, values, strict=True):
            out[index] = bool(value)
    return out


class NonFiniteProbe:
    """Context manager returned by `find_nonfinite`; read `first` after the block."""

    @checks.arguments(model=checks.model())
    def __init__(self, model: nn.Module) -> None:
        """Watch ``model`` and all its submodules (hooks are added on ``__enter__``)."""
        if not isinstance(model, nn.Module):
            raise TypeError(f"find_nonfinite() takes an nn.Module; got {type(model).__name__}")
        self._model = model
        self._records: list[_Record] = []
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._first: NonFinite | None = None
        self._resolved = False

    def __enter__(self) -> Self:
        """Add one forward hook per module."""
        for name, module in self._model.named_modules():
            hook = self._make_hook(name or "(root)", type(module).__name__)
            self._handles.append(module.register_forward_hook(hook, with_kwargs=True))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Remove every hook this probe added (also when the block raised)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _make_hook(self, name: str, module_type: str) -> Any:
        def hook(module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            outs = [t.detach() for t in _tensors(output)]
            nan = _fold(torch.isnan(t).any() for t in outs)
            inf = _fold(torch.isinf(t).any() for t in outs)
            if nan is None or inf is None:  # no floating-point output to watch
                return
            own = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
            self._records.append(
                _Record(
                    name=name,
                    module_type=module_type,
                    out_nan=nan,
                    out_inf=inf,
                    in_bad=_any_bad(_tensors((args, kwargs))),
                    param_bad=_any_bad(_tensors(own)),
                )
            )

        return hook

    @property
    def first(self) -> NonFinite | None:
        """The first module whose output held inf/nan, or None if every output was finite.

        Reading it synchronises once with the device.
        """
        if not self._resolved:
            self._first = self._resolve()
            self._resolved = True
        return self._first

    def _resolve(self) -> NonFinite | None:
        if not self._records:
            return None
        outs = _to_bools(
            [torch.stack([r.out_nan, r.out_inf.to(r.out_nan.device)]).any() for r in self._records]
        )
        for call, (record, bad) in enumerate(zip(self._records, outs, strict=True)):
            if not bad:
                continue
            nan, inf = _to_bools([record.out_nan, record.out_inf])
            cause = NonFiniteCause.COMPUTED
            if record.in_bad is not None and _to_bools([record.in_bad])[0]:
                cause = NonFiniteCause.INPUT
            elif record.param_bad is not None and _to_bools([record.param_bad])[0]:
                cause = NonFiniteCause.PARAMETER
            return NonFinite(record.name, record.module_type, nan, inf, cause, call)
        return None

    def __repr__(self) -> str:
        """Where the probe stands."""
        state = "watching" if self._handles else f"{len(self._records)} calls recorded"
        return f"NonFiniteProbe({type(self._model).__name__}, {state})"


@checks.arguments(model=checks.model())
def find_nonfinite(model: nn.Module) -> NonFiniteProbe:
    """Watch ``model``'s forward passes and name the first module whose output went inf/nan.

    Use it around the forward that produced a non-finite loss (or a skipped step).
    Nothing of the model changes: the hooks are removed when the block ends.

    Args:
        model: the model to watch; every submodule gets a temporary forward hook.

    Returns:
        A context manager; after the block, ``probe.first`` is a `NonFinite` or None.

    Example:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Softplus())
        >>> with torch.no_grad():
        ...     _ = model[0].weight.fill_(3e38)
        >>> with find_nonfinite(model) as probe:
        ...     _ = model(torch.ones(1, 2))
        >>> probe.first.module, probe.first.has_inf, str(probe.first.cause)
        ('0', True, 'computed')
    """
    return NonFiniteProbe(model)
