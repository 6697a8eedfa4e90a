"""Mixture-of-experts closed forms (Mixtral, Qwen2-MoE, Qwen3-MoE) against real builds and steps.

Every expert is resident (weights, gradients, optimizer state); activations follow the
tokens each routed to ``top_k`` experts; the router's probabilities are counted; the
KV cache is a dense model's.
"""

import dataclasses

import pytest
import torch

transformers = pytest.importorskip("transformers")

from torchfit.memory import estimate, measure_step  # noqa: E402
from torchfit.memory.analytic.arch import has_closed_form, spec_from_config  # noqa: E402
from torchfit.memory.analytic.formulas import kv_cache_bytes  # noqa: E402
from torchfit.memory.analytic.quantized import block_linear_shapes  # noqa: E402
from torchfit.memory.catalog import build_model, count_parameters, list_models  # noqa: E402
from torchfit.memory.catalog.inputs import example_batch  # noqa: E402

BASE = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "pad_token_id": 0,
}
CONFIGS = {
    "mixtral": lambda **kw: transformers.MixtralConfig(
        **BASE, num_local_experts=4, num_experts_per_tok=2, **kw
    ),
    "qwen2_moe, a dense layer": lambda **kw: transformers.Qwen2MoeConfig(
        **BASE, moe_intermediate_size=32, shared_expert_intermediate_size=96, num_experts=6,
        num_experts_per_tok=2, mlp_only_layers=[1], **kw,
    ),
    "qwen3_moe, normalized top-k": lambda **kw: transformers.Qwen3MoeConfig(
        **BASE, moe_intermediate_size=48, num_experts=8, num_experts_per_tok=3,
        norm_topk_prob=True, head_dim=16, **kw,
    ),
    "qwen3_moe, every other layer sparse": lambda **kw: transformers.Qwen3MoeConfig(
        **BASE, moe_intermediate_size=48, num_experts=8, num_experts_per_tok=2,
        decoder_sparse_step=2, head_dim=16, **kw,
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_expert_is_counted_exactly(name):
    config = CONFIGS[name]()
    model = build_model(config, dtype="fp32")
    params = list(model.parameters())
    spec = spec_from_config(config)
    assert spec.num_params == count_parameters(model)
    assert spec.num_tensors == len(params)
    linear = sum(o * i for o, i in block_linear_shapes(spec))
    modules = [m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    assert linear == sum(m.weight.numel() for m in modules if m is not model.lm_head)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_training_step_within_5_percent_of_the_real_cpu_peak(name):
    config = CONFIGS[name]()
    torch.manual_seed(0)
    model = build_model(config, device="cpu", dtype="fp32")
    shapes = example_batch(build_model(config), batch_size=2, seq_len=64, training=True)
    batch = {key: torch.randint(1, 512, t.shape) for key, t in shapes.items()}
    peak = measure_step(model, batch, device="cpu").peak
    found = estimate(config, batch_size=2, seq_len=64, device="cpu")
    assert found.notes[0].startswith("method: closed form")
    assert abs(found.total - peak) <= 0.05 * peak, (found.total, peak)


def test_activations_follow_the_routed_tokens_not_the_experts():
    def block(experts, top_k):
        config = transformers.MixtralConfig(
            **BASE, num_local_experts=experts, num_experts_per_tok=top_k
        )
        found = estimate(config, batch_size=16, seq_len=64, device="cpu", optimizer="sgd")
        assert found.peak_at == "start of backward"  # the blocks' rows are in the estimate
        return found.layers[0].activations

    tokens = 16 * 64
    # eight more experts: only the router's fp32 probabilities grow (4 bytes per expert)
    assert block(16, 2) - block(8, 2) == tokens * 8 * 4
    # one more expert per token: one more routed row of every expert tensor per token
    spec = spec_from_config(transformers.MixtralConfig(**BASE, num_local_experts=8))
    row = (2 * spec.hidden + 4 * spec.moe.expert_intermediate) * 4 + 4 + 3 * 8
    assert block(8, 3) - block(8, 2) == tokens * (row + 4 + 8)  # + top-k value and index


def test_the_router_probabilities_are_counted():
    found = estimate(CONFIGS["mixtral"](), batch_size=2, seq_len=64, device="cpu")
    assert "router: fp32 probabilities, top-k indices" in found.layers[0].detail


def test_inference_keeps_the_kv_cache_of_a_dense_model():
    config = CONFIGS["mixtral"]()
    dense = transformers.MistralConfig(**BASE)
    moe = estimate(config, batch_size=4, seq_len=128, mode="inference", dtype="bf16")
    plain = estimate(dense, batch_size=4, seq_len=128, mode="inference", dtype="bf16")
    expected = kv_cache_bytes(
        batch_size=4, seq_len=128, num_layers=3, num_kv_heads=2, head_dim=16, dtype="bf16"
    )
    assert moe.kv_cache == plain.kv_cache == expected


def test_quantized_moe_keeps_its_experts_in_the_compute_dtype():
    config = CONFIGS["mixtral"]()
    spec = spec_from_config(config)
    nf4 = estimate(config, batch_size=1, seq_len=64, mode="inference", dtype="nf4")
    bf16 = estimate(config, batch_size=1, seq_len=64, mode="inference", dtype="bf16")
    experts = spec.moe.expert_params * spec.num_layers
    assert nf4.weights > 2 * experts  # the experts themselves stay 16-bit
    assert nf4.weights < bf16.weights


def test_catalog_decoders_with_closed_forms_count_like_their_builds():
    decoders = [e for e in list_models(task="causal-lm") if has_closed_form(e.config())]
    assert {"mixtral-8x7b", "mixtral-8x22b", "qwen3-30b-a3b", "qwen1.5-moe-a2.7b"} <= {
        e.name for e in decoders
    }
    for entry in decoders:
        assert spec_from_config(entry.config()).num_params == entry.params, entry.name


def test_a_dense_spec_has_no_experts():
    spec = spec_from_config(transformers.LlamaConfig(**BASE))
    assert spec.moe is None
    assert dataclasses.replace(spec).moe is None
