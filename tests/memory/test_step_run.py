"""A `Step` as the loop of `trace` and `measure_step`: the same step as the keywords."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from torchfit import Step
from torchfit.memory import measure_step, trace


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 8))


LOOPS = [
    {"optimizer": "sgd"},
    {"optimizer": "adamw", "precision": "bf16-mixed"},
    {"optimizer": "adamw", "gradient_accumulation_steps": 2, "set_to_none": False},
    {"optimizer": "sgd-momentum", "keep_output": True},
    {"optimizer": "adamw", "optimizer_in_backward": True},
    {"mode": "inference"},
]


@pytest.mark.parametrize("loop", LOOPS, ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
def test_a_step_traces_and_measures_as_its_keywords_do(loop):
    net, x = _net(), torch.randn(16, 64)
    step = Step(batch_size=16, device="cpu", **loop)
    keywords = dict(loop)
    if loop.get("mode") == "inference":
        keywords["optimizer"] = None
    assert trace(net, x, step=step) == trace(net, x, **keywords)
    assert (
        measure_step(net, x, step=step).peak == measure_step(net, x, device="cpu", **keywords).peak
    )


def test_a_step_for_cuda_traces_for_cuda():
    net, x = _net(), torch.randn(16, 64)
    traced = trace(net, x, step=Step(optimizer="sgd"), gpu="RTX 3060")
    assert traced.device == "cuda" and traced.reserved is not None
    assert traced == trace(net, x, optimizer="sgd", device="cuda", gpu="RTX 3060")


@pytest.mark.parametrize(
    ("step", "message"),
    [
        (Step(lora_rank=8, device="cpu"), "lora_rank=8.*peft.get_peft_model"),
        (Step(quantization="nf4", device="cpu"), "quantization='nf4'.*load_quantized"),
        (Step(attn_implementation="eager", device="cpu"), "attn_implementation='eager'"),
        (Step(loss_chunk_size=128, device="cpu"), "loss_chunk_size=128"),
        (Step(batch_size=8, device="cpu"), r"batch_size=8.*\[16, 64\]"),
        (Step(gradient_checkpointing=True, device="cpu"), "gradient_checkpointing_enable"),
    ],
)
def test_what_a_step_cannot_apply_to_a_built_model_is_refused(step, message):
    with pytest.raises(ValueError, match=message):
        trace(_net(), torch.randn(16, 64), step=step)


def test_a_step_and_loop_keywords_together_are_refused():
    net, x = _net(), torch.randn(16, 64)
    with pytest.raises(TypeError, match=r"optimizer=.*step.replace"):
        trace(net, x, step=Step(device="cpu"), optimizer="sgd")
    with pytest.raises(TypeError, match="device='cuda' and Step"):
        trace(net, x, step=Step(device="cpu"), device="cuda")
    with pytest.raises(TypeError, match="step must be Step or None"):
        trace(net, x, step={"batch_size": 16})


def test_measure_step_runs_where_the_model_is():
    with pytest.raises(ValueError, match=r"Step.device='cuda'. but the model is on 'cpu'"):
        measure_step(_net(), torch.randn(16, 64), step=Step())


def test_a_checkpointed_model_takes_a_checkpointing_step():
    config = LlamaConfig(
        num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.gradient_checkpointing_enable()
    batch = {"input_ids": torch.randint(0, 256, (2, 32)), "labels": torch.randint(0, 256, (2, 32))}
    step = Step(batch_size=2, seq_len=32, gradient_checkpointing=True, device="cpu")
    assert trace(model, batch, step=step) == trace(model, batch)
    with pytest.raises(ValueError, match=r"seq_len=64.*32"):
        trace(model, batch, step=step.replace(seq_len=64))


def test_a_step_is_the_predictor_max_batch_size_and_the_finder_take():
    from torchfit.memory import find_batch_size, max_batch_size, simulate_gpu
    from torchfit.memory.estimator import batch_predictor

    config = LlamaConfig(
        num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256,
    )  # fmt: skip
    step = Step(batch_size=16, seq_len=32, precision="bf16-mixed", device="cpu")
    predict = batch_predictor(config, step)
    for batch in (1, 3, 7):  # the step's own batch (16) is the one varied
        assert predict(batch) == memory_estimate(config, step.replace(batch_size=batch))
    by_keywords = max_batch_size(
        lambda b: memory_estimate(config, batch_size=b, seq_len=32, dtype="bf16", device="cpu"),
        "64MiB",
    )
    assert max_batch_size(predict, "64MiB") == by_keywords > 1
    tried = []

    @find_batch_size(predict=predict, budget=simulate_gpu("64MiB"))
    def run(batch_size):
        tried.append(batch_size)

    run()
    assert tried[0] == max_batch_size(predict, simulate_gpu("64MiB"))


def memory_estimate(*args, **kwargs):
    from torchfit.memory import estimate

    return estimate(*args, **kwargs)
