"""How many GPUs does a full fine-tune need? Per-rank totals under DDP, ZeRO and FSDP.

Prints the tables of docs/multi-gpu.md: per-rank device totals (what nvidia-smi would show)
for world sizes 1..64, the fewest GPUs each strategy needs, and DeepSpeed's own
model-state estimates for the same model beside them. Every torchfit row is what
``torchfit plan MODEL --gpu CARD --gpus N --strategy S [--offload-optimizer]
[--offload-params] [--param-dtype bf16]`` computes (`fits`).

Usage:
    python benchmarks/multi_gpu.py [--model llama-2-13b] [--gpu "A100 40GB"]
        [--seq 2048] [--batch 1] [--no-checkpointing]
"""

from __future__ import annotations

import argparse

from torchfit import fits, gpu
from torchfit.memory.analytic import spec_from_config
from torchfit.memory.catalog import model_config
from torchfit.memory.sharding import deepspeed_zero_bytes

WORLDS = (1, 2, 4, 8, 16, 32, 64)
GIB = 2**30


#: (row, strategy, fits' extra options): every row is what `fits` (and so the CLI) says.
VARIANTS: tuple[tuple[str, str, dict[str, object]], ...] = (
    ("ddp", "ddp", {}),
    ("zero1", "zero1", {}),
    ("zero2", "zero2", {}),
    ("fsdp", "fsdp", {}),
    ("fsdp, bf16 MixedPrecisionPolicy", "fsdp", {"param_dtype": "bf16"}),
    ("fsdp+opt-offload", "fsdp", {"offload_optimizer": True}),
    ("fsdp+opt-offload, bf16 MPP", "fsdp", {"offload_optimizer": True, "param_dtype": "bf16"}),
    (
        "fsdp+opt+param-offload, bf16 MPP",
        "fsdp",
        {"offload_optimizer": True, "offload_params": True, "param_dtype": "bf16"},
    ),
)


def _plan_rows(args: argparse.Namespace, card_name: str) -> dict[str, list[float]]:
    """Per-rank device totals from `fits`, as the CLI computes them."""
    common = {
        "batch_size": args.batch,
        "seq_len": args.seq,
        "gradient_checkpointing": args.checkpointing,
    }
    return {
        name: [
            fits(
                args.model, [card_name] * n, strategy=strategy, **common, **options
            ).estimate.device_total
            / GIB
            for n in WORLDS
        ]
        for name, strategy, options in VARIANTS
    }


def _deepspeed_rows(model: str) -> tuple[dict[str, list[float]], int, int]:
    spec = spec_from_config(model_config(model))
    p = spec.num_params
    block = (p - spec.embedding_params - spec.head_params) // spec.num_layers
    largest = max(block, spec.embedding_params, spec.head_params)
    rows = {
        "DeepSpeed ZeRO-2": [deepspeed_zero_bytes(p, n, 2) / GIB for n in WORLDS],
        "DeepSpeed ZeRO-3": [
            deepspeed_zero_bytes(p, n, 3, largest_layer_params=largest) / GIB for n in WORLDS
        ],
        "DeepSpeed ZeRO-3 + opt offload": [
            deepspeed_zero_bytes(p, n, 3, largest_layer_params=largest, offload_optimizer=True)
            / GIB
            for n in WORLDS
        ],
    }
    return rows, p, largest


def _table(rows: dict[str, list[float]], budget: float) -> str:
    head = f"| {'per rank, GiB':<34} |" + "".join(f" N={n:<5}|" for n in WORLDS)
    head += " fewest GPUs |"
    lines = [head, "|" + "---|" * (len(WORLDS) + 2)]
    for name, values in rows.items():
        fewest = next((n for n, v in zip(WORLDS, values, strict=True) if v <= budget), None)
        cells = "".join(f" {v:6.1f}|" for v in values)
        lines.append(f"| {name:<34} |{cells} {fewest or '> 64'} |")
    return "\n".join(lines)


def main() -> None:
    """Print the worked example's tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-2-13b")
    parser.add_argument("--gpu", default="A100 40GB")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--no-checkpointing", dest="checkpointing", action="store_false")
    args = parser.parse_args()
    card = gpu(args.gpu)
    budget = card.memory / GIB
    print(
        f"{args.model} full fine-tune, AdamW, {'bf16' if card.bf16 else 'fp16'} autocast, "
        f"seq {args.seq}, batch {args.batch} per GPU, "
        f"checkpointing {'on' if args.checkpointing else 'off'}; "
        f"{card.name} ({budget:.2f} GiB)\n"
    )
    rows = _plan_rows(args, args.gpu)
    print(_table(rows, budget))
    ds, p, largest = _deepspeed_rows(args.model)
    print(
        f"\nDeepSpeed's estimators, model states only (P = {p:,}, largest layer "
        f"{largest:,}; no activations, no CUDA context):\n"
    )
    print(_table(ds, budget))


if __name__ == "__main__":
    main()
