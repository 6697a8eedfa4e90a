"""The analytic estimate under autocast: against the CUDA-target trace (CUDA's op lists)
and against real CPU autocast steps."""

import pytest
import torch

from cuda_target import tensors_of
from torchfit.memory import estimate, measure_step, trace

transformers = pytest.importorskip("transformers")

VOCAB, BATCH, SEQ = 3000, 8, 128


def _model(family, attn):
    if family == "gpt2":
        config = transformers.GPT2Config(
            n_layer=3,
            n_embd=256,
            n_head=4,
            n_positions=256,
            vocab_size=VOCAB,
            attn_implementation=attn,
        )
        cls = transformers.GPT2LMHeadModel
    elif family == "bert":
        config = transformers.BertConfig(
            hidden_size=256,
            intermediate_size=768,
            num_hidden_layers=3,
            num_attention_heads=4,
            vocab_size=VOCAB,
            max_position_embeddings=256,
            attn_implementation=attn,
        )
        cls = transformers.BertForMaskedLM
    else:
        config = transformers.LlamaConfig(
            hidden_size=256,
            intermediate_size=768,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=VOCAB,
            max_position_embeddings=256,
            attn_implementation=attn,
        )
        cls = transformers.LlamaForCausalLM
    torch.manual_seed(0)
    config.bos_token_id = config.eos_token_id = 0
    model = cls(config)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    return config, model, {"input_ids": ids, "labels": ids}


CASES = [(f, a) for f in ("gpt2", "bert", "llama") for a in ("eager", "sdpa")]


@pytest.mark.parametrize(("family", "attn"), CASES)
def test_cuda_autocast_estimate_against_the_cuda_target_trace(family, attn):
    config, model, inputs = _model(family, attn)
    traced = trace(model, inputs, precision="bf16-mixed", device="cuda", optimizer="sgd")
    predicted = estimate(
        config,
        batch_size=BATCH,
        seq_len=SEQ,
        precision="bf16-mixed",
        attn_implementation=attn,
        device="cuda",
        optimizer="sgd",
    )
    allocated = tensors_of(traced)  # the estimate leaves cuBLAS to to_device
    error = (predicted.total - allocated) / allocated
    if (family, attn) == ("gpt2", "sdpa"):
        # GPT-2's Q/K/V are strided views of c_attn's output: the trace's CPU flash kernel
        # keeps more for them than CUDA's (2.3 hidden-sized 16-bit tensors a layer here),
        # so the closed form is below this trace; on the H200 it was within 0.2% of
        # GPT-2's real SDPA steps
        assert -0.04 <= error <= 0, f"{error:+.1%}"
        return
    # within 2% since the head's 16-bit weight copy is counted (it was 4%, with errors
    # of -2.8% to -0.5%)
    assert abs(error) <= 0.02, f"{error:+.1%}"


@pytest.mark.parametrize("precision", ["16-mixed", "bf16-mixed", "bf16-true"])
def test_a_masked_lms_loss_follows_its_dtype_as_cuda_runs_it(precision):
    # nn.CrossEntropyLoss on 16-bit logits: a 16-bit log-softmax (and, under autocast,
    # nll_loss's fp32 copy), not the fp32 path of transformers' causal-LM loss. The closed
    # form was +9% on a real H200 BERT MLM fp16 step before it followed this.
    config, model, inputs = _model("bert", "sdpa")
    if precision == "bf16-true":
        model = model.to(torch.bfloat16)
    traced = trace(model, inputs, precision=precision, device="cuda", optimizer="sgd")
    predicted = estimate(
        config, batch_size=BATCH, seq_len=SEQ, precision=precision, device="cuda", optimizer="sgd"
    )
    allocated = tensors_of(traced)
    error = (predicted.total - allocated) / allocated
    # before: +8.8%, +8.8%, +40.5%; a pure-bf16 BERT's blocks still differ by +4%
    assert abs(error) <= (0.05 if precision == "bf16-true" else 0.02), f"{error:+.1%}"


@pytest.mark.parametrize(("family", "attn"), CASES)
def test_cpu_autocast_estimate_against_the_real_step(family, attn):
    config, model, inputs = _model(family, attn)
    measured = measure_step(model, inputs, precision="bf16-mixed", device="cpu").peak
    predicted = estimate(
        config,
        batch_size=BATCH,
        seq_len=SEQ,
        precision="bf16-mixed",
        attn_implementation=attn,
        device="cpu",
    ).total
    error = (predicted - measured) / measured
    assert abs(error) <= 0.06, f"{error:+.1%}"
