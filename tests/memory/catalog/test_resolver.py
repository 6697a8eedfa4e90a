"""One model resolver and one builder: memory, the device-map planner and quantize agree.

Each test resolves or builds the same models through every caller and fails if one of
them picks another config, class or set of tensors.
"""

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("bitsandbytes")

from torchfit.memory.catalog import build_model, count_parameters, model_config  # noqa: E402
from torchfit.memory.catalog.build import instantiate, model_class_for  # noqa: E402
from torchfit.memory.catalog.hub import is_hub_id, looks_like_path  # noqa: E402
from torchfit.memory.catalog.resolve import resolve_config  # noqa: E402
from torchfit.memory.device_map.planner import Planner  # noqa: E402
from torchfit.quantize import quantized_footprint, weights_footprint  # noqa: E402

TOKENS = {"bos_token_id": 0, "eos_token_id": 0}


def _configs():
    return {
        "gpt2 without architectures": transformers.GPT2Config(
            n_layer=2, n_embd=64, n_head=2, vocab_size=100, n_positions=128, **TOKENS
        ),
        "llama with architectures": transformers.LlamaConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            vocab_size=100,
            max_position_embeddings=128,
            architectures=["LlamaForCausalLM"],
            **TOKENS,
        ),
        "bert without architectures": transformers.BertConfig(
            num_hidden_layers=1, hidden_size=32, num_attention_heads=2, vocab_size=100
        ),
    }


@pytest.mark.parametrize("name", list(_configs()))
def test_memory_and_quantize_build_the_same_model(name):
    config = _configs()[name]
    built = build_model(config, dtype="fp32")
    assert type(built) is type(instantiate(config, model_class_for(config), built.dtype))
    params = count_parameters(built)
    assert quantized_footprint(config, bits=8, device="cpu").parameters == params
    assert weights_footprint(config, "fp32", device="cpu").parameters == params


@pytest.mark.parametrize("name", ["gpt2 without architectures", "llama with architectures"])
def test_the_device_map_planner_builds_the_same_tensors(name):
    config = _configs()[name]
    planner = Planner(
        config,
        ["A100 80GB"],
        batch=1,
        seq=None,
        dtype="fp16",
        bits=None,
        quant_type="nf4",
        double_quant=True,
        kv_cache=False,
        attn="sdpa",
        reserve=0,
        context_bytes=0,
    )
    built = build_model(config, dtype="fp16")
    tensors = {**dict(built.named_parameters()), **dict(built.named_buffers())}
    assert set(planner.sizes) == set(tensors)


@pytest.mark.parametrize("source", ["gpt2", "GPT-2", "llama-3-8b", "meta-llama/Llama-2-7b-hf"])
def test_catalog_names_resolve_alike_with_and_without_the_hub(source):
    offline = model_config(source).to_dict()
    assert resolve_config(source).to_dict() == offline
    assert resolve_config(source, hub=True).to_dict() == offline


def test_a_local_folder_resolves_alike_everywhere(tmp_path):
    config = _configs()["llama with architectures"]
    config.save_pretrained(tmp_path)
    expected = model_config(tmp_path).to_dict()
    for source in (tmp_path, str(tmp_path)):
        assert resolve_config(source).to_dict() == expected
        assert resolve_config(source, hub=True).to_dict() == expected
    params = count_parameters(build_model(tmp_path))
    assert quantized_footprint(str(tmp_path), bits=4, device="cpu").parameters == params


def test_the_hub_is_asked_only_for_hub_ids(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # an empty cache
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    asked = []

    def offline(url, **kwargs):
        asked.append(url)
        raise OSError("We couldn't connect to 'https://huggingface.co'")

    monkeypatch.setattr("huggingface_hub.get_hf_file_metadata", offline)
    with pytest.raises(ValueError, match="not-a-model"):
        resolve_config("not-a-model", hub=True)
    with pytest.raises(ValueError, match="some-org/some-model"):
        resolve_config("some-org/some-model", hub=False)  # the catalog's error
    with pytest.raises(OSError, match=r"Hugging Face Hub failed.*pass the path"):
        resolve_config("some-org/some-model", hub=True)
    with pytest.raises(FileNotFoundError, match=r"no config\.json at"):
        resolve_config("./no/such/folder", hub=True)
    assert len(asked) == 1
    assert "some-org/some-model" in asked[0]


@pytest.mark.parametrize(
    ("text", "path", "hub"),
    [
        ("gpt2", False, False),
        ("org/model", False, True),
        ("./model", True, False),
        ("~/models/llama", True, False),
        ("/abs/model", True, False),
        ("a/b/c", True, False),
        ("config.json", True, False),
        ("org/", False, False),
        ("/model", True, False),
    ],
)
def test_path_and_hub_id_forms(text, path, hub):
    assert looks_like_path(text) is path
    assert is_hub_id(text) is hub
