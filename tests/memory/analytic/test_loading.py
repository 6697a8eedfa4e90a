"""The loading moment of a bitsandbytes base: each weight is quantized on the GPU.

bitsandbytes copies a weight to the GPU in 16 bits and quantizes it there
(``Params4bit._quantize``, ``Int8Params._quantize``; before 0.45 ``Int8Params.cuda``'s
``double_quant`` also made a transposed int8 copy), so loading holds the weights loaded so
far plus the largest weight's copies. For one token that is the run's peak.
"""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from torchfit._core.units import DType
from torchfit.memory import estimate
from torchfit.memory.analytic.quantized import quantize_on_load_bytes

transformers = pytest.importorskip("transformers")

LLAMA_2_7B_DOWN = 11008 * 4096  # the largest block Linear of Llama-2-7B


@pytest.mark.parametrize(
    ("dtype", "version", "per_weight"),
    [("int8", "0.50.2", 2), ("int8", "0.44.1", 3), ("nf4", "0.41.1", 2), ("fp4", "0.50.2", 2)],
)
def test_one_token_peaks_while_loading(dtype, version, per_weight):
    found = estimate(
        "llama-2-7b",
        batch_size=1,
        seq_len=1,
        mode="inference",
        dtype=dtype,
        bitsandbytes_version=version,
    )
    assert found.peak_at == "loading"
    assert found.total == found.weights + per_weight * LLAMA_2_7B_DOWN
    assert found.kv_cache == found.activations == 0
    assert any("quantizes each weight on the GPU" in note for note in found.notes)


def test_a_long_prompt_outweighs_loading_and_cpu_has_no_loading_moment():
    common = dict(batch_size=1, mode="inference", dtype="int8")
    assert estimate("llama-2-7b", seq_len=2048, **common).peak_at != "loading"
    assert estimate("llama-2-7b", seq_len=1, device="cpu", **common).peak_at != "loading"
    assert estimate("llama-2-7b", batch_size=1, seq_len=1, mode="inference").peak_at != "loading"


def test_the_meta_pass_has_the_loading_moment_too():
    config = transformers.FalconConfig(
        hidden_size=256, num_hidden_layers=2, num_attention_heads=4, vocab_size=1000
    )
    found = estimate(config, batch_size=1, seq_len=1, mode="inference", dtype="int8")
    assert found.peak_at == "loading"
    assert found.total == found.weights + 2 * 256 * 4 * 256  # the MLP's 4h x h, in fp16


@given(
    shapes=st.lists(st.tuples(st.integers(1, 4096), st.integers(1, 4096)), min_size=1, max_size=8),
    weights=st.sampled_from([DType.INT8, DType.NF4, DType.FP4, DType.BF16]),
    old=st.booleans(),
)
def test_the_copies_are_those_of_the_largest_weight(shapes, weights, old):
    version = "0.43.1" if old else "0.45.0"
    got = quantize_on_load_bytes(shapes, weights, bitsandbytes_version=version)
    largest = max(o * i for o, i in shapes)
    if not weights.is_quantized:
        assert got == 0
    else:
        assert got == largest * (3 if weights is DType.INT8 and old else 2)
