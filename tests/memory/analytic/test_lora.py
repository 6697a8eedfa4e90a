"""LoRA by its targets: parameters, what the adapters keep, against real peft models on CPU."""

import pytest
import torch

from torchfit.memory import estimate, measure_step, to_device, trace
from torchfit.memory.analytic.arch import spec_from_config
from torchfit.memory.analytic.lora import lora_parameters
from torchfit.memory.analytic.loraconfig import lora_setup

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

VOCAB = 4000


def _model(family):
    if family == "llama":
        config = transformers.LlamaConfig(
            hidden_size=128,
            intermediate_size=384,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=VOCAB,
            max_position_embeddings=256,
        )
        cls = transformers.LlamaForCausalLM
    elif family == "gpt2":
        config = transformers.GPT2Config(
            n_layer=3,
            n_embd=128,
            n_head=4,
            n_positions=256,
            vocab_size=VOCAB,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
        cls = transformers.GPT2LMHeadModel
    else:
        config = transformers.BertConfig(
            hidden_size=128,
            intermediate_size=384,
            num_hidden_layers=3,
            num_attention_heads=4,
            vocab_size=VOCAB,
            max_position_embeddings=256,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
        cls = transformers.BertForMaskedLM
    torch.manual_seed(0)
    return config, cls(config)


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
    config, model = _model(family)
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
    config, model = _model(family)
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
    _, model = _model("llama")
    real = peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    ids = torch.randint(0, VOCAB, (4, 64))
    inputs = {"input_ids": ids, "labels": ids}
    traced = trace(real, inputs, device="cpu").total
    measured = measure_step(real, inputs, device="cpu").peak
    assert abs(traced - measured) <= 64


def test_rank_and_targets_without_peft_match_a_lora_config():
    config, _ = _model("llama")
    common = dict(batch_size=2, seq_len=64, device="cpu")
    by_config = estimate(
        config, lora=peft.LoraConfig(r=16, target_modules=["q_proj", "k_proj"]), **common
    )
    by_name = estimate(config, lora_rank=16, lora_targets=["q_proj", "k_proj"], **common)
    assert by_config == by_name


def test_a_quantized_base_assumes_peft_default_adapters_and_says_so():
    config, _ = _model("llama")
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
    config, _ = _model("llama")
    with pytest.raises(error, match=message):
        estimate(config, batch_size=1, seq_len=16, **kwargs)


def test_lora_on_a_plain_module_says_what_to_do():
    net = torch.nn.Sequential(torch.nn.Linear(8, 8))
    with pytest.raises(ValueError, match="trace the peft model"):
        estimate(net, batch_size=1, input_shape=(8,), lora_rank=4)


def test_old_bitsandbytes_keeps_every_4bit_input_and_double_quant_saves_bytes():
    config, _ = _model("llama")
    common = dict(batch_size=4, seq_len=128, dtype="nf4", device="cuda")
    old = estimate(config, bitsandbytes_version="0.41.1", **common)
    new = estimate(config, bitsandbytes_version="0.43.2", **common)
    # before 0.43.2 MatMul4Bit saved its input A for backward: the 16-bit copies of k_proj,
    # o_proj, gate_proj, up_proj and down_proj inputs (not adapted by the default q/v LoRA,
    # each its own cast under autocast) are kept too
    spec = spec_from_config(config)
    per_token = 4 * spec.hidden + spec.intermediate
    kept = 4 * 128 * per_token * 2 * spec.num_layers
    assert old.activations - new.activations == kept
    assert any("before 0.43.2" in note for note in old.notes)
    plain = estimate(config, double_quant=False, **common)
    assert plain.weights > new.weights
    with pytest.raises(ValueError, match="cannot read the bitsandbytes version"):
        estimate(config, bitsandbytes_version="latest", **common)


def test_a_quantized_head_and_the_loading_cache_note():
    spec_config, _ = _model("llama")
    common = dict(batch_size=1, seq_len=64, dtype="nf4", mode="inference")
    kept = estimate(spec_config, **common)
    quantized = estimate(spec_config, quantize_head=True, **common)
    spec = spec_from_config(spec_config)
    head_bf16 = spec.vocab * spec.hidden * 2
    assert head_bf16 // 4 < kept.weights - quantized.weights < head_bf16
    with pytest.raises(ValueError, match="needs quantized weights"):
        estimate(spec_config, batch_size=1, seq_len=64, mode="inference", quantize_head=True)
    config, _ = _model("gpt2")  # a tied head cannot be quantized
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
    return _qwen2() if family == "qwen2" else _model(family)


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
    config, model = _model("llama")
    lora = peft.LoraConfig(r=8, **fields)
    real = peft.get_peft_model(model, lora)
    ids = torch.randint(0, VOCAB, (4, 128))
    inputs = {"input_ids": ids, "labels": ids}
    measured = measure_step(real, inputs, device="cpu").peak
    predicted = estimate(config, batch_size=4, seq_len=128, device="cpu", lora=lora).total
    error = (predicted - measured) / measured
    assert abs(error) <= 0.04, f"{error:+.1%}"


def test_dora_keeps_both_outputs_and_a_saved_head_trains():
    config, _ = _model("llama")
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
    config, _ = _model("llama")
    with pytest.raises(ValueError, match=message):
        estimate(config, batch_size=1, seq_len=16, lora=peft.LoraConfig(r=8, **fields))


def test_dora_over_a_4_bit_base_is_refused():
    config, _ = _model("llama")
    lora = peft.LoraConfig(r=8, target_modules=["q_proj"], use_dora=True)
    with pytest.raises(ValueError, match="use_dora=True over a nf4 base"):
        estimate(config, batch_size=1, seq_len=16, dtype="nf4", lora=lora)


def _two_layers(family):
    config, _ = _model(family)
    config.update({"num_hidden_layers" if family == "llama" else "n_layer": 2})
    torch.manual_seed(0)
    cls = transformers.LlamaForCausalLM if family == "llama" else transformers.GPT2LMHeadModel
    return config, cls(config)


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_a_config_peft_has_already_applied_reads_as_before(family):
    """``get_peft_model`` writes "all-linear" back as each adapted module's full name (on a
    model with fewer than 20 of them; past that it shortens them); the config read after
    the model was built is the same step."""
    config, model = _two_layers(family) if family == "llama" else _model(family)
    fresh = peft.LoraConfig(r=8, target_modules="all-linear", lora_dropout=0.1)
    applied = peft.LoraConfig(r=8, target_modules="all-linear", lora_dropout=0.1)
    real = peft.get_peft_model(model, applied)
    assert any("." in name for name in applied.target_modules)  # PEFT's rewrite
    spec = spec_from_config(config)
    assert lora_setup(spec, lora=applied) == lora_setup(spec, lora=fresh)
    trains = sum(p.numel() for p in real.parameters() if p.requires_grad)
    assert lora_parameters(spec, lora_setup(spec, lora=applied)) == trains


def test_full_names_tell_gpt2s_two_c_proj_apart():
    config, _ = _two_layers("gpt2")
    spec = spec_from_config(config)
    names = [f"transformer.h.{k}.mlp.c_proj" for k in range(2)]
    assert lora_setup(spec, lora=peft.LoraConfig(r=8, target_modules=names)).roles == {"down"}
    names = [f"transformer.h.{k}.attn.c_proj" for k in range(2)]
    assert lora_setup(spec, lora=peft.LoraConfig(r=8, target_modules=names)).roles == {"o"}


def test_full_names_of_some_blocks_only_are_refused():
    config, _ = _model("llama")
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
    for config, example in [(_phi3(), "self_attn.qkv_proj"), (_model("gpt2")[0], "attn.c_attn")]:
        spec = spec_from_config(config)
        with pytest.raises(ValueError, match=rf"matches no Linear.*{example}"):
            lora_setup(spec, lora=peft.LoraConfig(r=8, target_modules=r".*\.nothing"))
