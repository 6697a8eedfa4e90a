"""The estimators against real CUDA: allocated, reserved and device totals.

Run on a machine with a CUDA GPU (under 5 minutes on one GPU):

    python benchmarks/gpu_check.py            # prints a Markdown table
    python benchmarks/gpu_check.py --quick    # two models only

For each model and step it measures ``max_memory_allocated``, ``max_memory_reserved`` and
the process's device usage (``torch.cuda.mem_get_info`` before/after, which includes the
CUDA context), and prints torchfit's analytic estimate (allocated), its allocator model
(reserved) and its device total (reserved + context) beside them.
"""

from __future__ import annotations

import argparse
import gc
import sys

import torch
import transformers

from torchfit import format_bytes
from torchfit.memory import estimate, measure_step, to_device
from torchfit.memory.catalog import build_model

transformers.logging.set_verbosity_error()


def _zoo(*, quick: bool):
    gpt2 = transformers.GPT2Config(n_layer=6, n_embd=512, n_head=8, vocab_size=32000)
    llama = transformers.LlamaConfig(
        hidden_size=512,
        intermediate_size=1376,
        num_hidden_layers=6,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=32000,
        max_position_embeddings=2048,
    )
    bert = transformers.BertConfig(
        hidden_size=512,
        intermediate_size=2048,
        num_hidden_layers=6,
        num_attention_heads=8,
        vocab_size=30522,
    )
    resnet = transformers.ResNetConfig(
        embedding_size=64,
        hidden_sizes=[64, 128, 256, 512],
        depths=[2, 2, 2, 2],
        layer_type="basic",
        num_labels=1000,
    )
    cases = [
        ("GPT-2 6L-512 fp32", gpt2, "fp32", 8, 512),
        ("Llama 6L-512 GQA bf16", llama, "bf16", 8, 1024),
    ]
    if not quick:
        cases += [
            ("GPT-2 6L-512 bf16 AMP", gpt2, "bf16", 16, 512),
            ("BERT 6L-512 fp32", bert, "fp32", 16, 256),
            ("ResNet-18-like fp32 224", resnet, "fp32", 32, None),
        ]
    return cases


def _inputs(config, batch, seq, device):
    if seq is None:
        return torch.randn(batch, 3, 224, 224, device=device)
    ids = torch.randint(0, config.vocab_size, (batch, seq), device=device)
    return {"input_ids": ids, "labels": ids}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("benchmarks/gpu_check.py needs a CUDA GPU; none is available here")
        return 1
    torch.ones(1, device="cuda")  # creates the context
    free, total = torch.cuda.mem_get_info()
    context_real = total - free - torch.cuda.memory_reserved()
    name = torch.cuda.get_device_name(0)
    print(
        f"GPU: {name}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
        f"context {format_bytes(context_real)}\n"
    )
    print(
        "| model | step | allocated (real) | analytic | err | reserved (real) | "
        "reserved (model) | err | device (real) | device (model) | err |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for label, config, dtype, batch, seq in _zoo(quick=args.quick):
        mixed = dtype != "fp32"
        model = build_model(config, device="cuda", dtype="fp32")
        inputs = _inputs(config, batch, seq, "cuda")

        def loss_fn(output):
            return output.logits.float().sum()

        step_dtype = torch.bfloat16 if mixed else None
        with torch.autocast("cuda", dtype=step_dtype or torch.float32, enabled=mixed):
            real = measure_step(
                model, inputs, optimizer="adamw", device="cuda", loss_fn=None if seq else loss_fn
            )
        device_real = context_real + (real.reserved or 0)
        kwargs = {"seq_len": seq} if seq else {"input_shape": (3, 224, 224)}
        predicted = to_device(
            estimate(config, batch_size=batch, dtype=dtype, device="cuda", **kwargs),
            gpu=None,
        )

        def err(a, b):
            return f"{(a - b) / b:+.1%}"

        print(
            f"| {label} | train b{batch}" + (f" s{seq}" if seq else "") + " | "
            f"{format_bytes(real.peak)} | {format_bytes(predicted.total)} | "
            f"{err(predicted.total, real.peak)} | {format_bytes(real.reserved)} | "
            f"{format_bytes(predicted.reserved)} | {err(predicted.reserved, real.reserved)} | "
            f"{format_bytes(device_real)} | {format_bytes(predicted.device_total)} | "
            f"{err(predicted.device_total, device_real)} |",
            flush=True,
        )
        del model, inputs, real
        gc.collect()
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
