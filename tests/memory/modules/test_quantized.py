"""A bitsandbytes 4/8-bit base in the meta-device pass: the closed form, real loads, estimate."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchfit._bnb.layout import linear4bit_bytes, linear8bit_bytes
from torchfit._core.units import DType
from torchfit.memory import estimate
from torchfit.memory.analytic.arch import spec_from_config
from torchfit.memory.analytic.quantized import quantized_weight_bytes
from torchfit.memory.catalog.resolve import build_model
from torchfit.memory.modules.quantized import meta_quantized_weight_bytes, quantized_linears

transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")

FORMATS = [
    (DType.NF4, True),
    (DType.NF4, False),
    (DType.FP4, True),
    (DType.FP4, False),
    (DType.INT8, False),
]


def _llama(tied=False, hidden=64, layers=2, vocab=1000, intermediate=160, kv_heads=2):
    return transformers.LlamaConfig(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        vocab_size=vocab,
        tie_word_embeddings=tied,
    )


def _falcon(**extra):
    return transformers.FalconConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        vocab_size=1000,
        bos_token_id=0,
        eos_token_id=0,
        **extra,
    )


def _bloom(**extra):
    return transformers.BloomConfig(hidden_size=64, n_layer=2, n_head=4, vocab_size=1000, **extra)


def _meta(config):
    return build_model(config, device="meta", dtype="fp32")


# --- the closed form and the meta pass count the same bytes -------------------------------


@pytest.mark.parametrize(("weights", "double_quant"), FORMATS)
@pytest.mark.parametrize("head", [False, True])
def test_meta_pass_weights_equal_the_closed_form_on_llama(weights, double_quant, head):
    config = _llama()
    closed = quantized_weight_bytes(
        spec_from_config(config), weights, DType.BF16, double_quant=double_quant, head=head
    )
    meta = meta_quantized_weight_bytes(
        _meta(config), weights, DType.BF16, double_quant=double_quant, head=head
    )
    assert meta == closed


@pytest.mark.parametrize(("weights", "double_quant"), FORMATS)
def test_meta_pass_weights_equal_the_closed_form_on_gpt2_conv1d(weights, double_quant):
    config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=1000)
    closed = quantized_weight_bytes(
        spec_from_config(config), weights, DType.FP16, double_quant=double_quant
    )
    meta = meta_quantized_weight_bytes(
        _meta(config), weights, DType.FP16, double_quant=double_quant
    )
    assert meta == closed


def test_a_tied_head_is_refused_by_both_with_the_same_words():
    config = _llama(tied=True)
    with pytest.raises(ValueError, match="tied") as closed:
        quantized_weight_bytes(spec_from_config(config), DType.NF4, DType.BF16, head=True)
    with pytest.raises(ValueError, match="tied") as meta:
        meta_quantized_weight_bytes(_meta(config), DType.NF4, DType.BF16, head=True)
    assert str(meta.value) == str(closed.value)


@settings(max_examples=25, deadline=None)
@given(
    hidden=st.sampled_from([32, 64, 96, 128]),
    layers=st.integers(1, 3),
    vocab=st.integers(50, 3000),
    intermediate=st.integers(1, 200).map(lambda k: 2 * k + 1),  # odd sizes: padded blocks
    fmt=st.sampled_from(FORMATS),
    head=st.booleans(),
)
def test_property_meta_pass_equals_the_closed_form_over_llama_shapes(
    hidden, layers, vocab, intermediate, fmt, head
):
    weights, double_quant = fmt
    config = _llama(hidden=hidden, layers=layers, vocab=vocab, intermediate=intermediate)
    closed = quantized_weight_bytes(
        spec_from_config(config), weights, DType.BF16, double_quant=double_quant, head=head
    )
    meta = meta_quantized_weight_bytes(
        _meta(config), weights, DType.BF16, double_quant=double_quant, head=head
    )
    assert meta == closed


@settings(max_examples=20, deadline=None)
@given(
    hidden=st.sampled_from([32, 64, 128]),
    layers=st.integers(1, 3),
    vocab=st.integers(50, 2000),
    fmt=st.sampled_from(FORMATS),
    compute=st.sampled_from([DType.BF16, DType.FP16]),
)
def test_property_meta_pass_bytes_are_the_layout_sum(hidden, layers, vocab, fmt, compute):
    weights, double_quant = fmt
    model = _meta(
        transformers.BloomConfig(hidden_size=hidden, n_layer=layers, n_head=4, vocab_size=vocab)
    )
    layers_ = quantized_linears(model, weights)
    expected = 0
    for out_f, in_f in layers_.values():
        parts = (
            linear8bit_bytes(out_f, in_f)
            if weights is DType.INT8
            else linear4bit_bytes(out_f * in_f, double_quant=double_quant)
        )
        expected += sum(parts)
    rest = sum(p.numel() for p in model.parameters()) - sum(o * i for o, i in layers_.values())
    expected += rest * int(compute.itemsize)
    assert (
        meta_quantized_weight_bytes(model, weights, compute, double_quant=double_quant) == expected
    )
    assert len(layers_) == 4 * layers  # query_key_value, dense, dense_h_to_4h, dense_4h_to_h


# --- against a real bitsandbytes load on CPU ----------------------------------------------


@pytest.fixture(scope="module")
def saved_bloom(tmp_path_factory):
    pytest.importorskip("bitsandbytes")
    path = tmp_path_factory.mktemp("bloom")
    torch.manual_seed(0)
    # saved in bf16: from_pretrained keeps the checkpoint's dtype for what it does not quantize
    transformers.BloomForCausalLM(_bloom()).to(torch.bfloat16).save_pretrained(path)
    return path


@pytest.mark.parametrize(
    ("quantization", "weights", "double_quant"),
    [
        ({"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}, DType.NF4, False),
        (
            {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True},
            DType.NF4,
            True,
        ),
        ({"load_in_4bit": True, "bnb_4bit_quant_type": "fp4"}, DType.FP4, False),
        ({"load_in_8bit": True}, DType.INT8, False),
    ],
    ids=["nf4", "nf4-double-quant", "fp4", "int8"],
)
def test_meta_pass_weights_equal_a_real_cpu_load_to_the_byte(
    saved_bloom, quantization, weights, double_quant
):
    from torchfit.quantize import footprint

    config = transformers.BitsAndBytesConfig(bnb_4bit_compute_dtype=torch.bfloat16, **quantization)
    model = transformers.BloomForCausalLM.from_pretrained(
        saved_bloom, quantization_config=config, device_map="cpu"
    )
    # parameters, buffers (BLOOM has none) and every quant_state / SCB tensor, each once
    real = footprint(model)
    assert not list(model.buffers())
    assert real.quantized_parameters == sum(
        o * i for o, i in quantized_linears(_meta(_bloom()), weights).values()
    )
    meta = meta_quantized_weight_bytes(
        _meta(_bloom()), weights, DType.BF16, double_quant=double_quant
    )
    assert meta == real.total


@pytest.mark.parametrize(
    ("family", "config"),
    [
        (
            "T5ForConditionalGeneration",
            lambda: transformers.T5Config(
                d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16, vocab_size=1000
            ),
        ),
        (
            "GPTBigCodeForCausalLM",
            lambda: transformers.GPTBigCodeConfig(
                n_embd=64, n_layer=2, n_head=4, vocab_size=1000, bos_token_id=0, eos_token_id=0
            ),
        ),
    ],
    ids=["t5", "gpt_bigcode"],
)
@pytest.mark.parametrize("bits", [4, 8])
def test_other_families_equal_a_real_cpu_load_but_for_buffers(tmp_path, family, config, bits):
    pytest.importorskip("bitsandbytes")
    from torchfit.quantize import footprint

    cls = getattr(transformers, family)
    torch.manual_seed(0)
    cls(config()).to(torch.bfloat16).save_pretrained(tmp_path)
    quantization = (
        transformers.BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16,
        )
        if bits == 4
        else transformers.BitsAndBytesConfig(load_in_8bit=True)
    )
    model = cls.from_pretrained(tmp_path, quantization_config=quantization, device_map="cpu")
    # buffers (GPTBigCode's causal mask) are not weights: neither the closed form nor the
    # 16-bit meta pass counts them. T5's _keep_in_fp32_modules ("wo") stay unquantized, in
    # the checkpoint's bf16.
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    weights = DType.NF4 if bits == 4 else DType.INT8
    meta = meta_quantized_weight_bytes(_meta(config()), weights, DType.BF16)
    assert meta == footprint(model).total - buffers


def test_transformers_5_leaves_falcon_linear_unquantized_and_the_estimate_says_so(tmp_path):
    pytest.importorskip("bitsandbytes")
    torch.manual_seed(0)
    transformers.FalconForCausalLM(_falcon()).save_pretrained(tmp_path)
    config = transformers.BitsAndBytesConfig(load_in_4bit=True)
    model = transformers.FalconForCausalLM.from_pretrained(
        tmp_path, quantization_config=config, device_map="cpu"
    )
    kinds = {type(m).__name__ for m in model.modules()}
    est = estimate(_falcon(), batch_size=1, seq_len=16, dtype="nf4", mode="inference")
    if int(transformers.__version__.split(".")[0]) >= 5:
        assert "Linear4bit" not in kinds  # FalconLinear is a subclass: not replaced
        assert any("FalconLinear layers counted quantized" in n for n in est.notes)
    else:  # pragma: no cover - transformers 4.x replaces every nn.Linear
        assert "Linear4bit" in kinds


def test_a_linear_subclass_keeps_its_out_by_in_shape():
    # FalconLinear is an nn.Linear subclass: its weight is (out, in), not Conv1D's (in, out),
    # and LLM.int8 keeps one fp32 scale per output row
    model = _meta(_falcon())
    layers = quantized_linears(model, DType.INT8)
    modules = dict(model.named_modules())
    for name, shape in layers.items():
        assert shape == (modules[name].out_features, modules[name].in_features), name
    assert any(o != i for o, i in layers.values())  # the MLP: the shapes can be told apart
    rest = sum(
        p.numel() for n, p in model.named_parameters() if n.removesuffix(".weight") not in layers
    )
    expected = sum(sum(linear8bit_bytes(o, i)) for o, i in layers.values()) + 2 * rest
    assert meta_quantized_weight_bytes(model, DType.INT8, DType.BF16) == expected


# --- estimate() on models without a closed form -------------------------------------------


def test_falcon_nf4_inference_is_estimated():
    est = estimate(_falcon(), batch_size=2, seq_len=32, dtype="nf4", mode="inference")
    model = _meta(_falcon())
    assert est.weights == meta_quantized_weight_bytes(model, DType.NF4, DType.BF16)
    assert est.kv_cache > 0 and est.activations > 0
    largest = max(o * i for o, i in quantized_linears(model, DType.NF4).values())
    note = f"bitsandbytes dequantizes one 4-bit weight at a time for its matmul: {largest * 2:,}"
    assert any(n.startswith(note) for n in est.notes)
    assert any(n.startswith("8 Linear layers in nf4 + double quant") for n in est.notes)
    assert not any(n.startswith("weights in") for n in est.notes)


def test_the_dequantized_copy_is_added_on_cuda_only():
    kwargs = {"batch_size": 2, "seq_len": 32, "dtype": "nf4", "mode": "inference"}
    cuda = estimate(_falcon(), **kwargs)
    cpu = estimate(_falcon(), device="cpu", **kwargs)
    largest = max(o * i for o, i in quantized_linears(_meta(_falcon()), DType.NF4).values())
    assert not any("dequantizes" in n for n in cpu.notes)
    assert cuda.weights == cpu.weights
    assert cuda.activations >= largest * 2


@pytest.mark.parametrize("precision", ["bf16-true", "bf16-mixed"])
def test_qlora_on_falcon_is_estimated(precision):
    est = estimate(
        _falcon(),
        batch_size=2,
        seq_len=32,
        mode="train",
        lora_rank=8,
        dtype="nf4",
        precision=precision,
    )
    peft = pytest.importorskip("peft")
    wrapped = peft.get_peft_model(transformers.FalconForCausalLM(_falcon()), peft.LoraConfig(r=8))
    adapters = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    mixed = precision.endswith("mixed")
    per_adapter = 4 if mixed else 2
    # under autocast prepare_model_for_kbit_training (the default) leaves the rest in fp32
    rest = DType.FP32 if mixed else DType.BF16
    base = meta_quantized_weight_bytes(_meta(_falcon()), DType.NF4, DType.BF16, rest=rest)
    assert est.weights == base + adapters * per_adapter
    assert est.gradients <= adapters * per_adapter  # only the adapters train
    assert est.activations > 0
    assert f"adapters ({adapters:,} parameters): " in " ".join(est.notes)


def test_training_a_quantized_base_without_lora_assumes_pefts_default():
    est = estimate(_bloom(), batch_size=1, seq_len=16, mode="train", dtype="int8")
    assert any("assumed PEFT's default LoRA, r=8 on query_key_value" in n for n in est.notes)
    assert any(n.startswith("LLM.int8: nothing added") for n in est.notes)


def test_quantize_head_counts_an_untied_head_in_4_bits():
    config = _bloom(tie_word_embeddings=False)
    kwargs = {"batch_size": 1, "seq_len": 16, "dtype": "nf4", "mode": "inference"}
    kept = estimate(config, **kwargs)
    quantized = estimate(config, quantize_head=True, **kwargs)
    head = sum(linear4bit_bytes(1000 * 64, double_quant=True))
    assert kept.weights - quantized.weights == 1000 * 64 * 2 - head


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dtype": "nf4", "quantize_head": True}, "quantize_head=True.*tied.*drop quantize_head"),
        ({"dtype": "bf16", "quantize_head": True}, "needs quantized weights.*got dtype='bf16'"),
        (
            {"dtype": "nf4", "mode": "train", "trainable_params": 10},
            "does not model trainable_params",
        ),
    ],
    ids=["tied-head", "head-unquantized", "trainable-count"],
)
def test_bad_combinations_name_the_value_and_the_fix(kwargs, message):
    kwargs = {"mode": "inference", **kwargs}
    with pytest.raises(ValueError, match=message):
        estimate(_falcon(), batch_size=1, seq_len=16, **kwargs)


def test_int8_and_4bit_weights_against_the_16_bit_estimate():
    kwargs = {"batch_size": 1, "seq_len": 16, "mode": "inference"}
    bf16 = estimate(_bloom(), dtype="bf16", **kwargs).weights
    int8 = estimate(_bloom(), dtype="int8", **kwargs).weights
    nf4 = estimate(_bloom(), dtype="nf4", **kwargs).weights
    shapes = quantized_linears(_meta(_bloom()), DType.INT8).values()
    # each int8 weight: one byte instead of two, plus one fp32 scale per output row
    assert bf16 - int8 == sum(o * i - 4 * o for o, i in shapes)
    assert nf4 < int8


# --- bitsandbytes before 0.43.2: every 4-bit Linear keeps its input -----------------------
def _qlora_pass(version):
    from torchfit._core.step import Loop
    from torchfit.memory.modules.quantized import quantized_meta_pass

    return quantized_meta_pass(
        _llama(),
        weights=DType.NF4,
        seq_len=32,
        attention="sdpa",
        adapters={"rank": 8, "targets": ["q_proj", "v_proj"]},
        double_quant=True,
        head=False,
        bitsandbytes_version=version,
        base_dtype=DType.FP16,  # the same dequantized copies for both versions
        batch_size=2,
        dtype=DType.BF16,
        mode="train",
        optimizer="adamw",
        mixed_precision=None,
        device="cuda",
        loop=Loop(),
    )


def test_old_bitsandbytes_keeps_the_inputs_nothing_else_saves():
    old, new = _qlora_pass("0.41.1"), _qlora_pass("0.43.2")
    tokens, bf16 = 2 * 32, 2
    # per layer, new: the input of gate/up (the second norm's output) and of down_proj
    # (the MLP product); q/k/v's input is lora_A's too, o_proj's is SDPA's saved output
    assert old.total - new.total == 2 * tokens * (64 + 160) * bf16
    assert any("keeps its input for backward" in note for note in old.notes)
    assert not any("keeps its input for backward" in note for note in new.notes)


def test_old_bitsandbytes_in_a_qlora_estimate_leaves_the_shared_model_as_it_was():
    kwargs = {"batch_size": 1, "seq_len": 16, "dtype": "nf4", "mode": "train"}
    before = estimate(_falcon(), bitsandbytes_version="0.43.2", **kwargs)
    estimate(_falcon(), bitsandbytes_version="0.41.1", **kwargs)
    assert estimate(_falcon(), bitsandbytes_version="0.43.2", **kwargs) == before
