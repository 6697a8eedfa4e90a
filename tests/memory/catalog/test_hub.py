"""Hub ids without the network: the catalog, the Hugging Face cache, and every failure.

No test reaches the network: ``HF_HUB_OFFLINE=1`` is set, or huggingface_hub's request
functions are replaced. The cache is built in ``tmp_path`` in huggingface_hub's layout
(``models--org--name/refs/main`` and ``snapshots/<hash>/config.json``).
"""

import json
import time

import pytest

transformers = pytest.importorskip("transformers")
hub_errors = pytest.importorskip("huggingface_hub.errors")

from torchfit.memory.catalog import (  # noqa: E402
    build_model,
    count_parameters,
    list_models,
    model_config,
    resolve_model,
)
from torchfit.memory.catalog.hub import (  # noqa: E402
    HubError,
    HubOptions,
    cached_config,
    hub_cache_dir,
    is_hub_id,
)

COMMIT = "0123456789abcdef0123456789abcdef01234567"
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 128,
    "bos_token_id": 0,
    "eos_token_id": 0,
}


def cache_snapshot(cache, repo_id, files, commit=COMMIT, ref="main"):
    """huggingface_hub's cache layout for one repo, as a download leaves it."""
    folder = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = folder / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / ref).write_text(commit, encoding="utf-8")
    for name, text in files.items():
        (snapshot / name).write_text(text, encoding="utf-8")
    return snapshot


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """HF_HUB_OFFLINE=1 with an empty HF_HOME: any request would be a bug."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def no_network(*args, **kwargs):
        pytest.fail(f"the network was asked: {args}")

    monkeypatch.setattr("huggingface_hub.get_hf_file_metadata", no_network)
    monkeypatch.setattr("huggingface_hub.hf_hub_download", no_network)
    return tmp_path / "home" / "hub"


def hub_ids():
    return [(alias, e) for e in list_models() for alias in e.aliases if is_hub_id(alias)]


def test_every_catalog_hub_id_resolves_offline_to_its_entry(offline):
    ids = hub_ids()
    assert len(ids) >= 60
    for alias, entry in ids:
        resolved = resolve_model(alias)
        assert resolved.source == "catalog", alias
        if entry.builder is None:
            assert resolved.config.to_dict() == entry.config().to_dict()


@pytest.mark.parametrize(
    "repo", ["meta-llama/Llama-3.1-8B", "mistralai/Mixtral-8x7B-v0.1", "google-t5/t5-small"]
)
def test_catalog_hub_ids_count_exactly_offline(offline, repo):
    entry = next(e for alias, e in hub_ids() if alias == repo)
    assert count_parameters(build_model(repo)) == entry.params


@pytest.mark.parametrize("variable", ["HF_HOME", "HF_HUB_CACHE"])
def test_a_hub_id_only_in_the_local_cache_plans(offline, monkeypatch, tmp_path, variable):
    cache = tmp_path / "elsewhere"
    if variable == "HF_HOME":
        monkeypatch.setenv("HF_HOME", str(cache))
        cache /= "hub"
    else:
        monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    cache_snapshot(cache, "acme/tiny-llama", {"config.json": json.dumps(TINY_LLAMA)})
    assert hub_cache_dir() == cache
    resolved = resolve_model("acme/tiny-llama")
    assert resolved.source == "cache"
    assert resolved.config.num_hidden_layers == 2
    built = build_model("acme/tiny-llama")
    local = transformers.LlamaConfig(**{k: v for k, v in TINY_LLAMA.items() if k != "model_type"})
    assert count_parameters(built) == count_parameters(build_model(local))

    from torchfit.memory import estimate
    from torchfit.memory.plan import plan_card

    est = estimate("acme/tiny-llama", batch_size=2, seq_len=64, device="cpu")
    assert est.weights == 4 * count_parameters(built)
    plan = plan_card("acme/tiny-llama", "RTX 3060", seq_len=64)
    assert plan.fits
    assert plan.settings.model == "acme/tiny-llama"


def test_the_cache_follows_refs_and_revisions(tmp_path):
    cache_snapshot(tmp_path, "acme/model", {"config.json": "{}"}, commit="a" * 40)
    other = tmp_path / "models--acme--model" / "snapshots" / ("b" * 40)
    other.mkdir()
    (other / "config.json").write_text("{}", encoding="utf-8")
    found = cached_config("acme/model", HubOptions(cache_dir=tmp_path))
    assert found.parent.name == "a" * 40  # refs/main names the commit
    pinned = cached_config("acme/model", HubOptions(cache_dir=tmp_path, revision="b" * 40))
    assert pinned.parent.name == "b" * 40
    assert cached_config("acme/model", HubOptions(cache_dir=tmp_path, revision="v2")) is None
    assert cached_config("acme/other", HubOptions(cache_dir=tmp_path)) is None


def test_an_unknown_id_offline_fails_fast_in_one_line(offline):
    start = time.perf_counter()
    with pytest.raises(HubError) as info:
        resolve_model("acme/llama-3.1-8b-finetuned")
    elapsed = time.perf_counter() - start
    message = str(info.value)
    assert elapsed < 3
    assert "\n" not in message
    assert "'acme/llama-3.1-8b-finetuned'" in message
    assert "HF_HUB_OFFLINE" in message
    assert "close ones: llama-3.1-8b" in message
    assert isinstance(info.value, ValueError)  # the CLI's usage error
    assert isinstance(info.value, OSError)  # what from_pretrained raises


def hub_failure(monkeypatch, tmp_path, error):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    calls = []

    def fail(url, **kwargs):
        calls.append(kwargs)
        raise error

    monkeypatch.setattr("huggingface_hub.get_hf_file_metadata", fail)
    return calls


def http_error(cls, text):
    error = cls.__new__(cls)  # without an HTTP response: only the type and text matter
    Exception.__init__(error, text)
    return error


@pytest.mark.parametrize(
    ("error", "needles"),
    [
        (
            http_error(hub_errors.GatedRepoError, "401 Client Error. Access restricted"),
            ["repository is gated", "hf auth login", "HF_TOKEN"],
        ),
        (
            http_error(hub_errors.RepositoryNotFoundError, "401 Client Error. Not found"),
            ["no such repository, or it is private", "hf auth login", "HF_TOKEN"],
        ),
        (
            http_error(hub_errors.RevisionNotFoundError, "404 Client Error. Revision"),
            ["no such revision"],
        ),
        (ConnectionError("[Errno -2] Name or service not known"), ["no answer from the Hub"]),
    ],
)
def test_hub_failures_say_why_and_what_to_do(monkeypatch, tmp_path, error, needles):
    calls = hub_failure(monkeypatch, tmp_path, error)
    start = time.perf_counter()
    with pytest.raises(HubError) as info:
        model_config("acme/private-model")
    assert time.perf_counter() - start < 3
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("loading 'acme/private-model' from the Hugging Face Hub failed")
    for needle in needles:
        assert needle in message
    assert len(calls) == 1  # one request, never retried
    assert calls[0]["timeout"] <= 5


def test_a_downloaded_config_is_read_then_found_in_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    requests = []

    def metadata(url, **kwargs):
        requests.append(url)

    def download(repo_id, filename, **kwargs):
        assert filename == "config.json"  # never the weights
        snapshot = cache_snapshot(tmp_path, repo_id, {filename: json.dumps(TINY_LLAMA)})
        return str(snapshot / filename)

    monkeypatch.setattr("huggingface_hub.get_hf_file_metadata", metadata)
    monkeypatch.setattr("huggingface_hub.hf_hub_download", download)
    first = resolve_model("acme/fresh-model")
    assert (first.source, first.config.hidden_size) == ("hub", 64)
    again = resolve_model("acme/fresh-model")
    assert again.source == "cache"
    assert len(requests) == 1


REMOTE_CONFIG = """from transformers import PretrainedConfig


class NewArchConfig(PretrainedConfig):
    model_type = "acme_newarch"

    def __init__(self, hidden_size=16, **kwargs):
        self.hidden_size = hidden_size
        super().__init__(**kwargs)
"""


def test_remote_code_runs_only_when_trusted(offline):
    config = {
        "model_type": "acme_newarch",
        "auto_map": {"AutoConfig": "configuration_newarch.NewArchConfig"},
        "hidden_size": 48,
    }
    files = {"config.json": json.dumps(config), "configuration_newarch.py": REMOTE_CONFIG}
    cache_snapshot(offline, "acme/newarch", files)
    with pytest.raises(ValueError, match=r"model_type 'acme_newarch'.*--trust-remote-code") as info:
        resolve_model("acme/newarch")
    assert "runs the repository's own Python code" in str(info.value)
    trusted = resolve_model("acme/newarch", trust_remote_code=True)
    assert type(trusted.config).__name__ == "NewArchConfig"
    assert trusted.config.hidden_size == 48


def test_a_local_folder_with_an_unknown_type_names_the_flag(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "acme_newarch"}))
    with pytest.raises(ValueError, match=r"unknown to transformers.*--trust-remote-code"):
        model_config(tmp_path)


@pytest.mark.parametrize("name", ["", "   ", "\t"])
def test_empty_names_are_refused(name):
    with pytest.raises(ValueError, match=r"empty model name.*'meta-llama/Llama-3\.1-8B'"):
        resolve_model(name)


@pytest.mark.parametrize("value", [42, 3.5, None, ["gpt2"], b"gpt2"])
def test_wrong_types_are_refused_with_what_to_pass(value):
    with pytest.raises(TypeError, match=rf"a model is a name .*got {type(value).__name__}"):
        resolve_model(value)
