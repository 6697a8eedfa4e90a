"""Qwen3 RMS-normalizes each query and key head: the closed form keeps what the trace keeps."""

import pytest

transformers = pytest.importorskip("transformers")

from tiny_configs import LLAMA_LIKE, traced_and_closed  # noqa: E402

BATCH, SEQ = 2, 256


def _both(family, precision):
    common = dict(precision=precision, device="cuda", optimizer="sgd")
    return traced_and_closed(family, BATCH, SEQ, **common)


@pytest.mark.parametrize("precision", ["32-true", "bf16-true"])
def test_the_per_head_norms_cost_what_the_trace_sees(precision):
    # Qwen3 is Qwen2 with per-head q/k RMSNorms and without q/k/v biases: the difference
    # of the two traces is those norms' saved tensors (2,600 bytes per token and layer in
    # fp32 here), which the closed form missed
    qwen3, qwen2 = _both("Qwen3", precision), _both("Qwen2", precision)
    traced, closed = qwen3[0] - qwen2[0], qwen3[1] - qwen2[1]
    per_token_layer = abs(traced - closed) / (BATCH * SEQ * LLAMA_LIKE["num_hidden_layers"])
    assert per_token_layer <= 4, (traced, closed)
    assert traced > 1500 * BATCH * SEQ * LLAMA_LIKE["num_hidden_layers"]
