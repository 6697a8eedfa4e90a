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
}


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


def _spellings():
    return [(entry, s) for entry in ENTRIES for s in (entry.name, *entry.aliases)]


@st.composite
def respelled(draw):
    entry, spelling = draw(st.sampled_from(_spellings()))
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
@given(respelled())
def test_respellings_give_the_same_config(case):
    entry, spelling = case
    assert model_config(spelling).to_dict() == entry.config().to_dict()


# --- errors -------------------------------------------------------------------------------


def test_unknown_name_lists_close_matches_and_the_local_path_option():
    with pytest.raises(ValueError, match=r"unknown model 'lama-2-7b'; close matches: llama-2-7b"):
        model_entry("lama-2-7b")
    with pytest.raises(ValueError, match=r"close matches: .*resnet-50.*config\.json"):
        model_config("resnet-05")
    with pytest.raises(ValueError, match=r"close matches: mistral-7b"):
        model_entry("mistral")  # the start of one name: suggested, not guessed


def test_unknown_name_without_close_matches_still_says_what_to_pass():
    with pytest.raises(ValueError, match=r"unknown model 'zzzzqqq'\. Pass a catalog name"):
        model_config("zzzzqqq")


@pytest.mark.parametrize(
    ("name", "candidates"),
    [
        ("llama-2", "llama-2-7b, llama-2-13b, llama-2-70b"),
        ("Llama-2-7", "llama-2-7b, llama-2-70b"),
        ("resnet", "resnet-18, resnet-50, resnet-152"),
        ("bert", "bert-base, bert-large"),
    ],
)
def test_ambiguous_name_lists_candidates(name, candidates):
    with pytest.raises(ValueError, match=f"{name!r} is ambiguous: it matches {candidates};"):
        model_config(name)


def test_wrong_types_are_refused():
    with pytest.raises(TypeError, match="got int"):
        model_config(42)
    with pytest.raises(TypeError, match="got int"):
        model_entry(42)
    with pytest.raises(TypeError, match=r"needs an nn\.Module; got str"):
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
