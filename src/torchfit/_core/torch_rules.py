"""What autograd keeps for backward that changed between torch releases.

A step's saved tensors are torch's choice, and torch has changed its mind:

- **Before 2.2, ``torch.mean`` kept its input.** ``MeanBackward`` saved ``self`` to read
  its element count (``_saved_self`` on the node); PyTorch pull 109935 ("Avoid saving
  `self` for mean.backward", merged September 2023, fixing issue 109876) saves the count
  instead, first released in 2.2.0 (January 2024). An RMSNorm computes
  ``x.pow(2).mean(-1)``, so on torch 2.1 every RMSNorm kept ``x²`` besides ``x``:
  transformers' (which squares in fp32) 4 bytes per hidden unit per token, Lit-GPT's
  (which squared in the weights' dtype at the time) 2. Measured with Lit-GPT's LoRA
  ``GPT`` at commit 8641822 in bf16 on the CPU: 44.29 bytes per token per hidden unit
  per layer saved under torch 2.1.0, 40.29 under 2.13.0, the difference two
  ``MeanBackward1._saved_self`` of the hidden size per layer.

`torch_rules` reads a version (``None``: the installed torch); `mean_keeps_input` says
whether it keeps a mean's input; `autograd_of` runs a trace or meta-device pass as that
version would keep its tensors, where the installed torch keeps fewer.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["MEAN_KEEPS_INPUT_BEFORE", "autograd_of", "mean_keeps_input", "torch_version"]

#: torch stopped keeping ``torch.mean``'s input for backward in 2.2.0 (module notes).
MEAN_KEEPS_INPUT_BEFORE = (2, 2, 0)


def torch_version(version: str | None = None) -> tuple[int, int, int]:
    """``(major, minor, patch)`` of a torch version string; ``None`` reads the installed one.

    Raises:
        TypeError: not a string (or None).
        ValueError: a string without a version number; the message shows the form.

    Example:
        >>> torch_version("2.1.0+cu121"), torch_version("2.2")
        ((2, 1, 0), (2, 2, 0))
    """
    if version is None:
        version = torch.__version__
    if not isinstance(version, str):
        raise TypeError(f"torch_version must be a string like '2.1.0'; got {version!r}")
    found = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", version.strip())
    if found is None:
        raise ValueError(f"cannot read the torch version {version!r}; pass it like '2.1.0'")
    major, minor, patch = found.groups()
    return int(major), int(minor), int(patch or 0)


def mean_keeps_input(version: str | None = None) -> bool:
    """Whether torch ``version`` keeps ``torch.mean``'s input for backward (module notes).

    Example:
        >>> mean_keeps_input("2.1.0"), mean_keeps_input("2.2.0"), mean_keeps_input("2.13.0")
        (True, False, False)
    """
    return torch_version(version) < MEAN_KEEPS_INPUT_BEFORE


class _KeepInput(torch.autograd.Function):
    """Pass ``out`` through, keeping ``kept`` until this node's backward (as a saved tensor)."""

    @staticmethod
    def forward(ctx: Any, out: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(kept)
        return out.view_as(out)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: ARG004
        return grad, None


_MEANS: frozenset[Callable[..., Any]] = frozenset({torch.mean, torch.Tensor.mean})


class _MeansKeepInputs(TorchFunctionMode):
    """Every ``torch.mean`` that autograd records keeps its input, as before torch 2.2."""

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        source = args[0] if args else None
        if (
            func in _MEANS
            and torch.is_grad_enabled()
            and isinstance(source, torch.Tensor)
            and isinstance(out, torch.Tensor)
            and source.requires_grad
        ):
            return _KeepInput.apply(out, source)  # type: ignore[no-untyped-call]
        return out


@contextlib.contextmanager
def autograd_of(version: str | None) -> Iterator[None]:
    """Run a step as torch ``version``'s autograd keeps tensors (module notes).

    Only what the installed torch keeps less of is added: a pass under torch 2.13 for a
    run on 2.1 keeps each mean's input; the other way round nothing changes.

    Example:
        >>> x = torch.ones(4, 8, requires_grad=True)
        >>> with autograd_of("2.1.0"):
        ...     y = x.pow(2).mean(-1)
        >>> [type(t).__name__ for t in (y.grad_fn,)]
        ['_KeepInputBackward']
    """
    if mean_keeps_input(version) and not mean_keeps_input(None):
        with _MeansKeepInputs():
            yield
    else:
        yield
