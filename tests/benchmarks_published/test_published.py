"""benchmarks/published_runs.toml holds what others measured: keep the data honest.

Every case cites its source and quotes it, names a quantity torchfit can compare, and the
held-out split holds fully specified cases only; the loader refuses a record it cannot
read. The benchmark's mapping of a setup onto `estimate` is checked on a few cases whose
reading is fixed by the cited sources.
"""

import sys
import warnings
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import published  # noqa: E402 - benchmarks/ is not a package
import published_data as data  # noqa: E402
import published_longest  # noqa: E402
import published_models  # noqa: E402

LOADED = data.load()
ALL = (*LOADED.cases, *LOADED.heldout)


@pytest.mark.parametrize("case", ALL, ids=[c.key for c in ALL])
def test_every_case_is_cited_and_quoted(case):
    assert case.source.strip()
    assert case.quote.strip()
    assert case.measured in data.MEASURED
    assert (case.measured in data.VERDICTS) == (case.value_bytes is None)
    if case.ambiguous:
        assert case.notes.strip()


def test_keys_are_unique_and_the_held_out_set_is_fully_specified():
    keys = [c.key for c in ALL]
    assert len(keys) == len(set(keys))
    assert LOADED.heldout  # the split exists
    assert not any(c.ambiguous for c in LOADED.heldout)
    assert {c.key for c in LOADED.heldout} <= set(keys)


def test_a_case_without_a_citation_is_refused():
    with pytest.raises(ValueError, match="citation"):
        data.Case(
            key="x",
            source=" ",
            quote="1 GB",
            measured="max_memory_allocated",
            value_bytes=10**9,
            model="gpt2",
            mode="inference",
            method="inference",
            precision="fp32",
            gpu=None,
            ambiguous=False,
            notes="",
        )


def test_every_compared_quantity_has_a_torchfit_twin():
    compared = {c.measured for c in ALL} - data.VERDICTS
    compared -= {"unspecified peak", "torch.cuda.memory_allocated"}  # reported as not comparable
    assert compared <= set(published.QUANTITY)


def case(key):
    return next(c for c in ALL if c.key == key)


def test_litgpt_runs_train_an_untied_head():
    # LitGPT's GPT keeps wte and lm_head apart; Gemma's checkpoint ties them
    model, _ = published.setting(case("hub_gemma_7b_lora_oom"))
    assert model.tie_word_embeddings is False


def test_lora_on_the_head_and_litgpt_target_names():
    _, kwargs = published.setting(case("hub_gemma_7b_lora_oom"))
    assert set(kwargs["lora_targets"]) == {"query", "key", "value", "projection", "mlp", "head"}
    assert kwargs["lora_rank"] == 16


def test_an_oom_verdict_of_unstated_length_is_decided_at_one_token():
    _, kwargs = published.setting(case("lg_inf_codellama34b_bf16_oom"))
    assert kwargs["seq_len"] == 1
    with pytest.raises(published.NotExpressible, match="sequence length"):
        published.setting(case("tt_3b_baseline"))  # a figure needs its length


def test_dora_is_not_read_as_lora():
    with pytest.raises(published.NotExpressible, match="DoRA"):
        published.setting(case("peft_mmqa_dora_r32"))


def test_litgpt_nf4_precisions_map_to_double_quant():
    _, plain = published.setting(case("lg_llama2_7b_qlora_mb1"))
    _, dq = published.setting(case("lg_llama2_7b_qlora_dq_mb1"))
    assert plain["dtype"] == dq["dtype"] == "nf4"
    assert plain["double_quant"] is False
    assert dq.get("double_quant", True) is True


def test_sources_group_by_publication():
    assert published.source_of(case("lq_falcon7b_fp32")) == "Lit-GPT quantization tutorial"
    assert published.source_of(case("hf_octocoder_bf16")) == "HF LLM inference guide"
    assert published.source_of(case("tt_3b_packed")) == "pytorch/torchtune"


def test_torchvision_vit_l_16_has_torchvisions_parameter_count():
    # torchvision ViT_L_16_Weights.IMAGENET1K_V1.meta["num_params"]
    model = published_models.torchvision_vit_l_16()
    assert sum(p.numel() for p in model.parameters()) == 304_326_632


def test_rasbt_loop_keeps_the_last_gradients_through_the_forward():
    """zero_grad comes between forward and backward, as in 01_pytorch-vit.py."""
    net = torch.nn.Linear(4, 3)
    seen = []
    net.register_forward_hook(lambda m, i, o: seen.append(m.weight.grad is not None))
    step = published_models.rasbt_step(accumulation=1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x, y = torch.randn(2, 4), torch.tensor([0, 1])
    step(net, opt, x, y)
    step(net, opt, x, y)
    assert seen == [False, True]


def test_rasbt_accumulation_steps_then_clears():
    net = torch.nn.Linear(4, 3)
    seen = []
    net.register_forward_hook(lambda m, i, o: seen.append(m.weight.grad is not None))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    published_models.rasbt_step(accumulation=4)(net, opt, torch.randn(2, 4), torch.tensor([0, 1]))
    assert seen == [False, True, True, True]
    assert net.weight.grad is None


def test_litgpt_quantizes_the_head_and_transformers_does_not():
    # Fabric's BitsandbytesPrecision converts every nn.Linear, the LM head included
    _, litgpt = published.setting(case("lg_llama2_7b_qlora_mb1"))
    assert litgpt["quantize_head"] is True
    _, hf = published.setting(case("hf_octocoder_4bit"))
    assert "quantize_head" not in hf


def test_prem_runs_use_the_base_config_and_keep_the_head_in_16_bits():
    # BitsAndBytesConfig(load_in_4bit, nf4, double quant) through transformers: lm_head stays
    model, kwargs = published.setting(case("prem_llama2_7b_int4"))
    assert model == "llama-2-7b"
    assert kwargs["dtype"] == "nf4"
    assert kwargs["double_quant"] is True
    assert "quantize_head" not in kwargs
    assert kwargs["mode"] == "inference"
    assert (kwargs["seq_len"], kwargs["max_new_tokens"]) == (19, 512)  # generate()
    assert case("prem_llama2_7b_int4").ambiguous  # how many tokens were generated: not logged
    model, kwargs = published.setting(case("prem_mistral_7b_fp16"))
    assert model == "mistral-7b"
    assert kwargs["dtype"] == "fp16"
    assert published.source_of(case("prem_mistral_7b_fp16")) == "Prem AI engine benchmarks"
    assert published.CARDS[case("prem_mistral_7b_fp16").gpu] == "A100 80GB"


def test_qwen_speed_benchmark_runs_generate_2048_tokens_after_the_input():
    model, kwargs = published.setting(case("qwen25_3b_in6144"))
    assert model == "qwen2.5-3b"
    assert kwargs["dtype"] == "bf16"
    assert kwargs["mode"] == "inference"
    assert (kwargs["seq_len"], kwargs["max_new_tokens"]) == (6144, 2048)
    assert kwargs["attn_implementation"] == "flash_attention_2"
    assert published.source_of(case("qwen25_3b_in6144")) == "Qwen2.5 speed benchmark"
    assert published.CARDS[case("qwen25_3b_in6144").gpu] == "A100 80GB"


def test_litgpt_phi_runs_use_the_fused_tanh_gelu_litgpt_calls():
    config, _ = published.setting(case("lg_phi15_lora_mb1"))
    assert config.hidden_act == "gelu_pytorch_tanh"  # transformers' Phi: gelu_new
    assert config.tie_word_embeddings is False
    config, kwargs = published.setting(case("lg_stablelm3b_lora_mb1"))
    assert config.hidden_act == "gelu"  # already PyTorch's kernel: left as it is
    assert kwargs["lora_targets"] == ["query", "value"]
    assert kwargs["loss_chunk_size"] == 128


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        ("torch 2.1.0.dev20230623+cu118", "AdamBefore104780"),
        ("torch 2.0.1", "AdamBefore104780"),
        ("torch 2.1.0.dev20230801", "Adam"),
        ("PyTorch 2.1.0+cu121", "Adam"),
        ("torch version not stated", "Adam"),
    ],
)
def test_a_run_is_traced_with_the_adam_of_its_pytorch(written, expected):
    assert published_models.adam_of(written).__name__ == expected


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        ("torch 2.1.0.dev20230623+cu118", True),
        ("torch 2.0.1", True),
        ("torch 2.2.0", False),
        ("torch version not stated", False),
    ],
)
def test_a_run_before_pytorch_2_2_ran_flash_attention_v1(written, expected):
    assert published_models.flash_v1_of(written) is expected


@pytest.mark.parametrize(("flash_v1", "copies"), [(False, 1), (True, 5)])
def test_flash_attention_v1_copies_multihead_attentions_16_bit_tensors(flash_v1, copies):
    """Sequence-first q, k and v reshaped into copies, and the batch-first output copied.

    Besides the copy of the input the in-projection makes in either case.
    """
    from cuda_target import CloneSizes
    from torchfit.memory.kernels.cuda import FusedSdpa

    block = published_models._EncoderBlock(4, 32, 64, flash_v1=flash_v1).to(torch.bfloat16)
    x = torch.randn(2, 9, 32, dtype=torch.bfloat16, requires_grad=True)
    clones = CloneSizes()
    with FusedSdpa().installed(), clones:  # CPU's flash op, as a CUDA trace runs
        block(x)
    assert clones.sizes.count(x.nbytes) == copies


def _step_peak(optimizer_class):
    from torchfit.memory import measure_peak

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 256))
    opt = optimizer_class(net.parameters(), lr=1e-3)
    net(torch.randn(4, 256)).sum().backward()
    opt.step()  # the state exists, as in a steady step
    net(torch.randn(4, 256)).sum().backward()
    return measure_peak(opt.step, track=(net, opt)).increment, net


def test_the_june_2023_adam_holds_one_more_parameter_sized_list_than_todays():
    """Real CPU allocations: the step before #104780 adds sqrt(v)/bc and + eps out of place."""
    params = 2 * (256 * 256 + 256) * 4
    today, _ = _step_peak(lambda p, lr: torch.optim.Adam(p, lr=lr, foreach=True))
    before, _ = _step_peak(published_models.AdamBefore104780)
    assert before - today == params


def test_the_june_2023_adam_updates_as_adam_does():
    _, reference = _step_peak(lambda p, lr: torch.optim.Adam(p, lr=lr, foreach=True))
    _, replayed = _step_peak(published_models.AdamBefore104780)
    for a, b in zip(reference.parameters(), replayed.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_a_card_named_by_its_memory_only_is_an_a100_of_that_size():
    card = published.card_of(case("unsloth_hf_l33_70b_48gb_oom"))  # "48 GB VRAM (card not named)"
    a100 = published.card_of(case("qwen25_3b_in6144"))
    assert card.total == 48 * 2**30 != a100.total
    assert card.sm_count == a100.sm_count  # the A100's context: only the memory differs
    assert published.card_of(case("lg_llama2_7b_lora_mb1")).total == 40 * 2**30


def test_unsloths_baseline_is_the_hugging_face_qlora_recipe():
    model, kwargs = published.setting(case("unsloth_hf_l31_8b_24gb_fits"))
    assert model == "meta-llama/Llama-3.1-8B-Instruct"
    assert (kwargs["dtype"], kwargs["precision"], kwargs["double_quant"]) == (
        "nf4",
        "bf16-mixed",
        True,
    )
    assert "kbit_prepare" not in kwargs  # the default of a 4-bit *-mixed step: prepared
    assert kwargs["optimizer"] == "adamw"  # TrainingArguments' optim='adamw_torch'
    assert kwargs["gradient_checkpointing"] is True
    assert kwargs["attn_implementation"] == "flash"
    assert kwargs["lora_rank"] == 32
    assert set(kwargs["lora_targets"]) == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    }
    assert (kwargs["set_to_none"], kwargs["keep_output"]) == (True, False)


class _Device:
    """What `on_device` returns, reduced to the two totals a verdict could read."""

    def __init__(self, total, needed):
        self.device_total, self.device_needed = total, needed


def test_a_verdict_decides_on_the_oom_line_not_the_device_total(monkeypatch):
    run = case("lg_llama2_7b_lora_mb4_oom")
    card = published.card_of(run)
    # allocator slack that a full card would reuse: device_total over, the OOM line under
    device = _Device(total=card.total + 2**30, needed=card.total - 2**30)
    monkeypatch.setattr(published, "on_device", lambda _case: (device, card))
    row = published.compare(run, heldout=False)
    assert (row.verdict, row.predicted) == ("fits", card.total - 2**30)


def test_a_maximum_context_row_reports_the_longest_length_that_fits(monkeypatch):
    run = case("unsloth_hf_l31_8b_24gb_fits")

    def on_device(c):  # 1 GiB a token above 10 GiB: 14 tokens fit in 24 GiB
        return _Device(0, (10 + (c.seq_len or 1)) * 2**30), published.card_of(c)

    monkeypatch.setattr(published, "on_device", on_device)
    row = published.compare(run, heldout=False)
    assert (row.verdict, row.longest) == ("oom", 14)  # 5,789 tokens would not fit here
    none = published.compare(case("unsloth_hf_l31_8b_8gb_oom"), heldout=False)
    assert (none.verdict, none.longest) == ("oom", 0)
    text = published.report([row, none], LOADED.sources)
    assert "| unsloth_hf_l31_8b_24gb_fits | 24 GB VRAM (card not named) | 5,789 | 14 |" in text
    assert "- `unsloth_context_length`: The Unsloth column" in text


@pytest.mark.parametrize(
    ("needed", "capacity", "start", "expected"),
    [
        (lambda n: 1000 + 3 * n, 4000, 700, 1000),  # a line: found exactly
        (lambda n: 1000 + 3 * n + n * n // 5000, 40_000, 5000, 8350),  # bends upwards
        (lambda n: 5000 + n, 4000, 700, 0),  # not even one token
        (lambda n: n, 10**9, 1700, 10_000),  # the model's limit
    ],
)
def test_longest_fitting_finds_the_last_length_under_the_capacity(
    needed, capacity, start, expected
):
    found = published_longest.longest_fitting(needed, capacity, start=start, limit=10_000)
    assert abs(found - expected) <= 0.005 * max(expected, 1)
    assert found == 0 or needed(found) <= capacity


def test_longest_fitting_takes_few_estimates():
    calls = []

    def needed(n):
        calls.append(n)
        return 9 * 2**30 + n * 2_600_000  # the 8B QLoRA's slope: about 2.5 MiB a token

    found = published_longest.longest_fitting(needed, 24 * 2**30, start=5789, limit=131_072)
    assert len(calls) <= 6
    assert needed(found) <= 24 * 2**30 < needed(found + 30)  # within 0.5% of the longest


#: LitGPT's config-hub files at 2685705 (config_hub/finetune/<model>/<method>.yaml), the
#: keys that decide memory: the table's rows were run from these configs.
CONFIG_HUB = {
    "hub_llama2_7b_qlora": {
        "precision": "bf16-true", "quantize": "bnb.nf4", "lora_r": 32, "lora_dropout": 0.05,
        "lora_query": True, "lora_key": False, "lora_value": True, "lora_projection": False,
        "lora_mlp": False, "lora_head": False,
        "train": {"global_batch_size": 8, "micro_batch_size": 2, "max_seq_length": 512},
        "optimizer": {"class_path": "torch.optim.AdamW"},
    },
    "hub_llama3_8b_lora": {
        "precision": "bf16-true", "lora_r": 32, "lora_dropout": 0.05, "lora_query": True,
        "lora_key": False, "lora_value": True, "lora_projection": False, "lora_mlp": False,
        "lora_head": False,
        "train": {"global_batch_size": 8, "micro_batch_size": 1, "max_seq_length": 512},
        "optimizer": {"class_path": "torch.optim.AdamW"},
    },
    "hub_gemma_2b_lora": {
        "precision": "bf16-true", "lora_r": 8, "lora_dropout": 0.1, "lora_query": True,
        "lora_key": True, "lora_value": True, "lora_projection": True, "lora_mlp": True,
        "lora_head": True,
        "train": {"global_batch_size": 6, "micro_batch_size": 2, "max_seq_length": 512},
        "optimizer": {"class_path": "torch.optim.AdamW"},
    },
    "hub_stablelm3b_qlora": {
        "precision": "bf16-true", "quantize": "bnb.nf4", "lora_r": 32, "lora_dropout": 0.05,
        "lora_query": True, "lora_value": True,
        "train": {"global_batch_size": 8, "micro_batch_size": 1, "max_seq_length": 512},
        "optimizer": {"class_path": "torch.optim.AdamW"},
    },
    "hub_tinyllama_full": {
        "precision": "bf16-true",
        "train": {"global_batch_size": 32, "micro_batch_size": 4, "max_seq_length": 512},
        "optimizer": {"class_path": "torch.optim.AdamW"},
    },
}  # fmt: skip


@pytest.mark.parametrize("key", sorted(CONFIG_HUB))
def test_a_config_hub_row_is_the_step_its_litgpt_config_makes(key):
    """The benchmark's reading of a row and `Step.from_recipe` of its config agree."""
    from torchfit.memory import Step, estimate

    case = next(c for c in ALL if c.key == key)
    model, kwargs = published.setting(case)
    quantized = key.endswith("qlora")
    version = {"bitsandbytes_version": kwargs["bitsandbytes_version"]} if quantized else {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step = Step.from_recipe(CONFIG_HUB[key], **version)
    # only the full fine-tune's loss (chunked over whole logits) is said to be not modelled
    assert bool(caught) == key.endswith("full")
    assert estimate(model, step=step).total == estimate(model, **kwargs).total
