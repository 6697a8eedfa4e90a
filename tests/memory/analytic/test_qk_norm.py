"""Qwen3 RMS-normalizes each query and key head: the closed form keeps what the trace keeps."""

import pytest
import torch

from torchfit.memory import estimate, trace

transformers = pytest.importorskip("transformers")

SIZES = dict(
    vocab_size=512,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=1024,
    bos_token_id=0,
    eos_token_id=0,
    pad_token_id=0,
)
BATCH, SEQ = 2, 256


def _both(family, precision):
    config = getattr(transformers, f"{family}Config")(**SIZES)
    torch.manual_seed(0)
    model = getattr(transformers, f"{family}ForCausalLM")(config)
    ids = torch.randint(1, 512, (BATCH, SEQ))
    common = dict(precision=precision, device="cuda", optimizer="sgd")
    traced = trace(model, {"input_ids": ids, "labels": ids}, **common).total
    return traced, estimate(config, batch_size=BATCH, seq_len=SEQ, **common).total


@pytest.mark.parametrize("precision", ["32-true", "bf16-true"])
def test_the_per_head_norms_cost_what_the_trace_sees(precision):
    # Qwen3 is Qwen2 with per-head q/k RMSNorms and without q/k/v biases: the difference
    # of the two traces is those norms' saved tensors (2,600 bytes per token and layer in
    # fp32 here), which the closed form missed
    qwen3, qwen2 = _both("Qwen3", precision), _both("Qwen2", precision)
    traced, closed = qwen3[0] - qwen2[0], qwen3[1] - qwen2[1]
    per_token_layer = abs(traced - closed) / (BATCH * SEQ * SIZES["num_hidden_layers"])
    assert per_token_layer <= 4, (traced, closed)
    assert traced > 1500 * BATCH * SEQ * SIZES["num_hidden_layers"]
