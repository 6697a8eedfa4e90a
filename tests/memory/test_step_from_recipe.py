"""`Step.from_recipe`: torchtune's and LitGPT's fine-tuning configs read as their code runs them.

The YAML below keeps the keys that decide memory of the projects' own configs, with their
values: torchtune ``recipes/configs/llama3_1/8B_{qlora,full}_single_device.yaml`` at
bd2a0fc, LitGPT ``config_hub/finetune/llama-3.1-8b/qlora.yaml`` at 2685705.
"""

import dataclasses
import warnings

import pytest
import yaml

from tiny_configs import tiny_llama
from torchfit._core.optimizers import parse_optimizer
from torchfit.memory import Step, estimate
from torchfit.memory.step import NotModelledWarning
from torchfit.memory.step.recipes import TORCHTUNE_OPTIMIZERS, recipe_fields

transformers = pytest.importorskip("transformers")

TORCHTUNE_QLORA = """
model:
  _component_: torchtune.models.llama3_1.qlora_llama3_1_8b
  lora_attn_modules: ['q_proj', 'v_proj', 'output_proj']
  apply_lora_to_mlp: True
  apply_lora_to_output: False
  lora_rank: 8  # higher increases accuracy and memory
  lora_alpha: 16  # usually alpha=2*rank
  lora_dropout: 0.0
tokenizer:
  _component_: torchtune.models.llama3.llama3_tokenizer
  max_seq_len: null
batch_size: 2
optimizer:
  _component_: torch.optim.AdamW
  fused: True
  weight_decay: 0.01
loss:
  _component_: torchtune.modules.loss.LinearCrossEntropyLoss
gradient_accumulation_steps: 8
compile: False
dtype: bf16
enable_activation_checkpointing: True
enable_activation_offloading: False
"""

TORCHTUNE_FULL = """
model:
  _component_: torchtune.models.llama3_1.llama3_1_8b
batch_size: 2
optimizer:
  _component_: bitsandbytes.optim.PagedAdamW8bit
loss:
  _component_: torchtune.modules.loss.LinearCrossEntropyLoss
gradient_accumulation_steps: 1
optimizer_in_bwd: True
compile: False
enable_activation_checkpointing: True
dtype: bf16
"""

LITGPT_QLORA = """
precision: bf16-true
quantize: bnb.nf4
devices: 1
num_nodes: 1
lora_r: 32
lora_alpha: 16
lora_dropout: 0.05
lora_query: true
lora_key: false
lora_value: true
lora_projection: false
lora_mlp: false
lora_head: false
train:
  global_batch_size: 8
  micro_batch_size: 2
  max_seq_length: 512
optimizer:
  class_path: torch.optim.AdamW
"""


def _yaml(tmp_path, text, name="config.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def _with(text, **changes):
    """The config ``text`` with top-level keys changed (None removes one)."""
    data = yaml.safe_load(text)
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return data


def _llama():
    return tiny_llama(intermediate_size=384, max_position_embeddings=512)


# --- torchtune ---------------------------------------------------------------------------


def test_a_torchtune_qlora_config_is_read_as_its_recipe_runs_it(tmp_path):
    step = Step.from_recipe(_yaml(tmp_path, TORCHTUNE_QLORA), seq_len=2048)
    assert step.precision == "bf16-true"  # dtype: bf16, no autocast
    assert (step.quantization, step.double_quant, step.kbit_prepared) == ("nf4", True, False)
    assert step.optimizer == "adamw-fused"
    assert step.gradient_checkpointing and step.gradient_accumulation_steps == 8
    assert step.batch_size == 2 and not step.keep_output
    assert step.loss_chunk_size == 256  # 8 chunks of the tokens
    assert step.lora_rank == 8 and step.lora_dropout == 0.0
    assert step.lora_targets == ("query", "value", "projection", "mlp")


def test_torchtunes_roles_adapt_the_same_linears_as_their_module_names():
    roles = Step.from_recipe(yaml.safe_load(TORCHTUNE_QLORA), seq_len=64)
    names = roles.replace(
        lora_targets=["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    assert estimate(_llama(), step=roles).total == estimate(_llama(), step=names).total
    fewer = roles.replace(lora_targets=["q_proj", "v_proj"])
    assert estimate(_llama(), step=fewer).total < estimate(_llama(), step=roles).total


def test_torchtunes_4bit_base_keeps_embeddings_and_head_16bit():
    step = Step.from_recipe(yaml.safe_load(TORCHTUNE_QLORA), seq_len=64)
    torchtune = estimate(_llama(), step=step)
    prepared = estimate(_llama(), step=step.replace(precision="bf16-mixed", kbit_prepare=True))
    assert torchtune.weights < prepared.weights  # PEFT's preparation casts them to fp32


def test_the_chunked_loss_needs_a_length_and_takes_the_tokenizers_cap():
    config = yaml.safe_load(TORCHTUNE_QLORA)
    with pytest.raises(ValueError, match="pass seq_len="):
        Step.from_recipe(config)
    assert Step.from_recipe(config, loss_chunk_size=100).loss_chunk_size == 100
    config["tokenizer"]["max_seq_len"] = 1000
    capped = Step.from_recipe(config)
    assert (capped.seq_len, capped.loss_chunk_size) == (1000, 125)
    shorter = Step.from_recipe(config, seq_len=400)  # the data's longest sample, under the cap
    assert (shorter.seq_len, shorter.loss_chunk_size) == (400, 50)
    with pytest.raises(ValueError, match="seq_len=2000 contradicts the torchtune config"):
        Step.from_recipe(config, seq_len=2000)
    whole = _with(TORCHTUNE_QLORA, loss={"_component_": "torch.nn.CrossEntropyLoss"})
    assert Step.from_recipe(whole).loss_chunk_size is None
    assert Step.from_recipe(whole).seq_len is None


def test_a_packed_dataset_fills_every_sample_to_the_tokenizers_length():
    config = yaml.safe_load(TORCHTUNE_QLORA)
    config["tokenizer"]["max_seq_len"] = 1000
    config["dataset"] = {"_component_": "torchtune.datasets.alpaca_cleaned_dataset", "packed": True}
    assert Step.from_recipe(config).seq_len == 1000
    with pytest.raises(ValueError, match="seq_len=400 contradicts the torchtune config"):
        Step.from_recipe(config, seq_len=400)  # packed: no shorter sample


def test_a_torchtune_full_fine_tune_steps_in_backward_with_its_8bit_optimizer():
    step = Step.from_recipe(yaml.safe_load(TORCHTUNE_FULL), seq_len=512)
    assert step.optimizer == "paged-adamw-8bit" and step.optimizer_in_backward
    assert not step.wants_lora and step.quantization is None
    assert step.loss_chunk_size == 64


@pytest.mark.parametrize(
    ("optimizer", "name"),
    [
        ({"_component_": "torch.optim.AdamW"}, "adamw"),
        ({"_component_": "torch.optim.AdamW", "foreach": False}, "adamw-for-loop"),
        ({"_component_": "torch.optim.Adam", "fused": True}, "adam-fused"),
        ({"_component_": "torch.optim.SGD", "momentum": 0.9}, "sgd-momentum"),
        ({"_component_": "bitsandbytes.optim.AdamW8bit"}, "adamw-8bit"),
    ],
)
def test_each_torchtune_optimizer_is_what_its_component_builds(optimizer, name):
    config = _with(TORCHTUNE_QLORA, optimizer=optimizer)
    assert Step.from_recipe(config, seq_len=64).optimizer == name


def test_every_torchtune_optimizer_name_is_one_torchfit_models():
    for component, name in TORCHTUNE_OPTIMIZERS.items():
        assert parse_optimizer(name).value == name, component


def test_an_unknown_torchtune_optimizer_is_refused_unless_replaced():
    config = _with(TORCHTUNE_QLORA, optimizer={"_component_": "torchao.optim.AdamW8bit"})
    with pytest.raises(ValueError, match=r"torchao\.optim\.AdamW8bit has no memory model"):
        Step.from_recipe(config, seq_len=64)
    assert Step.from_recipe(config, seq_len=64, optimizer="adamw-8bit").optimizer == "adamw-8bit"


def test_settings_torchfit_does_not_model_warn_at_the_callers_line():
    config = _with(TORCHTUNE_QLORA, compile=True, enable_activation_offloading=True)
    with pytest.warns(NotModelledWarning) as caught:
        Step.from_recipe(config, seq_len=64)
    texts = [str(w.message) for w in caught]
    assert any("compile: True" in t for t in texts)
    assert any("enable_activation_offloading" in t for t in texts)
    assert {w.filename for w in caught} == {__file__}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Step.from_recipe(yaml.safe_load(TORCHTUNE_QLORA), seq_len=64)  # nothing to say


def test_a_torchtune_dtype_without_a_precision_is_refused():
    with pytest.raises(ValueError, match="dtype: fp16 has no torchfit precision"):
        Step.from_recipe(_with(TORCHTUNE_QLORA, dtype="fp16"), seq_len=64)


def test_a_given_field_that_contradicts_the_config_names_both():
    with pytest.raises(ValueError, match=r"batch_size=4 contradicts the torchtune config.*2"):
        Step.from_recipe(yaml.safe_load(TORCHTUNE_QLORA), seq_len=64, batch_size=4)


# --- LitGPT ------------------------------------------------------------------------------


def test_a_litgpt_qlora_config_is_read_as_finetune_lora_runs_it(tmp_path):
    step = Step.from_recipe(_yaml(tmp_path, LITGPT_QLORA))
    assert (step.precision, step.quantization, step.double_quant) == ("bf16-true", "nf4", False)
    assert step.quantize_head and step.base_dtype == "fp16" and not step.kbit_prepared
    assert step.optimizer == "paged-adamw"  # instantiate_bnb_optimizer
    assert (step.batch_size, step.gradient_accumulation_steps, step.seq_len) == (2, 4, 512)
    assert step.keep_output and step.fp32_output and step.loss_chunk_size == 128
    assert (step.lora_rank, step.lora_dropout, step.lora_targets) == (32, 0.05, ("query", "value"))


def test_litgpts_accumulation_is_per_rank():
    config = _with(LITGPT_QLORA, quantize=None, devices=4)
    with pytest.warns(NotModelledWarning, match="devices x num_nodes = 4"):
        step = Step.from_recipe(config)
    assert step.gradient_accumulation_steps == 1  # 8 // 4 devices // 2 per micro-batch
    assert step.optimizer == "adamw" and step.quantization is None


def test_litgpt_refuses_what_litgpt_refuses():
    with pytest.raises(ValueError, match="LitGPT refuses quantization with mixed precision"):
        Step.from_recipe(_with(LITGPT_QLORA, precision="bf16-mixed"))
    with pytest.raises(ValueError, match="precision is not set"):
        Step.from_recipe(_with(LITGPT_QLORA, precision=None))
    assert Step.from_recipe(_with(LITGPT_QLORA, precision=None), precision="16-true").precision
    with pytest.raises(ValueError, match="int8-training"):
        Step.from_recipe(_with(LITGPT_QLORA, quantize="bnb.int8-training"))


def test_a_litgpt_full_fine_tune_trains_every_weight_with_a_note():
    config = _with(LITGPT_QLORA, quantize=None, **dict.fromkeys(["lora_r", "lora_alpha"]))
    config = {k: v for k, v in config.items() if not k.startswith("lora_")}
    with pytest.warns(NotModelledWarning, match="128 rows at a time"):
        step = Step.from_recipe(config)
    assert not step.wants_lora and step.loss_chunk_size is None and step.keep_output
    assert step.fp32_output  # Fabric casts the logits for the full fine-tune too


# --- what a config is --------------------------------------------------------------------


def test_a_mapping_a_dictconfig_and_a_path_give_one_step(tmp_path):
    class DictConfig:  # omegaconf's, by the one method read
        def to_container(self):
            return yaml.safe_load(LITGPT_QLORA)

    from_path = Step.from_recipe(_yaml(tmp_path, LITGPT_QLORA))
    assert Step.from_recipe(str(_yaml(tmp_path, LITGPT_QLORA))) == from_path
    assert Step.from_recipe(yaml.safe_load(LITGPT_QLORA)) == from_path
    assert Step.from_recipe(DictConfig()) == from_path


def test_something_else_is_refused_with_what_was_expected():
    with pytest.raises(ValueError, match="neither torchtune's"):
        recipe_fields({"lr": 3e-4})
    with pytest.raises(TypeError, match="expected a config mapping"):
        recipe_fields(42)


def test_the_read_fields_name_where_each_came_from():
    read = recipe_fields(yaml.safe_load(TORCHTUNE_QLORA), seq_len=64)
    assert set(read.read_from) == set(read.fields)
    assert read.read_from["optimizer"].startswith("optimizer._component_: torch.optim.AdamW")
    assert {f.name for f in dataclasses.fields(Step)} >= set(read.fields)


# --- Unsloth (a recipe written in code) ------------------------------------------------------


def test_unsloth_is_its_readmes_qlora_with_the_rest_kept_16bit():
    with pytest.warns(NotModelledWarning) as caught:
        step = Step.from_recipe("unsloth")
    assert (step.quantization, step.double_quant, step.kbit_prepare) == ("nf4", True, False)
    assert step.precision == "auto"  # bf16 = is_bfloat16_supported(), else fp16
    assert (step.lora_rank, step.lora_dropout, len(step.lora_targets)) == (16, 0.0, 7)
    assert step.optimizer == "adamw-8bit" and step.gradient_checkpointing
    assert (step.batch_size, step.gradient_accumulation_steps, step.seq_len) == (2, 4, 2048)
    assert {w.filename for w in caught} == {__file__}
    assert any("checkpoint to CPU memory" in str(w.message) for w in caught)


def test_unsloths_values_are_defaults_a_caller_replaces():
    with pytest.warns(NotModelledWarning):
        step = Step.from_recipe("UNSLOTH", seq_len=8192, batch_size=1, optimizer="adamw")
    assert (step.seq_len, step.batch_size, step.optimizer) == (8192, 1, "adamw")
    with pytest.warns(NotModelledWarning):
        step = Step.from_recipe("unsloth", seq_len=64, precision="bf16-mixed")  # a bf16 card
    # PEFT's preparation would cast the embeddings, norms and head to fp32
    peft = step.replace(kbit_prepare=True)
    assert estimate(_llama(), step=step).weights < estimate(_llama(), step=peft).weights


def test_a_file_named_like_a_recipe_is_an_error_saying_both(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "unsloth").write_text(LITGPT_QLORA)
    with pytest.raises(ValueError, match=r"names both a file here and the unsloth recipe"):
        Step.from_recipe("unsloth")
    assert Step.from_recipe("./unsloth").optimizer == "paged-adamw"  # the file, LitGPT's


@pytest.mark.parametrize(
    ("seq_len", "error"),
    [(0, ValueError), (-8, ValueError), (float("nan"), TypeError), ("2048", TypeError),
     (2.5, TypeError)],
)  # fmt: skip
def test_a_bad_length_beside_a_recipe_is_refused_by_name(seq_len, error):
    with pytest.raises(error, match="seq_len must be"):
        Step.from_recipe(yaml.safe_load(TORCHTUNE_QLORA), seq_len=seq_len)
