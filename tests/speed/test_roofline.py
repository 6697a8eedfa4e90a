"""The roofline: more work never takes less time; the curves meet their published points."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torchfit.memory import gpu
from torchfit.speed.cards import peaks
from torchfit.speed.curves import HOPPER_MEMORY, attention_efficiency, matmul_fit
from torchfit.speed.ops import Op, OpKind, Phase
from torchfit.speed.roofline import kernel_seconds, math_of

H200 = peaks(gpu("H200"))
dims = st.integers(min_value=1, max_value=16384)


def _matmul(m, n, k, dtype="bf16"):
    size = 2 if dtype != "fp32" else 4
    moved = float((m * k + k * n + m * n) * size)
    return Op("mm", OpKind.MATMUL, Phase.FORWARD, 2.0 * m * n * k, moved, dtype, (1, m, n, k))


@settings(max_examples=200, deadline=None)
@given(m=dims, n=dims, k=dims, grow=st.integers(min_value=1, max_value=8))
def test_a_bigger_matmul_never_takes_less_time(m, n, k, grow):
    small = kernel_seconds(_matmul(m, n, k), H200, hopper=True)
    assert kernel_seconds(_matmul(m * grow, n, k), H200, hopper=True) >= small
    assert kernel_seconds(_matmul(m, n, k * grow), H200, hopper=True) >= small


@settings(max_examples=200, deadline=None)
@given(m=dims, n=dims, k=dims)
def test_no_matmul_beats_the_peak_and_fp32_is_slower(m, n, k):
    op = _matmul(m, n, k)
    seconds = kernel_seconds(op, H200, hopper=True)
    assert op.flops / seconds <= H200.dense_peak("bf16")
    assert kernel_seconds(_matmul(m, n, k, "fp32"), H200, hopper=True) > seconds


@settings(max_examples=200, deadline=None)
@given(a=st.floats(min_value=0, max_value=1e11), b=st.floats(min_value=0, max_value=1e11))
def test_memory_bound_time_grows_with_bytes(a, b):
    low, high = sorted((a, b))
    ops = [Op("add", OpKind.MEMORY, Phase.FORWARD, 0.0, x, "bf16") for x in (low, high)]
    assert kernel_seconds(ops[0], H200, hopper=True) <= kernel_seconds(ops[1], H200, hopper=True)


@settings(max_examples=100, deadline=None)
@given(seq=st.integers(min_value=16, max_value=65536), dim=st.sampled_from([32, 64, 96, 128]))
def test_attention_efficiency_rises_with_sequence_and_stays_below_one(seq, dim):
    kw = {"backward": False, "causal": True, "head_dim": dim, "hopper": True, "backend": "flash"}
    assert 0 < attention_efficiency(seq=seq, **kw) <= attention_efficiency(seq=seq * 2, **kw) < 1


@pytest.mark.parametrize(
    ("m", "n", "k", "published"),
    [(4096, 4096, 4096, 783.3), (2048, 2048, 2048, 632.0), (1024, 2048, 2048, 524.3)],
)
def test_matmul_curve_within_fifteen_percent_of_xla_h100_points(m, n, k, published):
    h100 = peaks(gpu("H100"))
    fit = matmul_fit("bf16")
    moved = 2.0 * (m * k + k * n + m * n)
    seconds = fit.seconds(
        2.0 * m * n * k, moved, peak=989.5e12, bandwidth=h100.bandwidth_gb_s * 1e9, mamf=0.803
    )
    assert 2.0 * m * n * k / seconds / 1e12 == pytest.approx(published, rel=0.15)


def test_attention_meets_the_fa3_papers_fa2_points():
    kw = {"causal": False, "hopper": True, "backend": "flash"}
    fwd = attention_efficiency(backward=False, head_dim=128, seq=2048, **kw) * 989.5
    bwd = attention_efficiency(backward=True, head_dim=64, seq=8192, **kw) * 989.5
    assert (round(fwd), round(bwd)) == (362, 287)


@pytest.mark.parametrize(
    ("card", "share"),
    [("H200", 0.75), ("A100 80GB", 0.75), ("RTX 4090", 0.60), ("RTX A6000", 0.60)],
)
def test_fp32_ceiling_follows_the_sm_design(card, share):
    assert peaks(gpu(card)).sgemm == share


def test_fp32_sgemm_on_an_h100_class_card_meets_the_published_point():
    # cublasSgemm 50.5 TFLOP/s at 8192³ on an H100 SXM (module notes of cards.py)
    op = _matmul(8192, 8192, 8192, "fp32")
    tflops = op.flops / kernel_seconds(op, H200, hopper=True) / 1e12
    assert tflops == pytest.approx(50.5, rel=0.1)


def test_fp32_attention_runs_three_tf32_products_from_ampere_on():
    shape = (8, 12, 1024, 1024, 64, 1)
    op = Op(
        "_efficient_attention",
        OpKind.ATTENTION,
        Phase.FORWARD,
        1e12,
        1e8,
        "fp32",
        shape,
        "efficient",
    )
    assert math_of(op, H200) == "3xtf32" and math_of(op, peaks(gpu("V100 16GB"))) == "fp32"
    assert H200.dense_peak("3xtf32") == pytest.approx(H200.dense_peak("tf32") / 3)
    assert H200.dense_peak("3xtf32") > H200.dense_peak("fp32")


def test_an_nchw_convolution_on_tensor_cores_pays_two_transposes():
    shape = (1, 64 * 56 * 56, 64, 576)
    flops, moved = 2.0 * 64 * 56 * 56 * 64 * 576, 4.0 * 64 * 64 * 56 * 56
    nhwc = Op("convolution", OpKind.CONV, Phase.FORWARD, flops, moved, "bf16", (*shape, 0))
    nchw = Op("convolution", OpKind.CONV, Phase.FORWARD, flops, moved, "bf16", (*shape, 1 << 28))
    extra = kernel_seconds(nchw, H200, hopper=True) - kernel_seconds(nhwc, H200, hopper=True)
    # 256 MiB read and written once more by two memory-bound kernels on Hopper's curve
    transpose = HOPPER_MEMORY.seconds(1 << 28, H200.bandwidth_gb_s * 1e9)
    assert extra == pytest.approx(2 * transpose)
    # fp32 on a card without TF32 runs on CUDA cores, NCHW natively: no transposes
    v100 = peaks(gpu("V100 16GB"))
    fp32 = [Op(o.name, o.kind, o.phase, o.flops, o.bytes, "fp32", o.shape) for o in (nhwc, nchw)]
    assert kernel_seconds(fp32[0], v100, hopper=False) == kernel_seconds(
        fp32[1], v100, hopper=False
    )
