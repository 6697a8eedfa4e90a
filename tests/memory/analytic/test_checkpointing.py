"""The closed form under gradient checkpointing, against the CUDA-target trace."""

import pytest
import torch

from torchfit.memory import estimate, trace

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_checkpointing_recomputes_after_the_loss_backward(family):
    # The loss's backward runs before any block is recomputed: counting a recomputed
    # block at that moment put the closed form 5% over a real H200 Llama-3.2-1B step.
    if family == "llama":
        config = transformers.LlamaConfig(
            hidden_size=256,
            intermediate_size=1024,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=4000,
            use_cache=False,
        )
    else:
        config = transformers.GPT2Config(
            n_layer=4, n_embd=256, n_head=4, vocab_size=4000, use_cache=False
        )
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        ids = torch.zeros(8, 256, dtype=torch.long)
    model.gradient_checkpointing_enable()
    model.train()
    traced = trace(
        model,
        {"input_ids": ids, "labels": ids},
        precision="bf16-true",
        device="cuda",
        optimizer="sgd",
    )
    predicted = estimate(
        config,
        batch_size=8,
        seq_len=256,
        precision="bf16-true",
        gradient_checkpointing=True,
        device="cuda",
        optimizer="sgd",
    )
    workspace = next(n for n in traced.notes if n.startswith("cuBLAS workspace"))
    size, unit = workspace.split()[2:4]
    allocated = traced.total - round(float(size) * {"MiB": 2**20, "KiB": 2**10}[unit])
    error = (predicted.total - allocated) / allocated
    assert abs(error) <= 0.02, f"{error:+.1%}"
