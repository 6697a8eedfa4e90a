import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchfit._core.units import DType, format_bytes, parse_bytes, parse_dtype


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("12GB", 12 * 10**9),
        ("12 GiB", 12 * 2**30),
        ("12gib", 12 * 2**30),
        ("512MiB", 512 * 2**20),
        ("1.5 GiB", 3 * 2**29),
        ("100", 100),
        ("100 B", 100),
        ("2k", 2048),
        (12884901888, 12884901888),
        (1e9, 10**9),
    ],
)
def test_parse_bytes_accepts_common_spellings(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("bad", ["-3GB", "twelve", "12 XB", "", "1e3GB", "nan"])
def test_parse_bytes_rejects_nonsense_with_the_value(bad):
    with pytest.raises(ValueError, match=r"size|unit"):
        parse_bytes(bad)


@pytest.mark.parametrize("bad", [-1, float("inf"), float("nan")])
def test_parse_bytes_rejects_bad_numbers(bad):
    with pytest.raises(ValueError, match=">= 0"):
        parse_bytes(bad)


@pytest.mark.parametrize("bad", [None, [12], True])
def test_parse_bytes_rejects_other_types(bad):
    with pytest.raises(TypeError, match="12GB"):
        parse_bytes(bad)


@given(
    st.integers(min_value=0, max_value=2**50), st.sampled_from(["KiB", "MiB", "GiB", "KB", "MB"])
)
@settings(max_examples=200, deadline=None)
def test_parse_bytes_units_scale_exactly(number, unit):
    factor = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "KB": 10**3, "MB": 10**6}[unit]
    assert parse_bytes(f"{number}{unit}") == number * factor
    assert parse_bytes(f"{number} {unit.lower()}") == number * factor


@given(st.integers(min_value=0, max_value=2**45))
@settings(max_examples=200, deadline=None)
def test_format_bytes_round_trips_within_display_precision(num):
    text = format_bytes(num)
    value, unit = text.split()
    back = parse_bytes(f"{value}{unit}")
    # three significant digits shown, and parse_bytes rounds down to a whole byte
    assert abs(back - num) <= num * 0.005 + 1


@pytest.mark.parametrize(
    ("value", "expected", "bits"),
    [
        ("bf16", DType.BF16, 16),
        ("bfloat16", DType.BF16, 16),
        (torch.bfloat16, DType.BF16, 16),
        ("torch.float16", DType.FP16, 16),
        ("half", DType.FP16, 16),
        ("FP32", DType.FP32, 32),
        (torch.float32, DType.FP32, 32),
        ("nf4", DType.NF4, 4),
        ("int4", DType.INT4, 4),
        ("int8", DType.INT8, 8),
        ("fp8", DType.FP8, 8),
        (DType.FP4, DType.FP4, 4),
    ],
)
def test_parse_dtype(value, expected, bits):
    parsed = parse_dtype(value)
    assert parsed is expected
    assert parsed.bits == bits


def test_parse_dtype_rejects_unknown_names_listing_choices():
    with pytest.raises(ValueError, match=r"'int3'.*bf16"):
        parse_dtype("int3")
    with pytest.raises(ValueError, match="complex64"):
        parse_dtype(torch.complex64)
    with pytest.raises(TypeError, match="bf16"):
        parse_dtype(16)  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_dtype_itemsize_matches_torch(dtype):
    assert parse_dtype(dtype).itemsize == torch.empty((), dtype=dtype).element_size()
    assert parse_dtype(dtype).torch_dtype == dtype


def test_quantized_flags():
    assert {d for d in DType if d.is_quantized} == {DType.INT8, DType.INT4, DType.NF4, DType.FP4}
