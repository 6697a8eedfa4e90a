import json
import sys

import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from torchfit.memory.catalog import (
    ModelEntry,
    ModelTask,
    build_model,
    count_parameters,
    list_models,
    model_config,
    model_entry,
)

ENTRIES = list_models()

# Published exact counts (model cards, torchvision's weight tables, timm), written down
# independently of models.json: the catalog and the meta build must both agree with them.
PUBLISHED = {
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
    "llama-2-7b": 6_738_415_616,
    "llama-2-13b": 13_015_864_320,
    "llama-2-70b": 68_976_648_192,
    "llama-3-8b": 8_030_261_248,
    "llama-3-70b": 70_553_706_496,
    "mistral-7b": 7_241_732_096,
    "tinyllama-1.1b": 1_100_048_384,
    "phi-2": 2_779_683_840,
    "bert-base": 109_482_240,  # BertModel (with pooler) of bert-base-uncased
    "resnet-18": 11_689_512,  # torchvision resnet18
    "resnet-50": 25_557_032,  # torchvision / timm resnet50
    "resnet-152": 60_192_808,  # torchvision resnet152
    "efficientnet-b0": 5_288_548,  # torchvision efficientnet_b0
    "efficientnet-b7": 66_347_960,  # torchvision efficientnet_b7
    "convnext-tiny": 28_589_128,  # torchvision convnext_tiny
    "vit-base": 86_567_656,  # timm vit_base_patch16_224
    # Model cards and the checkpoints' safetensors index (total_size / bytes per weight)
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.1-70b": 70_553_706_496,
    "llama-3.2-1b": 1_235_814_400,
    "llama-3.2-3b": 3_212_749_824,
    "llama-3.3-70b": 70_553_706_496,
    "mistral-7b-v0.3": 7_248_023_552,
    "mixtral-8x7b": 46_702_792_704,
    "qwen2.5-0.5b": 494_032_768,
    "qwen2.5-1.5b": 1_543_714_304,
    "qwen2.5-3b": 3_085_938_688,
    "qwen2.5-14b": 14_770_033_664,
    "qwen2.5-32b": 32_763_876_352,
    "qwen2.5-72b": 72_706_203_648,
    "qwen3-0.6b": 596_049_920,
    "qwen3-8b": 8_190_735_360,
    "qwen3-30b-a3b": 30_532_122_624,
    "qwen1.5-moe-a2.7b": 14_315_784_192,
    "gemma-2b": 2_506_172_416,  # Gemma report (arXiv 2403.08295) Table 2: embedding + rest
    "gemma-7b": 8_537_680_896,  # the same table
    "gemma-2-2b": 2_614_341_888,
    "gemma-2-9b": 9_241_705_984,
    "gemma-2-27b": 27_227_128_320,
    "gemma-3-1b": 999_885_952,
    "phi-3-mini": 3_821_079_552,
    "phi-4": 14_659_507_200,
    "smollm2-135m": 134_515_008,
    "smollm2-360m": 361_821_120,
    "smollm2-1.7b": 1_711_376_384,
    "olmo-1b": 1_176_764_416,
    "olmo-2-7b": 7_298_617_344,
    "olmoe-1b-7b": 6_919_161_856,
    "deepseek-v2-lite": 15_706_484_224,
    "falcon-7b": 6_921_720_704,
    "bloom-560m": 559_214_592,
    "bloom-7b1": 7_069_016_064,
    "bloom-176b": 176_247_271_424,
    "gpt-j-6b": 6_050_882_784,
    "gpt-neox-20b": 20_554_567_680,
    "opt-125m": 125_239_296,
    "opt-1.3b": 1_315_758_080,
    "t5-small": 60_506_624,
    "t5-base": 222_903_552,
    "t5-large": 737_668_096,
    "bart-large": 406_291_456,
    "roberta-base": 124_645_632,  # RobertaModel (with pooler)
    "roberta-large": 355_359_744,
    "whisper-tiny": 37_760_640,
    "whisper-base": 72_593_920,
    "whisper-small": 241_734_912,
    "whisper-medium": 763_857_920,
    "whisper-large-v3": 1_543_490_560,
    "vit-large": 304_326_632,  # timm vit_large_patch16_224
    "convnext-base": 88_591_464,  # torchvision convnext_base
    "resnet-34": 21_797_672,  # torchvision resnet34
    "lenet-5": 61_706,  # LeNet-5 with a full C3 (the usual reimplementation)
    "alexnet": 60_965_224,  # the paper's two-GPU AlexNet ("60 million parameters")
}

#: What the catalog must cover (issue 15): a family, or one model's name.
REQUIRED = (
    "llama-2", "llama-3", "llama-3.1", "llama-3.2", "llama-3.3", "mistral", "mixtral-8x7b",
    "mixtral-8x22b", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b", "qwen2.5-14b",
    "qwen2.5-32b", "qwen2.5-72b", "qwen3", "gemma-2", "gemma-3", "phi-3", "phi-3.5-mini", "phi-4",
    "smollm2", "tinyllama", "olmo", "falcon", "bloom", "gpt2", "gpt-j", "gpt-neox", "t5", "flan-t5",
    "bert", "roberta", "deberta", "whisper", "resnet-18", "resnet-50", "resnet-152",
    "efficientnet-b0", "efficientnet-b7", "convnext", "vit", "mobilenet-v1", "mobilenet-v2",
    "lenet", "alexnet", "qwen3-moe", "qwen2-moe", "olmoe", "deepseek-v2",
)  # fmt: skip


def gpt2_count(vocab, positions, d, layers):
    """GPT-2 LM with a tied head, by hand: embeddings, 12d^2 + 13d per block, final LN."""
    return vocab * d + positions * d + layers * (12 * d * d + 13 * d) + 2 * d


# --- every entry: a meta build gives exactly the recorded count -------------------------


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.name for e in ENTRIES])
def test_meta_build_matches_recorded_count(entry):
    model = build_model(entry.name)
    assert type(model).__name__ == entry.architecture
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert count_parameters(model) == entry.params


@pytest.mark.parametrize(("name", "published"), sorted(PUBLISHED.items()))
def test_recorded_counts_match_published_figures(name, published):
    assert model_entry(name).params == published


def test_gpt3_follows_the_paper():
    config = model_config("gpt3-175b")
    assert type(config).__name__ == "GPT2Config"
    assert (config.n_layer, config.n_embd, config.n_head) == (96, 12288, 96)
    assert config.n_embd // config.n_head == 128
    assert (config.n_positions, config.vocab_size) == (2048, 50257)
    assert model_entry("gpt3-175b").params == gpt2_count(50257, 2048, 12288, 96)


def test_hyperparameters_of_published_configs():
    llama70 = model_config("llama-2-70b")
    assert (llama70.hidden_size, llama70.num_hidden_layers) == (8192, 80)
    assert (llama70.num_attention_heads, llama70.num_key_value_heads) == (64, 8)
    assert model_config("llama-3-8b").vocab_size == 128256
    assert model_entry("llama-3-8b").config_dict()["rope_theta"] == 500000.0
    assert model_config("mistral-7b").sliding_window == 4096
    qwen = model_config("qwen2.5-7b")
    assert (qwen.hidden_size, qwen.num_key_value_heads, qwen.vocab_size) == (3584, 4, 152064)
    assert model_config("resnet-50").depths == [3, 4, 6, 3]
    assert model_config("mobilenet-v2").num_labels == 1001
    assert model_entry("gpt2").dtype == "float32"
    assert model_entry("gpt3-175b").dtype is None


# --- heads and ties -----------------------------------------------------------------------


def test_gpt2_head_is_tied_and_counted_once():
    model = build_model("gpt2")
    assert model.lm_head.weight is model.transformer.wte.weight
    every_name = sum(p.numel() for _, p in model.named_parameters(remove_duplicate=False))
    assert count_parameters(model) == every_name - model.lm_head.weight.numel()
    assert count_parameters(model) == gpt2_count(50257, 1024, 768, 12)


def test_llama_head_is_untied_and_counted():
    model = build_model("llama-2-7b")
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    base = build_model("llama-2-7b", task="encoder")
    assert type(base).__name__ == "LlamaModel"
    assert count_parameters(model) - count_parameters(base) == 32000 * 4096


def test_task_override_picks_the_class():
    base = build_model("gpt2", task=ModelTask.ENCODER)
    assert type(base).__name__ == "GPT2Model"
    assert count_parameters(base) == 124_439_808  # the tied head adds no parameters
    with pytest.raises(ValueError, match=r"unknown model task 'regression'.*causal-lm"):
        build_model("gpt2", task="regression")


# --- dtypes and devices -------------------------------------------------------------------


def test_dtype_defaults_to_published_weights_and_can_be_overridden():
    assert next(build_model("llama-3-8b").parameters()).dtype == torch.bfloat16
    assert next(build_model("llama-2-7b").parameters()).dtype == torch.float16
    assert next(build_model("gpt2").parameters()).dtype == torch.float32
    assert {p.dtype for p in build_model("llama-3-8b", dtype="fp32").parameters()} == {
        torch.float32
    }
    assert next(build_model("gpt2", dtype=torch.bfloat16).parameters()).dtype == torch.bfloat16


def test_quantized_dtype_is_refused():
    with pytest.raises(ValueError, match=r"'nf4'.*torchfit\.quantize"):
        build_model("gpt2", dtype="nf4")


def test_build_leaves_the_given_config_unchanged():
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64)
    before = config.to_dict()
    model = build_model(config, dtype="bf16")
    assert next(model.parameters()).dtype == torch.bfloat16
    assert config.to_dict() == before
    assert model.config is not config


def test_real_device_build_counts_like_meta():
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    real = build_model(config, device="cpu")
    assert {p.device.type for p in real.parameters()} == {"cpu"}
    assert count_parameters(real) == count_parameters(build_model(config))
    assert type(real).__name__ == "LlamaForCausalLM"


# --- forgiving lookups --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spelling", "name"),
    [
        ("GPT-2", "gpt2"),
        ("gpt_2", "gpt2"),
        ("  gpt2-XL ", "gpt2-xl"),
        ("openai-community/gpt2", "gpt2"),
        ("Llama-2-7B", "llama-2-7b"),
        ("llama_2_7b", "llama-2-7b"),
        ("LLAMA 2 70B", "llama-2-70b"),
        ("meta-llama/Llama-2-7b-hf", "llama-2-7b"),
        ("meta-llama/Meta-Llama-3-8B", "llama-3-8b"),
        ("Qwen2.5-7B", "qwen2.5-7b"),
        ("qwen2_5_7b", "qwen2.5-7b"),
        ("mistralai/Mistral-7B-v0.1", "mistral-7b"),
        ("bert-base-uncased", "bert-base"),
        ("google/vit-base-patch16-224", "vit-base"),
        ("ResNet50", "resnet-50"),
        ("EfficientNet-B7", "efficientnet-b7"),
        ("GPT-3", "gpt3-175b"),
    ],
)
def test_forgiving_lookup(spelling, name):
    assert model_entry(spelling).name == name


@pytest.mark.parametrize(
    ("name", "config_class"),
    [
        ("gpt2", "GPT2Config"),
        ("Llama-2-13B", "LlamaConfig"),
        ("mistral-7b", "MistralConfig"),
        ("qwen2.5-7b", "Qwen2Config"),
        ("phi-2", "PhiConfig"),
        ("bert-large", "BertConfig"),
        ("vit-base", "ViTConfig"),
        ("resnet-18", "ResNetConfig"),
        ("efficientnet-b0", "EfficientNetConfig"),
        ("convnext-tiny", "ConvNextConfig"),
        ("mobilenet-v2", "MobileNetV2Config"),
    ],
)
def test_model_config_class(name, config_class):
    config = model_config(name)
    assert type(config).__name__ == config_class
    assert model_config(name) is not config  # a fresh object each time


def test_config_object_is_returned_as_is():
    config = transformers.BertConfig(num_hidden_layers=1)
    assert model_config(config) is config


def _spellings(entries=ENTRIES):
    return [(entry, s) for entry in entries for s in (entry.name, *entry.aliases)]


@st.composite
def respelled(draw, entries=ENTRIES):
    entry, spelling = draw(st.sampled_from(_spellings(entries)))
    out = []
    for char in spelling:
        if char.isalnum():
            out.append(draw(st.sampled_from([char.lower(), char.upper()])))
        else:
            out.append(draw(st.sampled_from(["-", "_", " ", ".", ""])))
        if draw(st.integers(0, 9)) == 0:
            out.append(draw(st.sampled_from(["-", "_", " "])))
    pad = draw(st.sampled_from(["", " "]))
    return entry, pad + "".join(out) + pad


@settings(max_examples=300, deadline=None)
@given(respelled())
def test_respellings_resolve_to_the_same_entry(case):
    entry, spelling = case
    assert model_entry(spelling) == entry


@settings(max_examples=30, deadline=None)
@given(respelled([e for e in ENTRIES if e.builder is None]))
def test_respellings_give_the_same_config(case):
    entry, spelling = case
    assert model_config(spelling).to_dict() == entry.config().to_dict()


# --- errors -------------------------------------------------------------------------------


def test_unknown_name_lists_close_matches_and_the_local_path_option():
    with pytest.raises(ValueError, match=r"unknown model 'lama-2-7b'; close matches: llama-2-7b"):
        model_entry("lama-2-7b")
    with pytest.raises(ValueError, match=r"close matches: .*resnet-50.*config\.json"):
        model_config("resnet-05")
    with pytest.raises(ValueError, match=r"close matches: tinyllama-1\.1b"):
        model_entry("tinyll")  # the start of one name: suggested, not guessed


def test_unknown_name_without_close_matches_still_says_what_to_pass():
    with pytest.raises(ValueError, match=r"unknown model 'zzzzqqq'\. Pass a catalog name"):
        model_config("zzzzqqq")


@pytest.mark.parametrize(
    ("name", "candidates"),
    [
        ("llama-2", "llama-2-7b, llama-2-13b, llama-2-70b"),
        ("Llama-2-7", "llama-2-7b, llama-2-70b"),
        ("resnet", "resnet-18, resnet-34, resnet-50, resnet-152"),
        ("mistral", "mistral-7b, mistral-7b-v0.3, mixtral-8x7b, mixtral-8x22b"),  # mistralai/...
        ("qwen2.5-1", "qwen2.5-1.5b, qwen2.5-14b"),
        ("bert", "bert-base, bert-large"),
    ],
)
def test_ambiguous_name_lists_candidates(name, candidates):
    with pytest.raises(ValueError, match=f"{name!r} is ambiguous: it matches {candidates};"):
        model_config(name)


def test_wrong_types_are_refused():
    with pytest.raises(TypeError, match=r"model must be a model name .*; got 42"):
        model_config(42)
    with pytest.raises(TypeError, match="name must be a string or ModelEntry; got 42"):
        model_entry(42)
    with pytest.raises(TypeError, match=r"model must be an nn\.Module; got 'gpt2'"):
        count_parameters("gpt2")


# --- local config.json --------------------------------------------------------------------


def test_local_config_round_trip(tmp_path):
    saved = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=100, n_positions=64)
    saved.save_pretrained(tmp_path)
    for source in (
        tmp_path,
        tmp_path / "config.json",
        str(tmp_path),
        str(tmp_path / "config.json"),
    ):
        loaded = model_config(source)
        assert type(loaded).__name__ == "GPT2Config"
        assert loaded.to_diff_dict() == saved.to_diff_dict()
    model = build_model(tmp_path)
    assert type(model).__name__ == "GPT2LMHeadModel"  # inferred: GPT-2 is a causal LM
    assert count_parameters(model) == gpt2_count(100, 64, 32, 2)


@pytest.mark.parametrize(
    ("config", "built"),
    [
        (
            transformers.BertConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2),
            "BertModel",
        ),
        (transformers.ResNetConfig(depths=[1, 1, 1, 1]), "ResNetForImageClassification"),
        (
            transformers.ViTConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2),
            "ViTForImageClassification",
        ),
    ],
)
def test_class_is_inferred_for_configs_without_architectures(tmp_path, config, built):
    config.save_pretrained(tmp_path)
    assert type(build_model(tmp_path)).__name__ == built


def test_architectures_in_a_local_config_are_followed(tmp_path):
    config = transformers.BertConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2)
    config.architectures = ["BertForMaskedLM"]
    config.save_pretrained(tmp_path)
    model = build_model(tmp_path)
    assert type(model).__name__ == "BertForMaskedLM"


def test_missing_local_config(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no config\.json at"):
        model_config(tmp_path)  # an existing folder without config.json
    with pytest.raises(FileNotFoundError, match=r"no config\.json at"):
        model_config(tmp_path / "elsewhere" / "config.json")
    with pytest.raises(FileNotFoundError, match=r"no config\.json at"):
        model_config("./no-such-folder/config.json")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "is not a JSON config file"),
        (json.dumps({"n_layer": 2}), "has no 'model_type'"),
        (json.dumps({"model_type": "no-such-architecture"}), "unknown to transformers"),
    ],
)
def test_bad_local_config(tmp_path, content, message):
    (tmp_path / "config.json").write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        model_config(tmp_path)


# --- count_parameters ---------------------------------------------------------------------


def test_count_parameters_counts_ties_once():
    shared = nn.Linear(8, 8)
    model = nn.Sequential(shared, nn.ReLU(), shared, nn.Linear(8, 2))
    assert count_parameters(model) == 8 * 8 + 8 + 8 * 2 + 2


def test_count_parameters_sees_parameters_sharing_storage():
    first = nn.Linear(4, 4, bias=False)
    second = nn.Linear(4, 4, bias=False)
    second.weight = nn.Parameter(first.weight.data)  # a new Parameter on the same storage
    model = nn.ModuleList([first, second])
    assert count_parameters(model) == 16
    third = nn.Linear(4, 4, bias=False)
    assert count_parameters(nn.ModuleList([first, third])) == 32


def test_count_parameters_trainable_only():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    model[0].requires_grad_(False)
    assert count_parameters(model) == 20 + 10
    assert count_parameters(model, trainable_only=True) == 10


# --- the list itself ----------------------------------------------------------------------


def test_list_models_is_sorted_and_complete():
    names = [e.name for e in ENTRIES]
    assert len(names) == len(set(names)) >= 20
    keys = [(e.family, e.params, e.name) for e in ENTRIES]
    assert keys == sorted(keys)
    for required in ("gpt2", "gpt3-175b", "llama-3-70b", "qwen2.5-7b", "efficientnet-b7"):
        assert required in names
    assert {e.task for e in ENTRIES} == set(ModelTask)
    cnns = list_models(task="cnn")
    assert cnns and all(e.task is ModelTask.CNN for e in cnns)
    assert all(model_entry(e.name) is e for e in ENTRIES)
    assert all(e.source and e.notes for e in ENTRIES)


def test_entry_table_and_dict():
    entry = model_entry("llama-2-7b")
    assert isinstance(entry, ModelEntry)
    text = str(entry)
    assert text.startswith("ModelEntry llama-2-7b")
    assert "6,738,415,616 (6.74B)" in text
    assert "meta-llama/Llama-2-7b-hf" in text
    data = entry.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert data["task"] == "causal-lm"
    assert data["config"]["model_type"] == "llama"
    assert "config_json" not in data


# --- without transformers -----------------------------------------------------------------


def test_missing_transformers_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match=r"pip install 'torchfit\[hf\]'"):
        model_config("gpt2")
    with pytest.raises(ImportError, match=r"pip install 'torchfit\[hf\]'"):
        build_model("gpt2")
    assert model_entry("gpt2").params == 124_439_808  # the catalog itself needs no transformers
    assert len(list_models()) == len(ENTRIES)


# --- issue 15: a catalog people recognise ---------------------------------------------


def test_the_catalog_covers_the_families_people_name():
    assert len(ENTRIES) >= 60
    names = {e.name for e in ENTRIES}
    families = {e.family for e in ENTRIES}
    missing = [want for want in REQUIRED if want not in names | families]
    assert not missing


def test_every_entry_answers_to_the_hub_id_of_its_source():
    for entry in ENTRIES:
        if "config.json of " not in entry.source:
            assert entry.name in {"gpt3-175b", "lenet-5", "alexnet"}
            continue
        repo = entry.source.split("config.json of ")[1].split()[0]
        assert repo in entry.aliases, entry.name
        assert model_entry(repo) is entry


@pytest.mark.parametrize(
    ("name", "fields"),
    [
        (
            "llama-3.1-405b",
            {"num_hidden_layers": 126, "hidden_size": 16384, "intermediate_size": 53248},
        ),
        ("llama-3.2-1b", {"tie_word_embeddings": True, "head_dim": 64, "num_key_value_heads": 8}),
        ("mixtral-8x22b", {"num_local_experts": 8, "num_experts_per_tok": 2, "hidden_size": 6144}),
        (
            "qwen3-30b-a3b",
            {"num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768},
        ),
        ("qwen1.5-moe-a2.7b", {"num_experts": 60, "shared_expert_intermediate_size": 5632}),
        ("gemma-2-27b", {"head_dim": 128, "query_pre_attn_scalar": 144, "num_key_value_heads": 16}),
        ("phi-4", {"num_key_value_heads": 10, "vocab_size": 100352, "rope_theta": 250000}),
        ("falcon-7b", {"multi_query": True, "num_attention_heads": 71, "hidden_size": 4544}),
        ("flan-t5-xl", {"d_model": 2048, "d_ff": 5120, "feed_forward_proj": "gated-gelu"}),
        ("whisper-large-v3", {"num_mel_bins": 128, "vocab_size": 51866, "d_model": 1280}),
        (
            "deepseek-v2-lite",
            {"n_routed_experts": 64, "kv_lora_rank": 512, "first_k_dense_replace": 1},
        ),
    ],
)
def test_published_architecture_fields(name, fields):
    config = model_entry(name).config_dict()
    assert {key: config[key] for key in fields} == fields


def test_plain_torch_classics_build_on_any_device():
    lenet = build_model("LeNet")
    assert type(lenet).__name__ == "LeNet5"
    assert {p.device.type for p in lenet.parameters()} == {"meta"}
    real = build_model("lenet-5", device="cpu")
    assert real(torch.zeros(2, *model_entry("lenet").input_shape)).shape == (2, 10)
    alexnet = build_model("alexnet", dtype="bf16")
    assert {p.dtype for p in alexnet.parameters()} == {torch.bfloat16}
    with pytest.raises(ValueError, match=r"plain torch model .* build_model\('alexnet'\)"):
        model_config("alexnet")


def test_search_models_filters_by_name_family_and_hub_id():
    from torchfit.memory.catalog import search_models

    llamas = [e.name for e in search_models("llama")]
    assert {"llama-2-7b", "llama-3.1-405b", "tinyllama-1.1b", "smollm2-135m"} <= set(llamas)
    assert all(e.name in llamas for e in ENTRIES if "llama" in e.name)
    assert [e.name for e in search_models("Qwen/Qwen3-30B")] == ["qwen3-30b-a3b"]
    assert [e.name for e in search_models("MIXTRAL")] == ["mixtral-8x7b", "mixtral-8x22b"]
    assert search_models("") == ENTRIES
    assert search_models("no-such-model-anywhere") == []


def test_a_data_free_batch_is_read_as_one_sequence_per_row():
    """transformers reads packed sequences from position ids; meta/fake tensors cannot say."""
    masking = pytest.importorskip("transformers.masking_utils")
    from torch._subclasses.fake_tensor import FakeTensorMode

    from torchfit.memory.catalog.build import one_sequence_per_row

    meta = torch.arange(8, device="meta").expand(2, 8)
    with pytest.raises(RuntimeError, match="meta"):
        masking.find_packed_sequence_indices(meta)
    with FakeTensorMode():
        fake = torch.arange(8).expand(2, 8)
        assert masking.find_packed_sequence_indices(fake) is not None  # "traced": kept
        with one_sequence_per_row():
            assert masking.find_packed_sequence_indices(fake) is None
    with one_sequence_per_row():
        assert masking.find_packed_sequence_indices(meta) is None
        packed = torch.tensor([[0, 1, 0, 1]])  # real data still decides
        assert masking.find_packed_sequence_indices(packed) is not None
    assert masking.find_packed_sequence_indices.__name__ == "find_packed_sequence_indices"


def test_gemma2_with_eager_attention_estimates_through_the_meta_pass():
    transformers = pytest.importorskip("transformers")
    from torchfit.memory import estimate

    config = transformers.Gemma2Config(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        vocab_size=512,
        sliding_window=32,
        query_pre_attn_scalar=32,
        attn_implementation="eager",
        use_cache=False,  # as a training config is saved: transformers then reads positions
    )
    found = estimate(config, batch_size=2, seq_len=64, precision="bf16-true", device="cuda")
    assert found.activations > 0
