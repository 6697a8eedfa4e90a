"""``torchfit plan --recipe FILE``: a torchtune or LitGPT config as the step, flags beside it."""

import json

import pytest

from torchfit.cli import main
from torchfit.memory import Step

# LitGPT config_hub/finetune/llama-3.1-8b/qlora.yaml at 2685705, the keys that count
LITGPT_QLORA = """\
precision: bf16-true
quantize: bnb.nf4
lora_r: 32
lora_dropout: 0.05
lora_query: true
lora_value: true
train:
  global_batch_size: 8
  micro_batch_size: 2
  max_seq_length: 512
"""
# torchtune recipes/configs/llama3_1/8B_qlora_single_device.yaml at bd2a0fc, likewise
TORCHTUNE_QLORA = """\
model:
  _component_: torchtune.models.llama3_1.qlora_llama3_1_8b
  lora_attn_modules: ['q_proj', 'v_proj', 'output_proj']
  apply_lora_to_mlp: True
  lora_rank: 8
batch_size: 2
optimizer:
  _component_: torch.optim.AdamW
  fused: True
loss:
  _component_: torchtune.modules.loss.LinearCrossEntropyLoss
gradient_accumulation_steps: 8
dtype: bf16
enable_activation_checkpointing: True
compile: True
"""


@pytest.fixture
def litgpt(tmp_path):
    path = tmp_path / "qlora.yaml"
    path.write_text(LITGPT_QLORA)
    return str(path)


@pytest.fixture
def torchtune(tmp_path):
    path = tmp_path / "8B_qlora_single_device.yaml"
    path.write_text(TORCHTUNE_QLORA)
    return str(path)


def _plan_json(argv, capsys):
    assert main([*argv, "--json"]) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out), captured.err


def test_the_plan_is_the_steps_the_config_makes(litgpt, capsys):
    data, _ = _plan_json(["plan", "llama-3.1-8b", "--gpu", "A10G", "--recipe", litgpt], capsys)
    assert data["settings"]["step"] == Step.from_recipe(litgpt).to_dict()


def test_flags_beside_the_recipe_fill_what_it_leaves_open(torchtune, capsys):
    argv = ["plan", "llama-3.1-8b", "--gpu", "RTX 4090", "--recipe", torchtune, "--seq", "1024"]
    data, err = _plan_json(argv, capsys)
    step = data["settings"]["step"]
    assert (step["seq_len"], step["loss_chunk_size"], step["quantization"]) == (1024, 128, "nf4")
    assert step["optimizer"] == "adamw-fused" and step["gradient_accumulation_steps"] == 8
    assert "note: torchtune config: compile: True" in err  # not modelled, said on stderr


def test_a_flag_equal_to_its_default_still_counts_as_given(litgpt, capsys):
    # --optimizer adamw is the flag's default, but given here it contradicts the config
    argv = ["plan", "llama-3.1-8b", "--gpu", "A10G", "--recipe", litgpt, "--optimizer", "adamw"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--optimizer" in err and "paged-adamw" in err


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--seq", "4096"], "seq_len=4096 contradicts the LitGPT config"),
        (["--inference"], "leave --inference and --dtype out"),
        (["--dtype", "nf4"], "leave --inference and --dtype out"),
    ],
)
def test_what_the_recipe_cannot_take_is_one_line_and_exit_2(litgpt, extra, needle, capsys):
    assert main(["plan", "llama-3.1-8b", "--gpu", "A10G", "--recipe", litgpt, *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("torchfit: error:") and needle in err


def test_a_torchtune_config_without_a_length_asks_for_seq(torchtune, capsys):
    assert main(["plan", "llama-3.1-8b", "--gpu", "RTX 4090", "--recipe", torchtune]) == 2
    assert "pass seq_len=" in capsys.readouterr().err


def test_a_comparison_takes_the_recipe_too(litgpt, capsys):
    argv = ["plan", "llama-3.1-8b", "--gpu", "A100 80GB", "--gpu", "RTX 4090", "--recipe", litgpt]
    data, _ = _plan_json(argv, capsys)
    assert [row["gpu"] for row in data["rows"]] == [
        "NVIDIA A100 80GB SXM",
        "NVIDIA GeForce RTX 4090",
    ]
    assert {row["batch_size"] for row in data["rows"]} == {2}  # the config's micro-batch


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("lr: 0.0003\n", "neither torchtune's"),
        ("model: [unclosed\n", "is not a YAML file"),
        ("- a list\n", "expected a config mapping"),
    ],
)
def test_a_file_that_is_no_config_is_refused_naming_the_flag(tmp_path, text, needle, capsys):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    assert main(["plan", "llama-3.1-8b", "--gpu", "A10G", "--recipe", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("torchfit: error: argument --recipe:") and needle in err
    assert err.count("\n") == 1


def test_the_unsloth_recipe_by_name_with_its_length_replaced(capsys):
    argv = ["plan", "llama-3.1-8b", "--gpu", "RTX 4090", "--recipe", "unsloth", "--seq", "4096"]
    data, err = _plan_json(argv, capsys)
    step = data["settings"]["step"]
    assert (step["seq_len"], step["quantization"], step["kbit_prepare"]) == (4096, "nf4", False)
    assert "note: Unsloth recipe:" in err and "no --seq given" not in err
