"""A probe leaves every global random stream where it was: torch, ``random``, NumPy."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch import nn

from torchfit._core.rng import kept_rng
from torchfit.memory import measure_step, trace
from torchfit.memory.tracing import trace_events


class Noisy(nn.Module):
    """Draws from every global generator in its forward, as augmentation code does."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 2)
        self.dropout = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = 1.0 + random.random() + float(np.random.rand())  # noqa: NPY002, S311
        return self.dropout(self.linear(x)) * scale


def _states() -> tuple[object, ...]:
    return random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state().tolist()  # noqa: NPY002


PROBES = {"trace": trace, "trace_events": trace_events, "measure_step": measure_step}


@pytest.mark.parametrize("probe", PROBES, ids=str)
def test_a_probe_leaves_random_numpy_and_torch_as_they_were(probe):
    random.seed(1)
    np.random.seed(1)  # noqa: NPY002
    torch.manual_seed(1)
    model, inputs = Noisy(), torch.randn(4, 8)
    before = _states()
    PROBES[probe](model, inputs, optimizer="adamw")
    assert _states() == before


def _draw_then_fail() -> None:
    with kept_rng():
        random.random(), np.random.rand(), torch.rand(1)  # noqa: NPY002, S311
        raise RuntimeError("inside")


def test_kept_rng_restores_after_an_error():
    before = _states()
    with pytest.raises(RuntimeError, match="inside"):
        _draw_then_fail()
    assert _states() == before
