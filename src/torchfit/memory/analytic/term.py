"""`Term`: one tensor (or several) a block saves for backward, in bytes per token.

The closed form sums terms into the activations of a step, and cuts them into the
tensors the kernels allocate for the step schedule (`torchfit.memory.analytic.outline`):
a term's ``pieces`` when it has them, else one tensor.
"""

from __future__ import annotations

import dataclasses

from torchfit.memory.analytic.formulas import FP32

__all__ = ["Term", "layer_norm", "pieces"]


@dataclasses.dataclass(frozen=True)
class Term:
    """One saved tensor (or group): a name and its bytes per token.

    ``pieces``: the group's tensors, bytes per token each (summing to ``per_token``), where
    the kernels allocate several apart; empty for one tensor.

    Example:
        >>> pieces("gate, act(gate), up", 8.0, 8.0, 8.0).per_token
        24.0
    """

    name: str
    per_token: float
    pieces: tuple[float, ...] = ()


def pieces(name: str, *tensors: float) -> Term:
    """A `Term` of several tensors, bytes per token each."""
    return Term(name, sum(tensors), tuple(tensors))


def layer_norm(name: str, width: float) -> Term:
    """A norm's saved input (``width`` bytes per token) and its fp32 mean and rstd."""
    return pieces(name, width, FP32, FP32)
