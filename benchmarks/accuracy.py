"""Analytic and traced estimates against real CPU allocations of the same step.

Run: python benchmarks/accuracy.py   (about five minutes on 2 cores)
Prints a Markdown table: model, step, measured peak, analytic estimate and its error,
traced estimate (`torchfit.memory.trace`) and its error, the analytic estimate's time.
"""

from __future__ import annotations

import time
import warnings

import torch
import transformers
from torch import nn

from torchfit import format_bytes
from torchfit.memory import estimate, measure_step, trace
from torchfit.memory.catalog import build_model

transformers.logging.set_verbosity_error()
warnings.filterwarnings("ignore")

CASES = [
    (
        "GPT-2 4L-256 (eager, dropout 0.1)",
        transformers.GPT2Config(
            n_layer=4,
            n_embd=256,
            n_head=4,
            vocab_size=8000,
            n_positions=512,
            attn_implementation="eager",
        ),
        8,
        256,
    ),
    (
        "GPT-2 4L-256 (sdpa, dropout 0)",
        transformers.GPT2Config(
            n_layer=4,
            n_embd=256,
            n_head=4,
            vocab_size=8000,
            n_positions=512,
            resid_pdrop=0,
            embd_pdrop=0,
            attn_pdrop=0,
            attn_implementation="sdpa",
        ),
        8,
        256,
    ),
    (
        "Llama 4L-256 GQA 8/2 (sdpa)",
        transformers.LlamaConfig(
            hidden_size=256,
            intermediate_size=688,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=2,
            vocab_size=8000,
            max_position_embeddings=512,
            attn_implementation="sdpa",
        ),
        8,
        256,
    ),
    (
        "Llama 4L-256 GQA 8/2 (eager)",
        transformers.LlamaConfig(
            hidden_size=256,
            intermediate_size=688,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=2,
            vocab_size=8000,
            max_position_embeddings=512,
            attn_implementation="eager",
        ),
        4,
        256,
    ),
    (
        "BERT 4L-256 (eager)",
        transformers.BertConfig(
            hidden_size=256,
            intermediate_size=1024,
            num_hidden_layers=4,
            num_attention_heads=4,
            vocab_size=8000,
            attn_implementation="eager",
        ),
        8,
        128,
    ),
    (
        "ViT 4L-192 (64x64, patch 8)",
        transformers.ViTConfig(
            image_size=64,
            patch_size=8,
            hidden_size=192,
            num_hidden_layers=4,
            num_attention_heads=3,
            intermediate_size=768,
            num_labels=100,
        ),
        16,
        None,
    ),
    (
        "ResNet bottleneck [32,64]",
        transformers.ResNetConfig(
            embedding_size=16,
            hidden_sizes=[32, 64],
            depths=[1, 1],
            layer_type="bottleneck",
            num_labels=10,
            image_size=32,
        ),
        8,
        None,
    ),
    (
        "ConvNeXt [48,96] (96x96)",
        transformers.ConvNextConfig(
            hidden_sizes=[48, 96], depths=[1, 1], num_stages=2, num_labels=10, image_size=96
        ),
        8,
        None,
    ),
    (
        "ConvNeXt [32,64,128] x2 (64x64)",
        transformers.ConvNextConfig(
            hidden_sizes=[32, 64, 128], depths=[2, 2, 2], num_stages=3, num_labels=10, image_size=64
        ),
        8,
        None,
    ),
    (
        "ResNet basic [32,64,128]",
        transformers.ResNetConfig(
            embedding_size=32,
            hidden_sizes=[32, 64, 128],
            depths=[1, 1, 1],
            layer_type="basic",
            num_labels=100,
        ),
        16,
        None,
    ),
]


def _cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )


def _grouped_cnn() -> nn.Module:
    """An RGB stem, a grouped conv, a strided depthwise conv and a grouped 1x1 conv."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1, groups=4),
        nn.GroupNorm(8, 64),
        nn.ReLU(),
        nn.Conv2d(64, 64, 3, stride=2, padding=1, groups=64),
        nn.ReLU(),
        nn.Conv2d(64, 128, 1, groups=2),
        nn.GELU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, 10),
    )


def _row(name, step, real, predicted, traced, *, seconds):
    def error(value):
        return f"{(value - real) / real:+.1%}"

    return (
        f"| {name} | {step} | {format_bytes(real)} | {format_bytes(predicted)} | "
        f"{error(predicted)} | {format_bytes(traced)} | {error(traced)} | {seconds:.3f} |"
    )


def main() -> None:
    print(
        "| model | step | measured peak | analytic | error | traced | error | estimate time (s) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    errors = []
    for name, config, batch, seq in CASES:
        torch.manual_seed(0)
        model = build_model(config, device="cpu", dtype="fp32")
        if config.model_type == "bert":  # estimated with its masked-LM head, as pre-trained
            model = transformers.BertForMaskedLM(config)
        for mode in ("train", "inference"):
            if seq is None:
                shape = (3, getattr(config, "image_size", 64), getattr(config, "image_size", 64))
                inputs = torch.randn(batch, *shape)
                kwargs = {"input_shape": shape}
            else:
                ids = torch.randint(0, config.vocab_size, (batch, seq))
                inputs = (
                    {"input_ids": ids, "labels": ids} if mode == "train" else {"input_ids": ids}
                )
                kwargs = {"seq_len": seq, "attn_implementation": config._attn_implementation}  # noqa: SLF001
            optimizer = "adamw" if mode == "train" else None
            real = measure_step(model, inputs, mode=mode, optimizer=optimizer)
            start = time.perf_counter()
            predicted = estimate(
                config, batch_size=batch, mode=mode, optimizer=optimizer, device="cpu", **kwargs
            )
            seconds = time.perf_counter() - start
            traced = trace(model, inputs, mode=mode, optimizer=optimizer)
            step = f"{mode} b{batch}" + (f" s{seq}" if seq else "")
            print(
                _row(name, step, real.peak, predicted.total, traced.total, seconds=seconds),
                flush=True,
            )
            errors.append(abs(predicted.total - real.peak) / real.peak)
    for name, net, batches in (
        ("plain CNN (nn.Module)", _cnn(), (8, 64)),
        ("grouped CNN (nn.Module)", _grouped_cnn(), (8,)),
    ):
        for batch in batches:
            x = torch.randn(batch, 3, 32, 32)
            real = measure_step(net, x, optimizer="sgd-momentum")
            start = time.perf_counter()
            predicted = estimate(
                net,
                batch_size=batch,
                input_shape=(3, 32, 32),
                optimizer="sgd-momentum",
                device="cpu",
            )
            seconds = time.perf_counter() - start
            traced = trace(net, x, optimizer="sgd-momentum")
            step = f"train b{batch}"
            print(
                _row(name, step, real.peak, predicted.total, traced.total, seconds=seconds),
                flush=True,
            )
            errors.append(abs(predicted.total - real.peak) / real.peak)
    print(
        f"\nanalytic: mean |error| {sum(errors) / len(errors):.1%}, max |error| "
        f"{max(errors):.1%} over {len(errors)} steps"
    )


if __name__ == "__main__":
    main()
