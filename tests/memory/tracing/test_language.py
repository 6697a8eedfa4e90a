"""`estimate` of a transformers model without a closed form, on CUDA: its traced step.

Each case builds the model the way a user would run it (``from_config`` on the meta
device in the step's dtypes, PEFT's adapters, transformers' checkpointing) and traces it
with `torchfit.memory.trace`; `estimate` from the config alone must give the same step.
"""

import pytest
import torch

from torchfit.memory import estimate, to_device, trace
from torchfit.memory.tracing import language

transformers = pytest.importorskip("transformers")

BATCH, SEQ = 2, 256
SHAPES = {
    "hidden_size": 128,
    "intermediate_size": 352,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "vocab_size": 3000,
    "max_position_embeddings": 1024,
}
CONFIGS = {
    "gemma2": lambda: transformers.Gemma2Config(**SHAPES, num_key_value_heads=2, head_dim=32),
    "gpt_neox": lambda: transformers.GPTNeoXConfig(**SHAPES),
    "olmo2": lambda: transformers.Olmo2Config(**SHAPES, num_key_value_heads=2),
}
DTYPES = {"32-true": torch.float32, "bf16-true": torch.bfloat16, "bf16-mixed": torch.float32}


def _user_model(name, dtype, *, checkpointing=False):
    config = CONFIGS[name]()
    config.use_cache = False
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    if checkpointing:
        model.gradient_checkpointing_enable()
    return model.train()


def _traced(model, precision):
    ids = torch.zeros((BATCH, SEQ), dtype=torch.long, device="meta")
    inputs = {"input_ids": ids, "labels": ids}
    return trace(model, inputs, precision=precision, device="cuda", gpu="H200")


def _on_card(found):
    """The estimate as the trace reports it: placed on the card (cuBLAS's workspaces)."""
    return to_device(found, gpu="H200", context_bytes=0)


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("precision", sorted(DTYPES))
def test_the_estimate_is_the_trace_of_the_model_the_user_runs(name, precision):
    found = estimate(CONFIGS[name](), batch_size=BATCH, seq_len=SEQ, precision=precision)
    assert "traced on fake tensors" in found.notes[0]
    traced = _traced(_user_model(name, DTYPES[precision]), precision)
    card = _on_card(found)
    assert card.total == pytest.approx(traced.total, rel=1e-3)
    assert card.weights == pytest.approx(traced.weights, abs=16)  # in the step's dtype
    assert card.reserved == pytest.approx(traced.reserved, rel=0.005)


def test_checkpointing_is_traced_as_transformers_runs_it():
    kw = {"batch_size": BATCH, "seq_len": SEQ, "precision": "bf16-mixed"}
    found = estimate(CONFIGS["gemma2"](), gradient_checkpointing=True, **kw)
    traced = _traced(_user_model("gemma2", torch.float32, checkpointing=True), "bf16-mixed")
    assert _on_card(found).total == pytest.approx(traced.total, rel=1e-3)
    assert found.activations < estimate(CONFIGS["gemma2"](), **kw).activations


def test_lora_over_a_16_bit_base_keeps_the_base_in_its_dtype_and_the_adapters_in_fp32():
    peft = pytest.importorskip("peft")
    lora = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
    found = estimate(
        CONFIGS["gemma2"](),
        batch_size=BATCH,
        seq_len=SEQ,
        lora=lora,
        base_dtype="bf16",
        precision="bf16-mixed",
    )
    assert "traced on fake tensors" in found.notes[0]
    model = peft.get_peft_model(_user_model("gemma2", torch.bfloat16), lora)
    dtypes = {p.dtype for p in model.parameters() if p.requires_grad}
    assert dtypes == {torch.float32}  # PEFT's autocast_adapter_dtype, as the estimate holds
    traced = _traced(model, "bf16-mixed")
    assert _on_card(found).total == pytest.approx(traced.total, rel=1e-3)
    assert found.weights == pytest.approx(traced.weights, abs=16)  # a scalar buffer's dtype


def test_an_inference_forward_is_traced_with_its_cache_apart():
    kw = {"batch_size": BATCH, "seq_len": SEQ, "mode": "inference", "dtype": "bf16"}
    found = estimate(CONFIGS["gpt_neox"](), **kw)
    assert "traced on fake tensors" in found.notes[0]
    model = _user_model("gpt_neox", torch.bfloat16).eval()
    model.config.use_cache = True  # transformers' default for a decoder's forward
    ids = torch.zeros((BATCH, SEQ), dtype=torch.long, device="meta")
    traced = trace(model, {"input_ids": ids}, mode="inference", device="cuda", gpu="H200")
    card = _on_card(found)
    assert card.total == pytest.approx(traced.total, rel=1e-3)
    assert card.reserved == pytest.approx(traced.reserved, rel=0.005)
    # keys and values of every layer: 2 x layers x batch x seq x hidden, in bf16
    layers, hidden = SHAPES["num_hidden_layers"], SHAPES["hidden_size"]
    assert found.kv_cache == 2 * layers * BATCH * SEQ * hidden * 2


@pytest.mark.parametrize("use_cache", [False, True])
def test_an_inference_forward_keeps_the_cache_the_step_asks_for(use_cache):
    kw = {"batch_size": BATCH, "seq_len": SEQ, "mode": "inference", "dtype": "bf16"}
    found = estimate(CONFIGS["gpt_neox"](), use_cache=use_cache, **kw)
    assert "traced on fake tensors" in found.notes[0]
    layers, hidden = SHAPES["num_hidden_layers"], SHAPES["hidden_size"]
    assert found.kv_cache == (2 * layers * BATCH * SEQ * hidden * 2 if use_cache else 0)


def test_an_encoder_decoder_forward_the_meta_pass_cannot_run_is_traced():
    # BART's decoder reads a value on meta tensors, so its pass (and the meta forward that
    # tells its cache apart) stop; the trace runs it, the cache counted in the activations
    config = transformers.BartConfig(
        encoder_layers=2,
        decoder_layers=2,
        d_model=128,
        vocab_size=3000,
        max_position_embeddings=512,
    )
    kw = {"batch_size": BATCH, "seq_len": SEQ, "mode": "inference", "dtype": "bf16"}
    with pytest.raises(RuntimeError):
        estimate(config, device="cpu", **kw)
    found = estimate(config, **kw)
    assert "traced on fake tensors" in found.notes[0]
    assert any("KV cache is counted in the activations" in note for note in found.notes)
    with torch.device("meta"):
        model = transformers.BartForConditionalGeneration._from_config(config, dtype=torch.bfloat16)
    ids = torch.zeros((BATCH, SEQ), dtype=torch.long, device="meta")
    inputs = {"input_ids": ids, "decoder_input_ids": ids}
    traced = trace(model.eval(), inputs, mode="inference", device="cuda", gpu="H200")
    assert _on_card(found).total == pytest.approx(traced.total, rel=1e-3)


def test_a_cpu_step_generate_and_a_4_bit_base_keep_the_meta_device_pass():
    kw = {"batch_size": BATCH, "seq_len": SEQ}
    assert "meta-device pass" in estimate(CONFIGS["olmo2"](), device="cpu", **kw).notes[0]
    generate = estimate(CONFIGS["olmo2"](), mode="inference", max_new_tokens=8, **kw)
    assert "meta-device pass" in generate.notes[0]
    quantized = estimate(
        CONFIGS["olmo2"](), dtype="nf4", lora_rank=8, lora_targets=["q_proj"], **kw
    )
    assert "meta-device pass" in quantized.notes[0]


def test_a_step_fake_tensors_cannot_run_falls_back_to_the_pass(monkeypatch):
    def refuse(*_args, **_kwargs):
        raise RuntimeError("aten.nonzero reads the values of a tensor; not on fake tensors")

    monkeypatch.setattr(language, "traced_step", refuse)
    monkeypatch.setattr(language, "_TRACED", {})  # no step traced earlier in this process
    found = estimate(CONFIGS["gpt_neox"](), batch_size=BATCH, seq_len=SEQ)
    assert "meta-device pass" in found.notes[0]
    assert any("not traced: aten.nonzero reads the values" in note for note in found.notes)


def test_a_step_traced_once_is_not_traced_again(monkeypatch):
    monkeypatch.setattr(language, "_TRACED", {})
    runs = []
    real = language.traced_step
    monkeypatch.setattr(language, "traced_step", lambda *a: runs.append(1) or real(*a))
    kw = {"batch_size": BATCH, "seq_len": SEQ, "precision": "bf16-mixed"}
    first = estimate(CONFIGS["olmo2"](), **kw)
    again = estimate(CONFIGS["olmo2"](), **kw)
    other = estimate(CONFIGS["olmo2"](), **{**kw, "batch_size": 2 * BATCH})
    assert len(runs) == 2
    assert again == first
    assert other.activations > first.activations
