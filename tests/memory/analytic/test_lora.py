"""LoRA by its targets: parameters, what the adapters keep, against real peft models on CPU."""

import pytest
import torch

from tiny_configs import VOCAB, tiny_family
from torchfit.memory import estimate, measure_step, to_device, trace
from torchfit.memory.analytic.arch import spec_from_config
from torchfit.memory.analytic.lora import lora_parameters
from torchfit.memory.analytic.loraconfig import lora_setup

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

CASES = [
    ("llama", ["q_proj", "v_proj"], 0.0),
    ("llama", ["q_proj", "v_proj"], 0.1),
    ("llama", "all-linear", 0.0),
    ("llama", ["o_proj", "down_proj"], 0.05),
    ("gpt2", ["c_attn"], 0.0),
    ("gpt2", ["c_attn", "c_proj", "c_fc"], 0.0),
    ("bert", ["query", "value"], 0.0),
    ("bert", ["query", "key", "value", "dense"], 0.1),
]


@pytest.mark.parametrize(("family", "targets", "dropout"), CASES)
def test_adapters_train_what_peft_trains(family, targets, dropout):
    config, model = tiny_family(family)
    lora = peft.LoraConfig(
        r=8, target_modules=targets, lora_dropout=dropout, fan_in_fan_out=family == "gpt2"
    )
    real = peft.get_peft_model(model, lora)
    trains = sum(p.numel() for p in real.parameters() if p.requires_grad)
    assert (
        lora_parameters(spec_from_config(config), lora_setup(spec_from_config(config), lora=lora))
        == trains
    )


@pytest.mark.parametrize(("family", "targets", "dropout"), CASES)
def test_estimate_of_a_lora_step_against_the_real_peft_step(family, targets, dropout):
    config, model = tiny_family(family)
    lora = peft.LoraConfig(
        r=8, target_modules=targets, lora_dropout=dropout, fan_in_fan_out=family == "gpt2"
    )
    real = peft.get_peft_model(model, lora)
    ids = torch.randint(0, VOCAB, (4, 128))
    inputs = {"input_ids": ids, "labels": ids}
    measured = measure_step(real, inputs, device="cpu").peak
    predicted = estimate(config, batch_size=4, seq_len=128, device="cpu", lora=lora).total
    error = (predicted - measured) / measured
    assert abs(error) <= 0.04, f"{error:+.1%}"


def test_a_real_peft_model_traces_exactly():
    _, model = tiny_family("llama")
    real = peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    ids = torch.randint(0, VOCAB, (4, 64))
    inputs = {"input_ids": ids, "labels": ids}
    traced = trace(real, inputs, device="cpu").total
    measured = measure_step(real, inputs, device="cpu").peak
    assert abs(traced - measured) <= 64


def test_rank_and_targets_without_peft_match_a_lora_config():
    config, _ = tiny_family("llama")
    common = dict(batch_size=2, seq_len=64, device="cpu")
    by_config = estimate(
        config, lora=peft.LoraConfig(r=16, target_modules=["q_proj", "k_proj"]), **common
    )
    by_name = estimate(config, lora_rank=16, lora_targets=["q_proj", "k_proj"], **common)
    assert by_config == by_name


def test_a_quantized_base_assumes_peft_default_adapters_and_says_so():
    config, _ = tiny_family("llama")
    plan = estimate(config, batch_size=1, seq_len=64, dtype="nf4")
    default = estimate(
        config,
        batch_size=1,
        seq_len=64,
        dtype="nf4",
        lora_rank=8,
        lora_targets=["q_proj", "v_proj"],
    )
    assert plan.total == default.total
    assert any("assumed PEFT's default LoRA, r=8 on q_proj, v_proj" in n for n in plan.notes)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(lora_targets=["qq_proj"]), ValueError, "lora_targets: 'qq_proj' matches no Linear"),
        (dict(lora_targets=[]), ValueError, "lora_targets is empty"),
        (dict(lora_rank=0), ValueError, "lora_rank must be a whole number >= 1; got 0"),
        (
            dict(lora_dropout=1.5),
            ValueError,
            r"lora_dropout must be a finite number >= 0 and < 1; got 1.5",
        ),
        (dict(lora_rank=8, trainable_params=5), ValueError, "contradicts the LoRA adapters"),
    ],
)
def test_bad_lora_settings_are_named(kwargs, error, message):
    config, _ = tiny_family("llama")
    with pytest.raises(error, match=message):
        estimate(config, batch_size=1, seq_len=16, **kwargs)


def test_lora_on_a_plain_module_says_what_to_do():
    net = torch.nn.Sequential(torch.nn.Linear(8, 8))
    with pytest.raises(ValueError, match="trace the peft model"):
        estimate(net, batch_size=1, input_shape=(8,), lora_rank=4)


def test_old_bitsandbytes_keeps_every_4bit_input_and_double_quant_saves_bytes():
    config, _ = tiny_family("llama")
    common = dict(batch_size=4, seq_len=128, dtype="nf4", device="cuda")
    old = estimate(config, bitsandbytes_version="0.41.1", **common)
    new = estimate(config, bitsandbytes_version="0.43.2", **common)
    # before 0.43.2 MatMul4Bit saved its input A for backward: the 16-bit copies of k_proj,
    # gate_proj, up_proj and down_proj inputs (not adapted by the default q/v LoRA, each its
    # own cast under autocast) are kept too; o_proj's input is the fused attention's own
    # output on CUDA, already kept
    spec = spec_from_config(config)
    per_token = 3 * spec.hidden + spec.intermediate
    kept = 4 * 128 * per_token * 2 * spec.num_layers
    assert old.activations - new.activations == kept
    assert any("before 0.43.2" in note for note in old.notes)
    plain = estimate(config, double_quant=False, **common)
    assert plain.weights > new.weights
    with pytest.raises(ValueError, match="cannot read the bitsandbytes version"):
        estimate(config, bitsandbytes_version="latest", **common)


def test_a_quantized_head_and_the_loading_cache_note():
    spec_config, _ = tiny_family("llama")
    common = dict(batch_size=1, seq_len=64, dtype="nf4", mode="inference")
    kept = estimate(spec_config, **common)
    quantized = estimate(spec_config, quantize_head=True, **common)
    spec = spec_from_config(spec_config)
    head_bf16 = spec.vocab * spec.hidden * 2
    assert head_bf16 // 4 < kept.weights - quantized.weights < head_bf16
    with pytest.raises(ValueError, match="needs quantized weights"):
        estimate(spec_config, batch_size=1, seq_len=64, mode="inference", quantize_head=True)
    config, _ = tiny_family("gpt2")  # a tied head cannot be quantized
    with pytest.raises(ValueError, match="tied"):
        estimate(config, quantize_head=True, **common)
    assert any("empty_cache" in note for note in to_device(kept, gpu="RTX 4090").notes)


# --- every LoraConfig field that changes memory -------------------------------------------


def _qwen2():
    config = transformers.Qwen2Config(
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    return config, transformers.Qwen2ForCausalLM(config)


FIELDS = [
    ("llama", dict(target_modules="all-linear", rank_pattern={"q_proj": 4, "down_proj": 16})),
    ("llama", dict(target_modules=["q_proj", "v_proj"], lora_bias=True)),
    ("llama", dict(target_modules=["q_proj", "v_proj"], use_dora=True)),
    ("llama", dict(target_modules="all-linear", exclude_modules=["k_proj", "gate_proj"])),
    ("llama", dict(target_modules=r".*\.(q_proj|o_proj)")),
    ("llama", dict(target_modules=["q_proj"], modules_to_save=["lm_head"])),
    ("llama", dict(target_modules=["q_proj"], modules_to_save=["embed_tokens"])),
    ("qwen2", dict(target_modules=["q_proj", "o_proj"], bias="lora_only")),
    ("qwen2", dict(target_modules=["q_proj"], bias="all")),
    ("gpt2", dict(target_modules=["c_attn"], bias="all", fan_in_fan_out=True)),
    ("gpt2", dict(target_modules=["c_fc"], bias="lora_only", fan_in_fan_out=True)),
    ("bert", dict(target_modules=["query", "value"], bias="all")),
]


def _family(family):
    return _qwen2() if family == "qwen2" else tiny_family(family)


LORA_BIAS = "ignore:`lora_bias=True` was passed:UserWarning"


@pytest.mark.filterwarnings(LORA_BIAS)
@pytest.mark.parametrize(("family", "fields"), FIELDS)
def test_every_field_trains_what_peft_trains(family, fields):
    config, model = _family(family)
    lora = peft.LoraConfig(r=8, **fields)
    real = peft.get_peft_model(model, lora)
    trains = sum(p.numel() for p in real.parameters() if p.requires_grad)
    assert (
        lora_parameters(spec_from_config(config), lora_setup(spec_from_config(config), lora=lora))
        == trains
    )


@pytest.mark.filterwarnings(LORA_BIAS)
@pytest.mark.parametrize(
    "fields",
    [
        dict(target_modules=["q_proj", "v_proj"], use_dora=True),
        dict(target_modules=["q_proj", "v_proj"], use_dora=True, lora_dropout=0.1),
        dict(target_modules=["q_proj"], modules_to_save=["lm_head"]),
        dict(target_modules="all-linear", rank_pattern={"down_proj": 32}, lora_bias=True),
    ],
)
def test_a_step_with_those_fields_against_the_real_peft_step(fields):
    config, model = tiny_family("llama")
    lora = peft.LoraConfig(r=8, **fields)
    real = peft.get_peft_model(model, lora)
    ids = torch.randint(0, VOCAB, (4, 128))
    inputs = {"input_ids": ids, "labels": ids}
    measured = measure_step(real, inputs, device="cpu").peak
    predicted = estimate(config, batch_size=4, seq_len=128, device="cpu", lora=lora).total
    error = (predicted - measured) / measured
    assert abs(error) <= 0.04, f"{error:+.1%}"


def test_dora_keeps_both_outputs_and_a_saved_head_trains():
    config, _ = tiny_family("llama")
    common = dict(batch_size=4, seq_len=128, device="cpu")
    plain = estimate(config, lora=peft.LoraConfig(r=8, target_modules=["q_proj"]), **common)
    dora = estimate(
        config, lora=peft.LoraConfig(r=8, target_modules=["q_proj"], use_dora=True), **common
    )
    q_out = 128  # hidden
    assert dora.activations - plain.activations == 3 * 4 * 128 * 2 * q_out * 4  # fp32
    saved = estimate(
        config,
        lora=peft.LoraConfig(r=8, target_modules=["q_proj"], modules_to_save=["lm_head"]),
        **common,
    )
    head = VOCAB * 128
    assert saved.weights - plain.weights == head * 4  # the copy beside the frozen original
    assert any("modules_to_save" in note for note in saved.notes)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(target_modules=["q_proj"], layers_to_transform=[0]), "layers_to_transform"),
        (dict(target_modules=["q_proj"], inference_mode=True), "freezes the adapters"),
        (dict(target_modules=r".*layers\.0\.self_attn\.q_proj"), "in some layers only"),
        (
            dict(target_modules=["q_proj"], rank_pattern={r"layers\.1\.self_attn\.q_proj": 4}),
            "in some layers only",
        ),
        (dict(target_modules=r".*\.nothing"), "matches no Linear"),
        (dict(target_modules=["q_proj"], modules_to_save=["norm"]), "modules_to_save names"),
        (dict(target_modules=["q_proj"], bias="some"), "bias must be"),
    ],
)
def test_fields_the_closed_form_cannot_model_are_named(fields, message):
    config, _ = tiny_family("llama")
    with pytest.raises(ValueError, match=message):
        estimate(config, batch_size=1, seq_len=16, lora=peft.LoraConfig(r=8, **fields))


def test_dora_over_a_4_bit_base_is_refused():
    config, _ = tiny_family("llama")
    lora = peft.LoraConfig(r=8, target_modules=["q_proj"], use_dora=True)
    with pytest.raises(ValueError, match="use_dora=True over a nf4 base"):
        estimate(config, batch_size=1, seq_len=16, dtype="nf4", lora=lora)
