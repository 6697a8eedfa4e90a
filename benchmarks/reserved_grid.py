"""The closed form's device view against the traced step's, at sizes no GPU run covered.

On the H200 runs (`gpu_report.py`) the traced step (fake tensors under CUDA's rules, its
own allocation events replayed through the caching-allocator model) gave
``max_memory_reserved`` within 0.2% on every traced transformer step. This script uses it
as the reference for the closed form (`estimate` then `to_device`, whose reserved bytes
and OOM line come from a synthetic schedule of the step) over a grid of models, recipes,
batches and sequence lengths, and prints the error of each: allocated peak, reserved
peak, OOM line. Runs on the CPU in about three minutes.

    python benchmarks/reserved_grid.py
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from gpu_report import analytic, traced

GIB = 2**30

#: (model of gpu_check.CONFIGS, weights, autocast, checkpointing, task, [(batch, seq)])
GRID: list[tuple[str, str, str | None, bool, str, list[tuple[int, int]]]] = [
    ("gpt2", "fp32", None, False, "causal", [(1, 1024), (4, 1024), (16, 512)]),
    ("gpt2", "fp32", "bf16", False, "causal", [(1, 1024), (4, 1024), (16, 512)]),
    ("llama-3.2-1b", "bf16", None, False, "causal", [(1, 4096), (2, 1024), (8, 1024), (2, 8192)]),
    ("llama-3.2-1b", "bf16", None, True, "causal", [(1, 4096), (2, 1024), (8, 1024), (2, 8192)]),
    ("llama-3.2-1b", "fp32", "bf16", False, "causal", [(1, 4096), (2, 1024), (8, 1024), (2, 8192)]),
    ("qwen2.5-0.5b", "fp32", "bf16", False, "causal", [(1, 2048), (4, 4096), (16, 512)]),
    ("qwen2.5-0.5b", "bf16", None, True, "causal", [(1, 2048), (4, 4096), (16, 512)]),
    ("qwen2.5-0.5b", "fp32", "bf16", True, "causal", [(4, 2048), (16, 512)]),
    ("llama-3.2-1b", "fp32", "bf16", True, "causal", [(2, 2048), (8, 1024), (4, 4096)]),
    ("gpt2", "fp32", "bf16", True, "causal", [(4, 1024), (16, 1024)]),
    ("qwen3-0.6b", "bf16", None, False, "causal", [(1, 2048), (4, 4096), (16, 512)]),
    ("llama-3.2-3b", "bf16", None, True, "causal", [(1, 8192), (2, 2048)]),
    ("llama-3.2-3b", "bf16", None, False, "causal", [(1, 8192), (2, 2048)]),
    ("bert-base", "fp32", "fp16", False, "mlm", [(8, 512), (64, 128), (16, 256)]),
    ("bert-base", "fp32", None, False, "mlm", [(8, 512), (64, 128), (16, 256)]),
    ("bert-base", "fp32", "fp16", True, "mlm", [(16, 512), (12, 384)]),
    ("bert-base", "bf16", None, True, "mlm", [(16, 512), (4, 512)]),
]


def cases() -> list[dict[str, Any]]:
    """The grid as `gpu_check.py` records (what `analytic` and `traced` take)."""
    out = []
    for model, weights, autocast, checkpointing, task, sizes in GRID:
        for batch, seq in sizes:
            out.append(
                {
                    "kind": "train",
                    "model": model,
                    "weights": weights,
                    "autocast": autocast,
                    "gradient_checkpointing": checkpointing,
                    "task": task,
                    "optimizer": "adamw",
                    "batch": batch,
                    "seq": seq,
                }
            )
    return out


def _name(rec: dict[str, Any]) -> str:
    precision = rec["weights"]
    if rec["autocast"]:
        precision += f"+{rec['autocast']} autocast"
    checkpointing = ", checkpointing" if rec["gradient_checkpointing"] else ""
    return f"{rec['model']} {precision}{checkpointing} b{rec['batch']} s{rec['seq']}"


def _error(predicted: float, reference: float) -> float:
    return predicted / reference - 1


def _summary(label: str, errors: list[float]) -> str:
    worst = max(errors, key=abs)
    over = sum(abs(e) > 0.05 for e in errors)
    return (
        f"{label}: median |error| {statistics.median(abs(e) for e in errors):.1%}, "
        f"worst {worst:+.1%}, over 5%: {over} of {len(errors)}"
    )


def main() -> None:
    """Print the table and the summary (markdown)."""
    print("| step | allocated (trace) | closed form | reserved (trace) | closed form | OOM line |")
    print("|---|---|---|---|---|---|")
    errors: dict[str, list[float]] = {"allocated": [], "reserved": [], "OOM line": []}
    for rec in cases():
        mine, reference = analytic(rec, 0), traced(rec)
        pairs = {
            "allocated": (mine.total, reference.total),
            "reserved": (mine.reserved, reference.reserved),
            # the line without the CUDA context (`analytic` is given none, the trace has one)
            "OOM line": (
                mine.device_needed - mine.context,
                reference.device_needed - reference.context,
            ),
        }
        for key, (predicted, real) in pairs.items():
            errors[key].append(_error(predicted, real))
        print(
            f"| {_name(rec)} | {reference.total / GIB:.2f} | {errors['allocated'][-1]:+.1%} | "
            f"{reference.reserved / GIB:.2f} | {errors['reserved'][-1]:+.1%} | "
            f"{errors['OOM line'][-1]:+.1%} |",
            flush=True,
        )
    print()
    for key, found in errors.items():
        print("- " + _summary(key, found))


if __name__ == "__main__":
    main()
