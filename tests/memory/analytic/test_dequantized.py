"""bitsandbytes' 4-bit matmul dequantizes one weight at a time: the estimate counts it."""

import pytest

from torchfit._core.units import DType
from torchfit.memory import estimate
from torchfit.memory.analytic.arch import describe
from torchfit.memory.analytic.quantized import dequantized_weight_bytes

transformers = pytest.importorskip("transformers")

# A head (4000 x 256) larger than any block Linear (688 x 256): quantizing it changes
# which weight is the largest one dequantized.
CONFIG = dict(
    vocab_size=4000,
    hidden_size=256,
    intermediate_size=688,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=512,
    tie_word_embeddings=False,
)


def _spec():
    return describe(transformers.LlamaConfig(**CONFIG))


def test_the_largest_block_linear_or_the_head_is_dequantized_in_the_compute_dtype():
    spec = _spec()
    assert dequantized_weight_bytes(spec, DType.BF16) == 688 * 256 * 2
    assert dequantized_weight_bytes(spec, DType.BF16, head=True) == 4000 * 256 * 2


@pytest.mark.parametrize("mode", ["train", "inference"])
def test_a_quantized_head_adds_its_dequantized_copy_to_the_cuda_peak(mode):
    config = transformers.LlamaConfig(**CONFIG)
    common = dict(batch_size=2, seq_len=64, dtype="nf4", device="cuda", mode=mode)
    kept = estimate(config, **common)
    quantized = estimate(config, quantize_head=True, **common)
    # the head's bytes move from bf16 to nf4, and the larger weight is dequantized now
    transient = (4000 - 688) * 256 * 2
    assert (quantized.total - kept.total) - (quantized.weights - kept.weights) == transient
    assert any("dequantizes one 4-bit weight" in note for note in quantized.notes)


def test_one_token_at_inference_takes_the_gemv_path():
    config = transformers.LlamaConfig(**CONFIG)
    one = estimate(config, batch_size=1, seq_len=1, dtype="nf4", mode="inference")
    assert not any("dequantizes" in note for note in one.notes)
