"""LoRA target names as PEFT leaves them in a config it has applied, and Phi-3's fused ones."""

import pytest
import torch

from tiny_configs import VOCAB, tiny_family
from torchfit.memory import estimate, to_device, trace
from torchfit.memory.analytic.arch import spec_from_config
from torchfit.memory.analytic.lora import lora_parameters
from torchfit.memory.analytic.loraconfig import lora_setup

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_a_config_peft_has_already_applied_reads_as_before(family):
    """``get_peft_model`` writes "all-linear" back as each adapted module's full name (on a
    model with fewer than 20 of them; past that it shortens them); the config read after
    the model was built is the same step."""
    config, model = tiny_family(family, layers=2) if family == "llama" else tiny_family(family)
    fresh = peft.LoraConfig(r=8, target_modules="all-linear", lora_dropout=0.1)
    applied = peft.LoraConfig(r=8, target_modules="all-linear", lora_dropout=0.1)
    real = peft.get_peft_model(model, applied)
    assert any("." in name for name in applied.target_modules)  # PEFT's rewrite
    spec = spec_from_config(config)
    assert lora_setup(spec, lora=applied) == lora_setup(spec, lora=fresh)
    trains = sum(p.numel() for p in real.parameters() if p.requires_grad)
    assert lora_parameters(spec, lora_setup(spec, lora=applied)) == trains


def test_full_names_tell_gpt2s_two_c_proj_apart():
    config, _ = tiny_family("gpt2", layers=2)
    spec = spec_from_config(config)
    names = [f"transformer.h.{k}.mlp.c_proj" for k in range(2)]
    assert lora_setup(spec, lora=peft.LoraConfig(r=8, target_modules=names)).roles == {"down"}
    names = [f"transformer.h.{k}.attn.c_proj" for k in range(2)]
    assert lora_setup(spec, lora=peft.LoraConfig(r=8, target_modules=names)).roles == {"o"}


def test_full_names_of_some_blocks_only_are_refused():
    config, _ = tiny_family("llama")
    some = peft.LoraConfig(r=8, target_modules=["model.layers.0.self_attn.q_proj"])
    with pytest.raises(ValueError, match=r"blocks \[0\] of 3 only"):
        lora_setup(spec_from_config(config), lora=some)
    every = [f"model.layers.{k}.self_attn.q_proj" for k in range(3)] + ["self_attn.v_proj"]
    setup = lora_setup(spec_from_config(config), lora=peft.LoraConfig(r=8, target_modules=every))
    assert setup.roles == {"q", "v"}


def _phi3():
    return transformers.Phi3Config(
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=512,
        pad_token_id=0,
    )


@pytest.mark.parametrize(
    "targets", ["all-linear", ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"], ["qkv_proj"]]
)
def test_phi3s_fused_projections_take_one_adapter_each(targets):
    """Phi-3 (and Phi-4) fuse q/k/v and gate/up: one adapter, one dropped input, each.
    Read as separate projections the estimate was +2.9% over the trace."""
    config = _phi3()
    config.use_cache = False
    with torch.device("meta"):
        base = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)

    def lora():
        return peft.LoraConfig(r=16, lora_dropout=0.05, target_modules=targets)

    model = peft.get_peft_model(base, lora())
    model.train()
    spec = spec_from_config(_phi3())
    trains = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert lora_parameters(spec, lora_setup(spec, lora=lora())) == trains
    ids = torch.zeros((2, 256), dtype=torch.long, device="meta")
    traced = trace(
        model,
        {"input_ids": ids, "labels": ids},
        device="cuda",
        autocast_dtype=torch.bfloat16,
        gpu="H200",
    )
    found = estimate(
        _phi3(),
        batch_size=2,
        seq_len=256,
        lora=lora(),
        base_dtype="bf16",
        precision="bf16-mixed",
        device="cuda",
    )
    error = to_device(found, gpu="H200").total / traced.total - 1
    assert abs(error) <= 0.015, f"{error:+.2%}"


def test_phi3_has_no_separate_projections():
    spec = spec_from_config(_phi3())
    with pytest.raises(ValueError, match=r"'q_proj' matches no Linear.*qkv_proj"):
        lora_setup(spec, lora=peft.LoraConfig(r=8, target_modules=["q_proj"]))


def test_a_pattern_matching_nothing_names_a_module_of_the_model():
    for config, example in [
        (_phi3(), "self_attn.qkv_proj"),
        (tiny_family("gpt2")[0], "attn.c_attn"),
    ]:
        spec = spec_from_config(config)
        with pytest.raises(ValueError, match=rf"matches no Linear.*{example}"):
            lora_setup(spec, lora=peft.LoraConfig(r=8, target_modules=r".*\.nothing"))
