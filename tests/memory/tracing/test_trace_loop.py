"""trace and measure_step take the same loop and precision, and agree on real CPU steps."""

import pytest
import torch

from torchfit import Step
from torchfit.memory import measure_step, trace

transformers = pytest.importorskip("transformers")

VOCAB = 1000


def _gpt2():
    config = transformers.GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=4,
        n_positions=128,
        vocab_size=VOCAB,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, VOCAB, (4, 64))
    return model, {"input_ids": ids, "labels": ids}


@pytest.mark.parametrize(
    "knobs",
    [
        dict(keep_output=True),
        dict(gradient_accumulation_steps=2),
        dict(set_to_none=False, gradient_accumulation_steps=3, keep_output=True),
        dict(precision="bf16-true"),
        dict(precision="32-true", keep_output=True),
        dict(precision="bf16-true", keep_output=True, fp32_output=True),
    ],
    ids=["output-kept", "accumulate", "all-loop", "bf16-true", "fp32", "fabric"],
)
def test_trace_is_exact_for_the_loop_it_is_told(knobs):
    model, inputs = _gpt2()
    traced = trace(model, inputs, optimizer="adamw", device="cpu", **knobs)
    measured = measure_step(model, inputs, optimizer="adamw", device="cpu", **knobs)
    plain_traced = trace(model, inputs, optimizer="adamw", device="cpu")
    plain_measured = measure_step(model, inputs, optimizer="adamw", device="cpu")
    # the knob moves both by the same bytes; this GPT-2 leaves 48 bytes of small tensors
    # made outside dispatch out of every trace, knobs or not
    assert traced.total - plain_traced.total == measured.peak - plain_measured.peak
    assert abs(traced.total - measured.peak) <= 64


def test_keeping_the_output_costs_the_logits():
    model, inputs = _gpt2()
    kept = trace(model, inputs, optimizer="sgd", device="cpu", keep_output=True)
    dropped = trace(model, inputs, optimizer="sgd", device="cpu", keep_output=False)
    logits = 4 * 64 * VOCAB * 4
    assert kept.total - dropped.total == logits


def test_precision_and_autocast_must_agree():
    model, inputs = _gpt2()
    with pytest.raises(ValueError, match="contradicts precision='bf16-true'"):
        trace(model, inputs, precision="bf16-true", autocast_dtype=torch.bfloat16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="converts a copy of the model"):
        measure_step(model, inputs, optimizer=optimizer, precision="bf16-true", device="cpu")


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_gradient_checkpointing_traces_for_cuda(family):
    # The recomputation runs inside backward, where a torch function mode is not active:
    # it must still take the fused SDPA / dropout the forward took (was a CheckpointError)
    if family == "llama":
        config = transformers.LlamaConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            vocab_size=VOCAB,
            max_position_embeddings=128,
            attention_dropout=0.1,
        )
        cls = transformers.LlamaForCausalLM
    else:
        config = transformers.BertConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            vocab_size=VOCAB,
            max_position_embeddings=128,
        )
        cls = transformers.BertForMaskedLM
    torch.manual_seed(0)
    model = cls(config)
    ids = torch.randint(0, VOCAB, (16, 128))
    inputs = {"input_ids": ids, "labels": ids}
    sdpa = torch.nn.functional.scaled_dot_product_attention
    plain = trace(model, inputs, device="cuda", optimizer="sgd")
    model.gradient_checkpointing_enable()
    checkpointed = trace(model, inputs, device="cuda", optimizer="sgd")
    assert checkpointed.activations < plain.activations
    assert torch.nn.functional.scaled_dot_product_attention is sdpa  # restored


def test_cuda_sdpa_in_fp32_with_grouped_heads_traces_the_math_path():
    # CUDA's flash kernel takes 16 bits only and its memory-efficient one no grouped heads,
    # so transformers' enable_gqa=True in fp32 leaves the math path, s x s probabilities saved
    def traced(kv_heads, dtype):
        config = transformers.LlamaConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=kv_heads,
            vocab_size=VOCAB,
            max_position_embeddings=512,
        )
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config).to(dtype)
        ids = torch.randint(0, VOCAB, (2, 512))
        return trace(model, {"input_ids": ids, "labels": ids}, device="cuda", optimizer="sgd")

    grouped, plain = traced(2, torch.float32), traced(4, torch.float32)
    assert grouped.total - plain.total > 2 * 4 * 512 * 512 * 4  # the probabilities
    assert any("left on the math" in note for note in grouped.notes)
    assert not any("left on the math" in note for note in plain.notes)
    assert not any("left on the math" in note for note in traced(2, torch.bfloat16).notes)


def test_an_fp32_mixture_of_experts_traces_exactly():
    # transformers runs experts with grouped_mm, whose fake kernel demands bf16 on CPU;
    # the trace takes transformers' own fallback op, which allocates the same tensors
    config = transformers.MixtralConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        vocab_size=VOCAB,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(config)
    ids = torch.randint(0, VOCAB, (2, 32))
    inputs = {"input_ids": ids, "labels": ids}
    traced = trace(model, inputs, device="cpu").total
    measured = measure_step(model, inputs, device="cpu").peak
    assert abs(traced - measured) <= 64


def test_a_step_with_fp32_outputs_traces_as_its_keywords():
    model, inputs = _gpt2()
    loop = dict(precision="bf16-true", keep_output=True, fp32_output=True)
    step = Step(batch_size=4, device="cpu", **loop)
    by_step = trace(model, inputs, step=step)
    assert by_step.total == trace(model, inputs, device="cpu", **loop).total
    assert by_step.total > trace(model, inputs, step=step.replace(fp32_output=False)).total
