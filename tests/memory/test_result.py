import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchfit._core.units import format_bytes
from torchfit.memory import MemoryEstimate
from torchfit.memory.result import CATEGORIES, AffineEstimate, LayerMemory

byte_counts = st.integers(min_value=0, max_value=2**42)
estimates = st.builds(
    MemoryEstimate,
    **dict.fromkeys(CATEGORIES, byte_counts),
    context=st.integers(min_value=0, max_value=2**31),
)


@given(estimates)
@settings(max_examples=100, deadline=None)
def test_total_is_the_sum_of_the_categories(e):
    assert e.total == sum(value for _, value in e.items())
    assert e.device_total == e.total + e.context


@given(estimates, estimates)
@settings(max_examples=100, deadline=None)
def test_addition_is_fieldwise(a, b):
    c = a + b
    for name in CATEGORIES:
        assert getattr(c, name) == getattr(a, name) + getattr(b, name)
    assert c.total == a.total + b.total


@given(estimates, st.integers(min_value=0, max_value=64))
@settings(max_examples=100, deadline=None)
def test_integer_scaling_is_repeated_addition(e, k):
    scaled = e * k
    summed = MemoryEstimate()
    for _ in range(k):
        summed = summed + e
    assert scaled.total == summed.total == k * e.total
    assert (k * e).total == scaled.total


def test_reserved_and_context_in_device_total():
    e = MemoryEstimate(weights=100, reserved=2048, context=1000)
    assert e.device_total == 3048
    # reserved can never be below what is allocated
    assert MemoryEstimate(weights=5000, reserved=10).device_total == 5000


@pytest.mark.parametrize("name", [*CATEGORIES, "context"])
def test_negative_or_non_int_bytes_are_rejected(name):
    with pytest.raises(ValueError, match=f"{name} must be >= 0"):
        MemoryEstimate(**{name: -1})
    with pytest.raises(TypeError, match=f"{name} must be an int"):
        MemoryEstimate(**{name: 1.5})


def test_str_is_a_table_in_binary_units_and_to_dict_has_totals():
    e = MemoryEstimate(
        weights=3 * 2**30,
        activations=512 * 2**20,
        context=300 * 2**20,
        notes=("sdpa: flash",),
        peak_at="backward",
    )
    text = str(e)
    assert "weights" in text and "3.00 GiB" in text and "512.00 MiB" in text
    assert "sdpa: flash" in text and "backward" in text
    assert "gradients" not in text  # zero rows are left out
    d = e.to_dict()
    assert d["total"] == e.total and d["device_total"] == e.device_total
    assert d["notes"] == ["sdpa: flash"]


def test_estimates_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        MemoryEstimate().weights = 3  # type: ignore[misc]


def test_layer_rows_scale_and_sort():
    e = MemoryEstimate(
        activations=30,
        layers=(LayerMemory("a", "Conv2d", 10), LayerMemory("b", "ReLU", 20, "mask")),
    )
    table = (e * 2).layer_table()
    assert table.index("b") < table.index("a")
    assert "40 B" in table


@given(
    byte_counts,
    st.integers(min_value=1, max_value=2**30),
    st.integers(min_value=0, max_value=2**44),
)
@settings(max_examples=200, deadline=None)
def test_affine_batch_within_is_the_largest_that_fits(fixed, per, budget):
    line = AffineEstimate(MemoryEstimate(weights=fixed), MemoryEstimate(activations=per))
    n = line.batch_within(budget)
    if fixed > budget:
        assert n == 0
    else:
        assert line.at(n).total <= budget < line.at(n + 1).total


def test_affine_rejects_flat_lines():
    line = AffineEstimate(MemoryEstimate(weights=1), MemoryEstimate())
    with pytest.raises(ValueError, match="does not grow"):
        line.batch_within(100)


@pytest.mark.parametrize("how", ["estimate", "trace", "activation_bytes"])
def test_a_lazy_module_not_run_yet_is_refused_with_the_fix(how):
    from torchfit.memory import activation_bytes, estimate, trace

    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LazyLinear(4))
    call = {
        "estimate": lambda: estimate(model, input_shape=(3,), batch_size=2),
        "trace": lambda: trace(model, torch.randn(2, 3)),
        "activation_bytes": lambda: activation_bytes(model, torch.randn(2, 3)),
    }[how]
    message = r"'1\.weight' of LazyLinear is not initialized.*model\(x\)"
    with pytest.raises(ValueError, match=message):
        call()
    model(torch.randn(2, 3))  # materialized: now it works
    assert call() is not None


@given(estimates)
@settings(max_examples=50, deadline=None)
def test_repr_is_one_line_with_the_peak_and_str_the_table(e):
    e = e.replace(peak_at="start of backward", notes=("a note " * 50,) * 20)
    line = repr(e)
    assert "\n" not in line and len(line) < 150
    assert line.startswith(f"<MemoryEstimate (cuda): {format_bytes(e.total)} allocated at the peak")
    assert "(start of backward)" in line
    assert f"; {format_bytes(e.device_total)} on the device>" in line or not e.context
    assert str(e).count("\n") > 20  # the full table with every note


def test_repr_of_a_cpu_estimate_has_no_device_view():
    e = MemoryEstimate(weights=2**20, device="cpu")
    assert repr(e) == "<MemoryEstimate (cpu): 1.00 MiB allocated at the peak>"
