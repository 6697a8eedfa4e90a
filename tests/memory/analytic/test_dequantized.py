"""bitsandbytes' 4-bit matmul dequantizes one weight at a time: the estimate counts it."""

import pytest

from torchfit._bnb.matmul import dequantized_bytes_per_weight, quantized_from
from torchfit._core.units import DType
from torchfit.memory import estimate
from torchfit.memory.analytic.arch import spec_from_config
from torchfit.memory.analytic.quantized import dequantized_bytes, quantized_shapes

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
    return spec_from_config(transformers.LlamaConfig(**CONFIG))


def test_the_largest_block_linear_or_the_head_is_dequantized_in_the_compute_dtype():
    spec = _spec()
    assert dequantized_bytes(quantized_shapes(spec), DType.BF16) == 688 * 256 * 2
    assert dequantized_bytes(quantized_shapes(spec, head=True), DType.BF16) == 4000 * 256 * 2


def test_a_quantized_head_adds_its_dequantized_copy_to_the_cuda_inference_peak():
    config = transformers.LlamaConfig(**CONFIG)
    common = dict(batch_size=2, seq_len=64, dtype="nf4", device="cuda", mode="inference")
    kept = estimate(config, **common)
    quantized = estimate(config, quantize_head=True, **common)
    # the head's bytes move from bf16 to nf4, and the larger weight is dequantized now
    transient = (4000 - 688) * 256 * 2
    assert (quantized.total - kept.total) - (quantized.weights - kept.weights) == transient
    assert any("dequantizes one 4-bit weight" in note for note in quantized.notes)


def test_a_training_step_dequantizes_in_a_linear_backward_not_at_the_loss():
    # backward dequantizes a 4-bit weight inside that Linear's backward, after the loss's
    # logits-sized gradients are gone: at a loss-bound peak (here) it adds nothing. The
    # kept head is fp32 (prepare_model_for_kbit_training) with a bf16 autocast copy alive
    # at the loss; the quantized head has neither.
    config = transformers.LlamaConfig(**CONFIG)
    common = dict(batch_size=2, seq_len=64, dtype="nf4", device="cuda")
    kept = estimate(config, **common)
    quantized = estimate(config, quantize_head=True, **common)
    head_copy = 4000 * 256 * 2
    assert kept.total - quantized.total == kept.weights - quantized.weights + head_copy
    assert any("dequantizes one 4-bit weight" in note for note in quantized.notes)


def test_one_token_at_inference_takes_the_gemv_path():
    config = transformers.LlamaConfig(**CONFIG)
    one = estimate(config, batch_size=1, seq_len=1, dtype="nf4", mode="inference")
    assert not any("dequantizes" in note for note in one.notes)


# --- the dtype a 4-bit weight dequantizes to (bitsandbytes' matmul rules) ---------------

F16, B16, F32 = DType.FP16, DType.BF16, DType.FP32


@pytest.mark.parametrize(
    ("version", "expected"), [("0.41.1", F16), ("0.42.0", F16), ("0.43.0", B16), ("0.50.0", B16)]
)
def test_bitsandbytes_before_0_43_quantizes_every_weight_from_fp16(version, expected):
    assert quantized_from(B16, version) is expected


@pytest.mark.parametrize(
    ("source", "compute", "rows", "version", "per_weight"),
    [
        (F16, B16, None, "0.50.0", 4),  # backward: the fp16 copy, then its bf16 copy
        (B16, B16, None, "0.50.0", 2),  # .to() of the same dtype copies nothing
        (F32, B16, None, "0.43.0", 6),
        (F16, B16, 300, "0.41.1", 4),  # forward before 0.50: the same expression
        (F16, B16, 1, "0.41.1", 0),  # one row without gradient: gemv_4bit
        (F16, B16, 2, "0.49.2", 4),
        (F16, B16, 4, "0.50.0", 0),  # 0.50's fused gemm_4bit takes up to 4 rows
        (F16, B16, 5, "0.50.0", 2),  # past it, one copy straight into the input's dtype
        (F16, B16, 4096, "0.50.0", 2),
    ],
)
def test_the_bytes_per_weight_follow_the_version_rows_and_dtypes(
    source, compute, rows, version, per_weight
):
    got = dequantized_bytes_per_weight(source=source, compute=compute, rows=rows, version=version)
    assert got == per_weight


@pytest.mark.parametrize("mode", ["train", "inference"])
def test_a_base_quantized_from_fp16_adds_an_fp16_copy_of_the_largest_weight(mode):
    # a small vocabulary: the top block's backward, where a 4-bit Linear dequantizes its
    # weight, is the training peak rather than the loss's logits-sized gradients
    config = transformers.LlamaConfig(**{**CONFIG, "vocab_size": 256})
    common = dict(
        batch_size=2,
        seq_len=64,
        dtype="nf4",
        device="cuda",
        mode=mode,
        bitsandbytes_version="0.43.2",
    )
    same = estimate(config, **common)
    fp16 = estimate(config, base_dtype="fp16", **common)
    assert fp16.total - same.total == 688 * 256 * 2  # down_proj, the largest 4-bit Linear
    assert fp16.weights == same.weights
    assert any("to fp16, then a bf16 copy" in note for note in fp16.notes)


def test_bitsandbytes_before_0_43_dequantizes_to_fp16_whatever_the_base():
    config = transformers.LlamaConfig(**CONFIG)
    common = dict(batch_size=2, seq_len=64, dtype="nf4", device="cuda", mode="train")
    new = estimate(config, bitsandbytes_version="0.43.2", **common)
    old = estimate(config, bitsandbytes_version="0.42.0", base_dtype="bf16", **common)
    assert any("to fp16, then a bf16 copy" in note for note in old.notes)
    assert not any("then a bf16 copy" in note for note in new.notes)


def test_few_rows_take_the_fused_kernel_from_bitsandbytes_0_50():
    config = transformers.LlamaConfig(**CONFIG)
    common = dict(batch_size=2, seq_len=2, dtype="nf4", device="cuda", mode="inference")
    fused = estimate(config, bitsandbytes_version="0.50.0", **common)
    unfused = estimate(config, bitsandbytes_version="0.49.2", **common)
    assert any("dequantizes" in note for note in unfused.notes)
    assert not any("dequantizes" in note for note in fused.notes)
    # without the copy, loading the largest weight (its 16-bit copy) is the peak
    assert fused.peak_at == "loading" and unfused.peak_at == "forward"
    assert unfused.total > fused.total


def test_the_meta_pass_counts_the_same_fp16_copy():
    config = transformers.BloomConfig(
        vocab_size=1000, hidden_size=128, n_layer=2, n_head=4, tie_word_embeddings=True
    )
    common = dict(batch_size=2, seq_len=64, dtype="nf4", device="cuda", mode="inference")
    same = estimate(config, bitsandbytes_version="0.43.2", **common)
    fp16 = estimate(config, base_dtype="fp16", bitsandbytes_version="0.43.2", **common)
    assert fp16.total - same.total == 4 * 128 * 128 * 2  # dense_4h_to_h / h_to_4h, 512 x 128


def test_a_quantized_base_dtype_is_refused_with_the_fix():
    config = transformers.LlamaConfig(**CONFIG)
    with pytest.raises(ValueError, match=r"base_dtype='nf4'.*fp32, fp16 or bf16.*dtype="):
        estimate(config, batch_size=1, seq_len=8, dtype="nf4", base_dtype="nf4")


def test_the_meta_pass_counts_rows_of_the_sequence_it_runs_when_none_is_given():
    config = transformers.BloomConfig(
        vocab_size=1000, hidden_size=128, n_layer=2, n_head=4, tie_word_embeddings=True
    )
    common = dict(batch_size=1, dtype="nf4", device="cuda", mode="inference")
    default = estimate(config, bitsandbytes_version="0.50.0", **common)  # 512 tokens
    assert any("dequantizes" in note for note in default.notes)
    assert "512 tokens per sample" in default.notes[0]
