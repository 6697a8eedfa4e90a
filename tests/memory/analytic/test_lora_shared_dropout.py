"""Lit-GPT's one LoRA dropout on a fused QKV input against PEFT's one per target module."""

import pytest

from torchfit.memory import estimate
from torchfit.memory.analytic.arch import spec_from_config
from torchfit.memory.analytic.lora import LoraSetup, resolve_targets

transformers = pytest.importorskip("transformers")


def _llama():
    return transformers.LlamaConfig(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1000,
        max_position_embeddings=128,
    )


def _setup(config, targets, *, shared):
    roles, head = resolve_targets(spec_from_config(config), targets)
    return LoraSetup(8, roles, head=head, dropout=0.1, shared_qkv_dropout=shared)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_one_shared_mask_saves_one_dropped_input_per_extra_qkv_adapter(device):
    config, batch, seq = _llama(), 2, 64
    common = dict(batch_size=batch, seq_len=seq, device=device, precision="bf16-true")
    targets = ["q_proj", "k_proj", "v_proj", "down_proj"]
    peft = estimate(config, lora=_setup(config, targets, shared=False), **common)
    litgpt = estimate(config, lora=_setup(config, targets, shared=True), **common)
    mask = 1 if device == "cuda" else 2  # a bool mask on CUDA, the input's dtype on CPU
    # three q/k/v copies (mask + bf16 input) become one; down_proj's own stays
    saved = 3 * batch * seq * 2 * config.hidden_size * (mask + 2)
    assert peft.layers[0].activations - litgpt.layers[0].activations == saved // 3
    assert peft.activations - litgpt.activations == saved


def test_sharing_changes_nothing_without_dropout_or_without_two_qkv_adapters():
    config = _llama()
    common = dict(batch_size=1, seq_len=32, device="cpu")
    for targets, dropout in ((["q_proj", "v_proj"], 0.0), (["q_proj", "up_proj"], 0.1)):
        roles, _ = resolve_targets(spec_from_config(config), targets)
        totals = {
            estimate(
                config,
                lora=LoraSetup(8, roles, dropout=dropout, shared_qkv_dropout=shared),
                **common,
            ).total
            for shared in (False, True)
        }
        assert len(totals) == 1, (targets, dropout)
