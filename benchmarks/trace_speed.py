"""The traced estimator: speed on GPT-2 (124M) and accuracy against real CPU allocations.

Run: python benchmarks/trace_speed.py   (about three minutes on 2 cores)

Prints two Markdown tables:
1. Speed: tracing one GPT-2 124M training step (AdamW, batch 8 x seq 1024) built on the
   meta device from ``GPT2Config()``, for the CPU and the CUDA target. Target: < 10 s on
   2 CPU cores.
2. Accuracy: ``trace(...).total`` against ``measure_step(...).peak`` (the CPU allocator's
   own events) for small models, train (AdamW, one warm-up step) and inference.
"""

from __future__ import annotations

import os
import time
import warnings

import torch
import transformers
from torch import nn

from torchfit import format_bytes
from torchfit.memory import measure_step
from torchfit.memory.tracing.tracer import trace, trace_events

transformers.logging.set_verbosity_error()
warnings.filterwarnings("ignore")
THREADS = 2
torch.set_num_threads(THREADS)


def speed_table() -> None:
    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config())
    ids = torch.zeros(8, 1024, dtype=torch.long, device="meta")
    inputs = {"input_ids": ids, "labels": ids}
    params = sum(p.numel() for p in model.parameters())
    print(
        f"GPT-2 ({params / 1e6:.0f}M parameters, meta device), batch 8 x seq 1024, AdamW, "
        f"{THREADS} threads, {os.cpu_count()} CPUs visible\n"
    )
    print("| target | trace time (s) | ops traced | predicted peak | target time | ratio |")
    print("|---|---:|---:|---:|---:|---:|")
    for device in ("cpu", "cuda"):
        start = time.perf_counter()
        result = trace_events(model, inputs, optimizer="adamw", device=device)
        seconds = time.perf_counter() - start
        print(
            f"| {device} | {seconds:.2f} | {result.ops} | "
            f"{format_bytes(result.estimate.total)} | 10 s | {seconds / 10:.2f} |"
        )
    print()


def _gpt2(attn: str, dropout: float) -> transformers.GPT2Config:
    config = transformers.GPT2Config(
        n_layer=4,
        n_embd=256,
        n_head=4,
        vocab_size=8000,
        n_positions=512,
        attn_pdrop=dropout,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
    )
    config._attn_implementation = attn  # noqa: SLF001
    return config


def _llama(attn: str) -> transformers.LlamaConfig:
    config = transformers.LlamaConfig(
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=8000,
        max_position_embeddings=512,
    )
    config._attn_implementation = attn  # noqa: SLF001
    return config


def _text(model_cls, config, batch: int, seq: int):
    torch.manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (batch, seq))
    return model_cls(config), {"input_ids": ids, "labels": ids}


def _cases():
    torch.manual_seed(0)
    yield (
        "MLP 3x1024 (LayerNorm, GELU, dropout)",
        nn.Sequential(
            nn.Linear(512, 1024),
            nn.LayerNorm(1024),
            nn.GELU(),
            nn.Dropout(0.1),
            nn.Linear(1024, 1024),
            nn.GELU(),
            nn.Linear(1024, 10),
        ),
        torch.randn(64, 512),
    )
    yield (
        "GPT-2 4L-256 eager, dropout 0.1",
        *_text(transformers.GPT2LMHeadModel, _gpt2("eager", 0.1), 8, 256),
    )
    yield (
        "GPT-2 4L-256 sdpa, dropout 0.1",
        *_text(transformers.GPT2LMHeadModel, _gpt2("sdpa", 0.1), 8, 256),
    )
    yield (
        "GPT-2 4L-256 sdpa, dropout 0",
        *_text(transformers.GPT2LMHeadModel, _gpt2("sdpa", 0.0), 8, 256),
    )
    yield "Llama 4L-256 GQA 8/2 sdpa", *_text(transformers.LlamaForCausalLM, _llama("sdpa"), 8, 256)
    yield (
        "Llama 4L-256 GQA 8/2 eager",
        *_text(transformers.LlamaForCausalLM, _llama("eager"), 4, 256),
    )
    bert = transformers.BertConfig(
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=4,
        vocab_size=8000,
    )
    bert._attn_implementation = "sdpa"  # noqa: SLF001
    model, inputs = _text(transformers.BertForMaskedLM, bert, 8, 128)
    yield "BERT 4L-256 sdpa (masked LM)", model, inputs
    vit = transformers.ViTConfig(
        image_size=64,
        patch_size=8,
        hidden_size=192,
        num_hidden_layers=4,
        num_attention_heads=3,
        intermediate_size=768,
        num_labels=100,
    )
    yield (
        "ViT 4L-192 (64x64, patch 8)",
        transformers.ViTForImageClassification(vit),
        {"pixel_values": torch.randn(16, 3, 64, 64), "labels": torch.randint(0, 100, (16,))},
    )
    yield (
        "CNN 2 conv (32, 64 ch) + BN",
        nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.BatchNorm2d(64),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(64, 10),
        ),
        torch.randn(16, 3, 32, 32),
    )
    resnet = transformers.ResNetConfig(
        embedding_size=32,
        hidden_sizes=[32, 64, 128],
        depths=[1, 1, 1],
        layer_type="basic",
        num_labels=100,
    )
    yield (
        "ResNet basic [32,64,128]",
        transformers.ResNetForImageClassification(resnet),
        {"pixel_values": torch.randn(16, 3, 64, 64), "labels": torch.randint(0, 100, (16,))},
    )
    convnext = transformers.ConvNextConfig(
        hidden_sizes=[32, 64], depths=[1, 1], num_stages=2, num_labels=10
    )
    yield (
        "ConvNeXt 2 stages [32,64]",
        transformers.ConvNextForImageClassification(convnext),
        {"pixel_values": torch.randn(8, 3, 64, 64), "labels": torch.randint(0, 10, (8,))},
    )


def accuracy_table() -> None:
    print("| model | step | measured peak | traced | error | trace time (s) |")
    print("|---|---|---:|---:|---:|---:|")
    for name, model, inputs in _cases():
        for mode, optimizer in (("train", "adamw"), ("inference", None)):
            real = measure_step(model, inputs, mode=mode, optimizer=optimizer, device="cpu").peak
            start = time.perf_counter()
            predicted = trace(model, inputs, mode=mode, optimizer=optimizer).total
            seconds = time.perf_counter() - start
            step = "train, AdamW" if mode == "train" else "inference"
            error = (predicted - real) / real
            print(
                f"| {name} | {step} | {format_bytes(real)} | {format_bytes(predicted)} | "
                f"{error:+.2%} | {seconds:.2f} |"
            )


if __name__ == "__main__":
    speed_table()
    accuracy_table()
