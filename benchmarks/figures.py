"""Regenerate the documentation's pictures (needs the ``plot`` extra; no GPU).

* ``docs/img/memory_breakdown.png``: where the memory of one GPT-2 training step goes
  (batch 8, seq 1024, RTX 3060 12GB), as stacked bars for each knob: fp32, bf16 mixed
  precision, + gradient checkpointing, + 8-bit AdamW, and bf16 inference; the card's
  memory as a line.
* ``docs/img/memory_vs_batch.png``: device memory against batch size for the README's
  plan (``torchfit plan gpt2 --gpu "RTX 3060" --seq 1024 --batch 8 --plot ...`` draws the
  same picture through ``torchfit.memory.plan.plot.plot_plan``).

Every figure comes from analytic estimates: deterministic for a given torchfit and
matplotlib. Run: python benchmarks/figures.py [--out docs/img]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import matplotlib as mpl

mpl.use("Agg")
import matplotlib.pyplot as plt

import torchfit
from torchfit.memory import estimate, to_device
from torchfit.memory.plan.plot import plot_plan
from torchfit.memory.result import MemoryEstimate

GiB = 2**30
MODEL, CARD, BATCH, SEQ = "gpt2", "RTX 3060", 8, 1024

#: (label, estimate keyword arguments) for the breakdown bars, top to bottom.
KNOBS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("fp32", {"dtype": "fp32"}),
    ("bf16 mixed precision", {"dtype": "bf16"}),
    ("bf16 + checkpointing", {"dtype": "bf16", "gradient_checkpointing": True}),
    (
        "bf16 + checkpointing\n+ 8-bit AdamW",
        {"dtype": "bf16", "gradient_checkpointing": True, "optimizer": "adamw-8bit"},
    ),
    ("bf16 inference", {"dtype": "bf16", "mode": "inference", "optimizer": None}),
)

#: Stacked segments: (label, colour, bytes of an estimate taken to the device).
SEGMENTS = (
    ("weights", "#4c72b0", lambda e: e.weights),
    ("gradients", "#55a868", lambda e: e.gradients),
    ("optimizer state", "#c44e52", lambda e: e.optimizer),
    ("activations", "#dd8452", lambda e: e.activations),
    ("KV cache", "#8172b3", lambda e: e.kv_cache),
    ("workspace + other", "#937860", lambda e: e.workspace + e.overhead),
    ("allocator slack", "#bbbbbb", lambda e: e.reserved - e.total),
    ("CUDA context", "#555555", lambda e: e.context),
)


def device_estimate(**kwargs: Any) -> MemoryEstimate:
    raw = estimate(MODEL, batch_size=BATCH, seq_len=SEQ, device="cuda", **kwargs)
    return to_device(raw, gpu=CARD)


def breakdown(path: Path) -> None:
    card = torchfit.gpu(CARD)
    rows = [(label, device_estimate(**kwargs)) for label, kwargs in KNOBS]
    figure, axes = plt.subplots(figsize=(8, 5))
    positions = range(len(rows))[::-1]
    left = [0.0] * len(rows)
    for name, colour, value in SEGMENTS:
        widths = [value(e) / GiB for _, e in rows]
        if not any(widths):
            continue
        axes.barh(list(positions), widths, left=left, color=colour, label=name, height=0.6)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    right = max(*left, card.memory / GiB)
    for y, (_, e) in zip(positions, rows, strict=True):  # totals in a column past the bars
        axes.text(right * 1.02, y, f"{e.device_total / GiB:.1f} GiB", va="center")
    axes.axvline(card.memory / GiB, color="red", linestyle="--", label=card.name)
    axes.set_yticks(list(positions), [label for label, _ in rows])
    axes.set_xlabel("GiB (device total, as nvidia-smi would show it)")
    axes.set_xlim(0, right * 1.16)
    axes.set_title(f"GPT-2 (124M), batch {BATCH} x {SEQ} tokens: where the memory goes")
    axes.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.45, -0.16), ncols=4)
    figure.tight_layout()
    figure.savefig(path, dpi=120, metadata={"Software": None})
    plt.close(figure)


def memory_vs_batch(path: Path) -> None:
    plan = torchfit.fits(MODEL, CARD, mode="train", dtype="bf16", seq_len=SEQ, batch_size=BATCH)
    plot_plan(MODEL, plan, str(path))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent.parent / "docs/img")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, draw in (("memory_breakdown", breakdown), ("memory_vs_batch", memory_vs_batch)):
        path = args.out / f"{name}.png"
        draw(path)
        print(f"wrote {path} ({path.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
