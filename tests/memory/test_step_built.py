"""A model already built as the model: its PEFT adapters, 4-bit loading and dtypes read.

Before this, ``estimate(peft_model, ...)`` read the config alone and answered for a full
fine-tune of the base; now a ``PeftModel`` (and a model loaded with a
``BitsAndBytesConfig``) is the step it is. The 4-bit model here is a real one: a tiny
Llama saved and loaded by transformers with bitsandbytes on the CPU, then PEFT's recipe.
"""

import pytest
import torch

from tiny_configs import tiny_llama
from torchfit import Step, fits
from torchfit.memory import estimate
from torchfit.memory.step.built import built_fields

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
KW = {"batch_size": 2, "seq_len": 128, "device": "cuda"}
REENTRANT = "ignore:torch.utils.checkpoint. the use_reentrant parameter:UserWarning"


def _lora():
    return peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules=TARGETS)


def _bnb():
    return transformers.BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_llama")
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(tiny_llama()).to(torch.bfloat16).save_pretrained(path)
    return path


def _quantized(saved):
    pytest.importorskip("bitsandbytes")
    return transformers.AutoModelForCausalLM.from_pretrained(
        saved, quantization_config=_bnb(), dtype=torch.bfloat16, device_map="cpu"
    )


def test_a_lora_model_is_estimated_as_its_adapters_on_its_base():
    with torch.device("meta"):
        base = transformers.LlamaForCausalLM(tiny_llama()).to(torch.bfloat16)
    lora = _lora()
    model = peft.get_peft_model(base, lora)
    found = estimate(model, precision="bf16-mixed", **KW)
    said = estimate(tiny_llama(), precision="bf16-mixed", lora=lora, base_dtype="bf16", **KW)
    assert found.total == said.total
    full = estimate(tiny_llama(), precision="bf16-mixed", **KW)  # what it used to answer
    assert found.optimizer < full.optimizer / 10
    with pytest.raises(ValueError, match=r"base_dtype='fp32' contradicts the PeftModel"):
        estimate(model, precision="bf16-mixed", base_dtype="fp32", **KW)
    # a whole Step counts what it changes from the defaults
    step = Step(precision="bf16-mixed", **KW)
    assert estimate(model, step).total == found.total


@pytest.mark.filterwarnings(REENTRANT)
@pytest.mark.parametrize("prepare", [True, False])
def test_a_qlora_model_loaded_in_4_bits_is_its_recipe(saved, prepare):
    model = _quantized(saved)
    if prepare:
        model = peft.prepare_model_for_kbit_training(model)
    model = peft.get_peft_model(model, _lora())
    read = built_fields(model)
    assert read.fields["kbit_prepare"] is prepare  # the embedding's dtype says so
    found = estimate(model, precision="bf16-mixed", gradient_checkpointing=True, **KW)
    said = estimate(
        tiny_llama(),
        precision="bf16-mixed",
        quantization=_bnb(),
        lora=_lora(),
        kbit_prepare=prepare,
        gradient_checkpointing=True,
        **KW,
    )
    assert found.total == said.total
    assert found.weights < estimate(tiny_llama(), precision="bf16-mixed", **KW).weights


def test_a_4_bit_model_without_adapters_plans_its_inference(saved):
    model = _quantized(saved)
    plan = fits(model, "RTX 3060", mode="inference", seq_len=128)
    assert plan.step.quantization == "nf4" and plan.step.double_quant
    assert (
        plan.estimate.weights
        == estimate(
            tiny_llama(), mode="inference", quantization=_bnb(), seq_len=128, device="cuda"
        ).weights
    )


def test_adapters_other_than_lora_are_refused():
    with torch.device("meta"):
        base = transformers.LlamaForCausalLM(tiny_llama())
    model = peft.get_peft_model(base, peft.IA3Config(target_modules=["k_proj", "v_proj"]))
    with pytest.raises(ValueError, match=r"IA3Config adapters.*trace this model"):
        estimate(model, **KW)


def test_a_lora_model_loaded_for_inference_serves_and_does_not_train():
    """PeftModel.from_pretrained loads adapters with inference_mode=True: a forward is
    planned (the base's dtype read for training is not), a training step is refused."""
    with torch.device("meta"):
        base = transformers.LlamaForCausalLM(tiny_llama()).to(torch.bfloat16)
    lora = peft.LoraConfig(r=8, target_modules=TARGETS, inference_mode=True)
    model = peft.get_peft_model(base, lora)
    kw = {"batch_size": 2, "seq_len": 128, "mode": "inference", "precision": "bf16-true"}
    served = estimate(model, **kw)
    assert served.total == estimate(tiny_llama(), lora=lora, **kw).total
    with pytest.raises(ValueError, match=r"inference_mode=True\) freezes the adapters"):
        estimate(model, batch_size=2, seq_len=128, precision="bf16-mixed")


def test_a_model_quantized_otherwise_than_by_bitsandbytes_is_refused():
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(tiny_llama())
    model.config.quantization_config = {"quant_method": "gptq", "bits": 4}
    with pytest.raises(ValueError, match=r"quantized with 'gptq'.*dtype='int4'"):
        estimate(model, **KW)


def test_a_lora_model_planned_over_several_cards():
    """The plan's other moments change the step (a start of backward without adapters):
    they are taken from the model's config, not read from the model again."""
    with torch.device("meta"):
        base = transformers.LlamaForCausalLM(tiny_llama()).to(torch.bfloat16)
    lora = _lora()
    model = peft.get_peft_model(base, lora)
    kw = {"batch_size": 2, "seq_len": 128, "strategy": "fsdp", "precision": "bf16-mixed"}
    planned = fits(model, ["H100"] * 2, time=True, **kw)
    said = fits(tiny_llama(), ["H100"] * 2, lora=lora, base_dtype="bf16", **kw)
    assert planned.estimate.total == said.estimate.total and planned.time.gpus == 2
