"""Every transformers family plans: a tiny random config of each, against its real CPU step.

For each family the same step (forward with labels, loss, backward, AdamW) is measured
on CPU (`measure_step`), traced on fake tensors (`trace`, within 1%), and estimated from
the config alone (`estimate`: a closed form for Llama-style and MoE decoders, a
meta-device pass for the others; within 5%). `fits` must plan each from its folder.
"""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from torchfit.memory import estimate, measure_step, trace  # noqa: E402
from torchfit.memory.analytic.arch import has_closed_form, spec_from_config  # noqa: E402
from torchfit.memory.catalog import build_model, count_parameters  # noqa: E402
from torchfit.memory.catalog.build import experts_on_fake_tensors  # noqa: E402
from torchfit.memory.catalog.inputs import example_batch  # noqa: E402
from torchfit.memory.plan import plan_card  # noqa: E402

BATCH, SEQ, VOCAB = 2, 64, 512
TOKENS = {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}
LLAMA_LIKE = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    **TOKENS,
}

FAMILIES = {
    "bloom": lambda: transformers.BloomConfig(
        vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4, **TOKENS
    ),
    "falcon": lambda: transformers.FalconConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, **TOKENS
    ),
    "t5": lambda: transformers.T5Config(
        vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
        decoder_start_token_id=0, **TOKENS,
    ),
    "gpt_bigcode": lambda: transformers.GPTBigCodeConfig(
        vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=256, **TOKENS
    ),
    "mixtral": lambda: transformers.MixtralConfig(
        **LLAMA_LIKE, num_local_experts=4, num_experts_per_tok=2
    ),
    "qwen2_moe": lambda: transformers.Qwen2MoeConfig(
        **LLAMA_LIKE, moe_intermediate_size=32, shared_expert_intermediate_size=128,
        num_experts=4, num_experts_per_tok=2,
    ),
    "gemma2": lambda: transformers.Gemma2Config(**LLAMA_LIKE, head_dim=16),
    "phi3": lambda: transformers.Phi3Config(**LLAMA_LIKE),
    "opt": lambda: transformers.OPTConfig(
        vocab_size=VOCAB, hidden_size=64, ffn_dim=128, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=256, word_embed_proj_dim=64, **TOKENS,
    ),
    "gpt_neox": lambda: transformers.GPTNeoXConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=256, **TOKENS,
    ),
}  # fmt: skip


def real_step(config):
    """The model with real weights and one batch of real token ids, shaped as estimated."""
    torch.manual_seed(0)
    model = build_model(config, device="cpu", dtype="fp32")
    shapes = example_batch(build_model(config), batch_size=BATCH, seq_len=SEQ, training=True)
    batch = {name: torch.randint(1, VOCAB, t.shape) for name, t in shapes.items()}
    return model, batch


@pytest.fixture(scope="module")
def measured():
    """Each family's real CPU peak and traced estimate, measured once."""
    found = {}
    for family, make in FAMILIES.items():
        model, batch = real_step(make())
        peak = measure_step(model, batch, device="cpu").peak
        with experts_on_fake_tensors():  # MoE experts: an op fake tensors take (see build.py)
            traced = trace(model, batch, device="cpu").total
        found[family] = (peak, traced)
    return found


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_trace_of_a_training_step_is_within_1_percent(measured, family):
    peak, traced = measured[family]
    assert abs(traced - peak) <= 0.01 * peak, (traced, peak)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_config_only_estimate_is_within_5_percent(measured, family, tmp_path):
    config = FAMILIES[family]()
    config.save_pretrained(tmp_path)
    found = estimate(str(tmp_path), batch_size=BATCH, seq_len=SEQ, device="cpu")
    peak, _ = measured[family]
    assert abs(found.total - peak) <= 0.05 * peak, (found.total, peak, found.peak_at)
    method = "closed form" if has_closed_form(config) else "meta-device pass"
    assert found.notes[0].startswith(f"method: {method}")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_fits_plans_each_family_from_its_folder(family, tmp_path):
    FAMILIES[family]().save_pretrained(tmp_path)
    plan = plan_card(str(tmp_path), "RTX 3060", seq_len=SEQ, batch_size=BATCH)
    assert plan.fits
    assert plan.largest_batch > BATCH
    assert plan.estimate.notes[0].startswith("method: ")


def test_a_tiny_mixtral_counts_every_expert():
    config = FAMILIES["mixtral"]()
    model = build_model(config, dtype="fp32")
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    assert experts == 2 * 4 * 3 * 64 * 128  # layers x experts x (gate, up, down) x h x i
    spec = spec_from_config(config)
    assert spec.num_params == count_parameters(model)
    assert spec.moe.expert_params * spec.num_layers == experts
    found = estimate(config, batch_size=BATCH, seq_len=SEQ, device="cpu")
    assert found.weights == 4 * count_parameters(model)  # every expert resident, fp32
    steps = 4 * len(list(model.parameters()))  # AdamW's fp32 step counter per tensor
    assert found.optimizer == 2 * 4 * count_parameters(model) + steps  # two moments each
