"""LoRA on a model without a closed form: PEFT's own layers in the meta pass, vs real steps."""

import pytest
import torch

from torchfit._core.units import DType
from torchfit.memory import estimate, measure_step

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

VOCAB = 2000


def _bloom(**extra):
    return transformers.BloomConfig(hidden_size=128, n_layer=3, n_head=4, vocab_size=VOCAB, **extra)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"lora_rank": 8},
        {"lora_rank": 16, "lora_targets": ["query_key_value", "dense_h_to_4h"]},
        {"lora": "r=4 on dense"},
    ],
    ids=["peft-default-targets", "rank-and-targets", "lora-config"],
)
def test_lora_on_bloom_follows_the_real_peft_step(kwargs):
    config = _bloom()
    if kwargs.get("lora") == "r=4 on dense":
        kwargs = {"lora": peft.LoraConfig(r=4, target_modules=["dense"])}
    lora = kwargs.get("lora") or peft.LoraConfig(
        r=kwargs["lora_rank"], target_modules=kwargs.get("lora_targets")
    )
    torch.manual_seed(0)
    model = peft.get_peft_model(transformers.BloomForCausalLM(config), lora)
    ids = torch.randint(0, VOCAB, (4, 64))
    real = measure_step(model, {"input_ids": ids, "labels": ids}, device="cpu").peak
    est = estimate(config, batch_size=4, seq_len=64, dtype="fp32", device="cpu", **kwargs)
    assert abs(est.total / real - 1) <= 0.01, (est.total, real)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert f"LoRA adapters placed by PEFT: {trainable:,} trainable parameters" in est.notes


def test_the_users_lora_config_is_not_changed():
    lora = peft.LoraConfig(r=4, target_modules=["dense"])
    before = lora.to_dict()
    estimate(_bloom(), batch_size=1, seq_len=16, device="cpu", lora=lora)
    assert lora.to_dict() == before


def test_under_mixed_precision_the_frozen_base_keeps_the_checkpoints_dtype():
    config = _bloom(torch_dtype="bfloat16")
    est = estimate(config, batch_size=1, seq_len=16, dtype="bf16", lora_rank=8, device="cpu")
    model = peft.get_peft_model(
        transformers.BloomForCausalLM(_bloom()), peft.LoraConfig(r=8, target_modules=None)
    )
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    adapters = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert est.weights == frozen * DType.BF16.itemsize + adapters * 4
    assert est.gradients in {0, adapters * 4}  # the peak may be where no gradient exists yet


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"lora_targets": ["no_such_layer"]}, ValueError, "PEFT cannot place LoRA adapters"),
        (
            {"lora": "config", "lora_rank": 4},
            ValueError,
            "both describe the adapters",
        ),
    ],
)
def test_what_peft_cannot_do_is_named(kwargs, error, message):
    if kwargs.get("lora") == "config":
        kwargs = {**kwargs, "lora": peft.LoraConfig(r=4)}
    with pytest.raises(error, match=message):
        estimate(_bloom(), batch_size=1, seq_len=16, device="cpu", **kwargs)


def test_a_plain_module_is_told_to_bring_its_own_peft_model():
    net = torch.nn.Sequential(torch.nn.Linear(8, 8))
    with pytest.raises(ValueError, match="trace the peft model"):
        estimate(net, batch_size=2, input_shape=(8,), lora_rank=8)
