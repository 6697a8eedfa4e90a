"""`Step`: one description of a step, checked once; `estimate` takes it or its keywords."""

import pytest
from transformers import BitsAndBytesConfig

import torchfit
from tiny_configs import tiny_llama
from torchfit import Step, estimate

peft = pytest.importorskip("peft")


def _llama():
    return tiny_llama()


@pytest.mark.parametrize(
    ("keywords", "precision"),
    [
        ({}, "32-true"),
        ({"dtype": "bf16"}, "bf16-mixed"),
        ({"dtype": "fp16", "mixed_precision": False}, "16-true"),
        ({"dtype": "bf16", "mode": "inference"}, "bf16-true"),
        ({"dtype": "nf4"}, "bf16-mixed"),
        ({"dtype": "nf4", "mode": "inference"}, "bf16-true"),
        ({"quantization": BitsAndBytesConfig(load_in_4bit=True)}, "32-true"),
    ],
)
def test_every_older_spelling_is_one_precision_with_the_same_estimate(keywords, precision):
    step = Step.of(batch_size=2, seq_len=64, **keywords)
    assert step.precision == precision
    by_keywords = estimate(_llama(), batch_size=2, seq_len=64, **keywords)
    assert estimate(_llama(), step).total == by_keywords.total


def test_a_step_and_keywords_together_is_an_error_naming_replace():
    with pytest.raises(TypeError, match=r"step.replace\(batch_size=...\)"):
        estimate(_llama(), Step(seq_len=64), batch_size=4)
    with pytest.raises(TypeError, match="step must be Step or None; got 4"):
        estimate(_llama(), 4)


def test_contradictions_fail_where_the_step_is_made():
    with pytest.raises(ValueError, match="kbit_prepare=True"):
        Step(kbit_prepare=True)
    with pytest.raises(ValueError, match="max_new_tokens"):
        Step(max_new_tokens=8)
    with pytest.raises(ValueError, match=r"Step\.batch_size"):
        Step(batch_size=0)
    with pytest.raises(TypeError, match="from_peft"):
        Step(quantization=BitsAndBytesConfig(load_in_4bit=True))
    with pytest.raises(TypeError, match="unknown step keyword 'batch'"):
        Step.of(batch=4)


def test_auto_precision_needs_a_card():
    step = Step(precision="auto")
    with pytest.raises(ValueError, match="needs a card"):
        estimate(_llama(), step.replace(seq_len=64))
    assert step.for_card(bf16=True).precision == "bf16-mixed"
    assert step.replace(mode="inference").for_card(bf16=False).precision == "16-true"


def test_from_peft_reads_both_configs_as_the_keyword_form():
    lora = peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules=["q_proj"])
    bnb = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype="bfloat16"
    )
    step = Step.from_peft(lora, bnb, batch_size=1, seq_len=64, gradient_checkpointing=True)
    assert (step.quantization, step.precision, step.kbit_prepared) == ("nf4", "bf16-mixed", True)
    same = estimate(
        _llama(), batch_size=1, seq_len=64, lora=lora, quantization=bnb,
        gradient_checkpointing=True,
    )  # fmt: skip
    assert estimate(_llama(), step).total == same.total
    assert "LoraConfig(r=16, target_modules={'q_proj'}, lora_dropout=0.05" in repr(step)
    assert len(repr(step)) < 200


def test_the_repr_is_what_differs_from_the_defaults():
    assert repr(Step(batch_size=8, precision="bf16-mixed")) == (
        "Step(batch_size=8, precision='bf16-mixed')"
    )
    assert torchfit.memory.Step is Step
    assert Step(quantization="nf4").replace(kbit_prepare=False).kbit_prepared is False


def test_a_quantized_image_model_is_refused_with_its_fix():
    from torch import nn

    cnn = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten(), nn.Linear(8 * 30 * 30, 10))
    with pytest.raises(ValueError, match="quantization='nf4': 4/8-bit"):
        estimate(cnn, batch_size=2, input_shape=(3, 32, 32), dtype="nf4")
