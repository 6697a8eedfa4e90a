"""The run as people write it: one answer per recipe, or an error naming the right spelling."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torchfit.memory import Step, estimate

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
torch = pytest.importorskip("torch")

LORA = dict(lora_rank=8, lora_targets=["q_proj", "v_proj"])


def _llama(**extra):
    return transformers.LlamaConfig(
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1000,
        max_position_embeddings=256,
        **extra,
    )


def _estimate(**kwargs):
    return estimate(_llama(), batch_size=2, seq_len=64, device="cuda", **kwargs)


# --- the weights' dtype, said once -------------------------------------------------------


def test_a_bf16_dtype_beside_bf16_mixed_names_base_dtype():
    # dtype="bf16" beside "bf16-mixed" reads as the compute dtype (which precision names)
    # or as from_pretrained(dtype=torch.bfloat16): refused, with the spelling of each
    with pytest.raises(ValueError, match="base_dtype='bf16' for a LoRA base") as error:
        _estimate(dtype="bf16", precision="bf16-mixed", **LORA)
    assert "precision='bf16-true' for a model held in bf16" in str(error.value)
    assert "precision='bf16-mixed' alone for fp32 master weights" in str(error.value)
    with pytest.raises(ValueError, match="reads two ways"):
        _estimate(dtype="bf16", precision="bf16-mixed")


def test_the_spellings_that_agree_give_one_answer():
    lora_base = _estimate(base_dtype="bf16", precision="bf16-mixed", **LORA)
    assert lora_base.weights < _estimate(precision="bf16-mixed", **LORA).weights  # fp32 base
    # "*-mixed" holds fp32 master weights; "*-true" the compute dtype: naming it is redundant
    assert _estimate(dtype="fp32", precision="bf16-mixed") == _estimate(precision="bf16-mixed")
    assert _estimate(dtype="bf16", precision="bf16-true") == _estimate(precision="bf16-true")
    assert _estimate(dtype="bf16") == _estimate(dtype="bf16", mixed_precision=True)
    frozen16 = _estimate(base_dtype="bf16", precision="bf16-true", **LORA)
    assert frozen16 == _estimate(precision="bf16-true", **LORA)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        # mixed_precision=True on an fp32 compute dtype was ignored
        (dict(dtype="fp32", mixed_precision=True), "mixed_precision=True autocasts"),
        # base_dtype on a model that trains whole was ignored
        (dict(base_dtype="bf16"), "the whole model trains"),
        (dict(base_dtype="bf16", precision="bf16-mixed"), "the whole model trains"),
        # base_dtype at inference of an unquantized model was ignored
        (dict(base_dtype="bf16", mode="inference", **LORA), "pass dtype='bf16'"),
        # a base in fp32 beside a model converted to bf16 was ignored
        (dict(base_dtype="fp32", precision="bf16-true", **LORA), "without autocast"),
        # and the contradictions that were refused already
        (dict(dtype="fp16", precision="bf16-true"), "contradicts precision='bf16-true'"),
        (dict(dtype="bf16", precision="32-true"), "contradicts precision='32-true'"),
    ],
)
def test_a_second_name_for_the_weights_dtype_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _estimate(**kwargs)


def test_a_config_without_a_recorded_dtype_says_its_lora_base_is_taken_as_fp32():
    found = _estimate(precision="bf16-mixed", **LORA)
    assert any("base_dtype='bf16' for a base loaded with" in note for note in found.notes)


def test_a_lora_config_carries_its_own_dropout():
    config = peft.LoraConfig(r=8, target_modules=["q_proj"], lora_dropout=0.1)
    with pytest.raises(ValueError, match="lora_dropout= both describe the adapters"):
        _estimate(lora=config, lora_dropout=0.0)


# --- bitsandbytes' config as from_pretrained takes it --------------------------------------


def _bnb(**fields):
    return transformers.BitsAndBytesConfig(**fields)


QLORA = dict(lora_rank=16, lora_targets="all-linear", gradient_checkpointing=True)


def test_the_qlora_notebook_config_is_the_nf4_estimate():
    config = _bnb(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )
    assert _estimate(quantization=config, **QLORA) == _estimate(dtype="nf4", **QLORA)
    as_dict = config.to_dict()  # config.json's quantization_config
    assert _estimate(quantization=as_dict, **QLORA) == _estimate(dtype="nf4", **QLORA)


def test_transformers_defaults_compute_in_fp32():
    # BitsAndBytesConfig(load_in_4bit=True): fp4, no double quantization, float32 compute
    default = _bnb(load_in_4bit=True)
    fp32 = _estimate(dtype="fp4", double_quant=False, precision="32-true", **QLORA)
    assert _estimate(quantization=default, **QLORA) == fp32
    # under bf16 autocast the matmuls inside bitsandbytes' call run in bf16 anyway
    autocast = _estimate(dtype="fp4", double_quant=False, precision="bf16-mixed", **QLORA)
    assert _estimate(quantization=default, precision="bf16-mixed", **QLORA) == autocast
    assert autocast.total < fp32.total


INFERENCE = dict(mode="inference", batch_size=2, seq_len=64)


def test_inference_on_the_defaults_holds_the_model_in_16_bits_and_the_layers_compute_in_fp32():
    """transformers loads the other modules in the checkpoint's dtype; each 4-bit layer casts
    its input to fp32, dequantizes its weight into fp32 and casts its output back."""
    default = estimate(_llama(), quantization=_bnb(load_in_4bit=True), device="cuda", **INFERENCE)
    bf16 = estimate(_llama(), dtype="fp4", double_quant=False, device="cuda", **INFERENCE)
    assert default.weights == bf16.weights  # embeddings, norms and head in bf16, not fp32
    hidden, mlp, rows = 128, 384, 2 * 64
    dequantized = hidden * mlp * 4  # the largest 4-bit weight, into fp32 (bitsandbytes 0.50)
    copies = rows * (hidden + mlp) * 4  # the widest layer's input and output in fp32
    assert default.total - bf16.total == dequantized - hidden * mlp * 2 + copies
    assert any("compute in fp32 (bnb_4bit_compute_dtype)" in n for n in default.notes)
    spelled = estimate(
        _llama(), quantization="fp4", double_quant=False, bnb_compute_dtype="fp32",
        device="cuda", **INFERENCE,
    )  # fmt: skip
    assert spelled == default
    # in training PEFT's preparation casts the rest to fp32: the whole step computes in fp32
    assert "bnb_compute_dtype" not in Step.of(quantization=_bnb(load_in_4bit=True)).changed()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(quantization="int8", mode="inference"), "needs quantization='nf4'"),
        (dict(quantization="nf4"), "modelled for inference"),
        (dict(quantization="nf4", mode="inference", bnb_compute_dtype="nf4"), "a float dtype"),
    ],
)
def test_bnb_compute_dtype_is_refused_where_it_means_nothing(fields, message):
    with pytest.raises(ValueError, match=message):
        Step(**{"bnb_compute_dtype": "fp32", **fields})


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        ("fp33", ValueError, r"Step\.bnb_compute_dtype='fp33': unknown dtype"),
        (float("nan"), TypeError, r"Step\.bnb_compute_dtype=nan: a dtype must be a string"),
        (-1, TypeError, r"Step\.bnb_compute_dtype=-1: a dtype must be a string"),
        ("", ValueError, r"Step\.bnb_compute_dtype='': unknown dtype ''"),
    ],
)
def test_a_bad_bnb_compute_dtype_is_named(value, error, message):
    with pytest.raises(error, match=message):
        Step(quantization="nf4", mode="inference", bnb_compute_dtype=value)


def test_the_meta_pass_counts_the_fp32_layers_as_the_closed_form_does():
    """A family without a closed form (Falcon) reads bnb_compute_dtype the same way."""
    config = transformers.FalconConfig(
        hidden_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=1000,
        new_decoder_architecture=False, multi_query=True,
    )  # fmt: skip
    found = {
        dtype: estimate(
            config, quantization="nf4", bnb_compute_dtype=dtype, device="cuda", **INFERENCE
        )
        for dtype in (None, "fp32")
    }
    assert found["fp32"].weights == found[None].weights
    rows, widest = 2 * 64, 4 * 128 + 128  # the MLP's up projection: 512 out, 128 in
    largest = 4 * 128 * 128
    added = largest * (4 - 2) + rows * widest * 4  # dequantized into fp32, the fp32 copies
    assert found["fp32"].total - found[None].total == added


def test_a_bnb_compute_dtype_equal_to_the_precisions_is_dropped():
    step = Step(quantization="nf4", mode="inference", precision="32-true", bnb_compute_dtype="fp32")
    assert step.bnb_compute_dtype is None


def test_the_defaults_weights_match_a_real_cpu_load(tmp_path):
    pytest.importorskip("bitsandbytes")
    from torchfit.quantize import footprint

    torch.manual_seed(0)
    transformers.LlamaForCausalLM(_llama()).to(torch.bfloat16).save_pretrained(tmp_path)
    model = transformers.LlamaForCausalLM.from_pretrained(
        tmp_path, quantization_config=_bnb(load_in_4bit=True), device_map="cpu"
    )
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())  # RoPE's table
    found = estimate(_llama(), quantization=_bnb(load_in_4bit=True), device="cpu", **INFERENCE)
    assert found.weights == footprint(model).total - buffers


def test_skip_modules_and_8_bit():
    kept = _estimate(quantization=_bnb(load_in_4bit=True, llm_int8_skip_modules=["lm_head"]))
    assert kept == _estimate(quantization=_bnb(load_in_4bit=True))
    head = _estimate(quantization=_bnb(load_in_4bit=True, llm_int8_skip_modules=[]))
    assert head.weights < kept.weights  # the head is quantized too
    assert _estimate(quantization=_bnb(load_in_8bit=True)) == _estimate(dtype="int8")


@pytest.mark.parametrize(
    ("quantization", "kwargs", "error", "message"),
    [
        (dict(load_in_4bit=True), dict(dtype="nf4"), ValueError, "leave dtype out"),
        (dict(load_in_4bit=True), dict(double_quant=True), ValueError, "leave double_quant out"),
        (dict(load_in_4bit=True), dict(quantize_head=True), ValueError, "skip_modules=\\[\\]"),
        (dict(load_in_4bit=True), dict(mixed_precision=True), ValueError, "float32"),
        (dict(load_in_4bit=True, llm_int8_skip_modules=["mlp"]), {}, ValueError, "not model"),
        (dict(load_in_8bit=True, llm_int8_has_fp16_weight=True), {}, ValueError, "fp16 weights"),
        (dict(load_in_4bit=False), {}, ValueError, "loads nothing in 4 or 8 bits"),
        (dict(quant_method="gptq", bits=4), {}, TypeError, "'gptq' quantization config"),
    ],
)
def test_a_config_and_an_argument_that_say_it_twice_are_refused(
    quantization, kwargs, error, message
):
    with pytest.raises(error, match=message):
        _estimate(quantization=quantization, **kwargs)


def test_something_else_than_a_config_is_a_type_error():
    with pytest.raises(TypeError, match="BitsAndBytesConfig"):
        _estimate(quantization=4)


def test_a_format_name_is_the_dtype_spelling():
    assert _estimate(quantization="nf4").total == _estimate(dtype="nf4").total
    with pytest.raises(ValueError, match="both name the weights"):
        _estimate(quantization="nf4", dtype="int8")


@settings(max_examples=30, deadline=None)
@given(
    kind=st.sampled_from(["nf4", "fp4"]),
    nested=st.booleans(),
    compute=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]),
    checkpointing=st.booleans(),
)
def test_every_4_bit_config_is_its_keyword_spelling(kind, nested, compute, checkpointing):
    config = _bnb(
        load_in_4bit=True,
        bnb_4bit_quant_type=kind,
        bnb_4bit_use_double_quant=nested,
        bnb_4bit_compute_dtype=compute,
    )
    name = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "32"}[compute]
    precision = f"{name}-mixed" if name != "32" else "32-true"
    common = dict(lora_rank=8, gradient_checkpointing=checkpointing)
    spelled = _estimate(dtype=kind, double_quant=nested, precision=precision, **common)
    assert _estimate(quantization=config, **common).replace(notes=()) == spelled.replace(notes=())
