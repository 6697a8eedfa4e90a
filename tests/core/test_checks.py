"""`torchfit._core.checks.arguments`: what it checks, what it passes on, where it is not."""

from __future__ import annotations

import numpy as np
import pytest

from torchfit._core import checks
from torchfit._core.units import format_bytes
from torchfit.memory.allocator import CachingAllocator, round_request, segment_size
from torchfit.memory.analytic import kv_cache_bytes


@checks.arguments(batch_size=checks.whole(at_least=1))
def _steps(batch_size: int, seq_len: int = 1, *, scale: float = 1.0) -> tuple[object, ...]:
    return batch_size, seq_len, scale


def test_positional_and_keyword_arguments_are_checked_and_normalized():
    assert _steps(np.int64(4), 8, scale=0.5) == (4, 8, 0.5)
    assert type(_steps(np.int64(4))[0]) is int
    with pytest.raises(ValueError, match="batch_size must be a whole number >= 1; got 0"):
        _steps(0)
    with pytest.raises(TypeError, match="seq_len must be a whole number; got '8'"):
        _steps(4, "8")
    with pytest.raises(ValueError, match="scale must be a finite number; got nan"):
        _steps(4, scale=float("nan"))


def test_a_call_that_does_not_fit_the_signature_names_the_function():
    with pytest.raises(TypeError, match=r"_steps\(\): too many positional arguments"):
        _steps(1, 2, 3)


def test_a_named_rule_decides_alone_so_one_parameter_has_one_message():
    # the type's own rule (whole >= 0) must not answer before the named one (>= 1)
    shape = {"batch_size": 1, "seq_len": 8, "num_layers": 2, "num_kv_heads": 2, "head_dim": 8}
    for bad in (-4, 0, "4"):
        with pytest.raises(
            (TypeError, ValueError), match="sliding_window must be a whole number >= 1"
        ):
            kv_cache_bytes(**shape, sliding_window=bad)


@pytest.mark.parametrize(
    "hot",
    [CachingAllocator.malloc, CachingAllocator.free, round_request, segment_size, format_bytes],
    ids=lambda f: f.__qualname__,
)
def test_per_event_functions_are_not_wrapped(hot):
    # an allocator replay calls these once per event: they check their own arguments
    # with plain isinstance tests, not through the decorator
    assert not hasattr(hot, "__wrapped__")


def test_per_event_functions_still_refuse_wrong_values_by_name():
    allocator = CachingAllocator()
    with pytest.raises(ValueError, match="nbytes must be >= 0"):
        allocator.malloc(-1)
    with pytest.raises(TypeError, match="nbytes must be an int"):
        allocator.malloc(2.5)
    for handle in (True, [0], "0"):
        with pytest.raises(TypeError, match="handle must be an int returned by malloc"):
            allocator.free(handle)
    with pytest.raises(ValueError, match="num_bytes must be a finite number; got nan"):
        format_bytes(float("nan"))
