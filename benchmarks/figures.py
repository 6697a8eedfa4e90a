"""Regenerate the documentation's pictures (needs the ``plot`` extra; no GPU).

* ``docs/img/memory_breakdown.png`` (home page): where the memory of one training step of
  Qwen2.5-1.5B goes (batch 1 x 2048 tokens, RTX 4090 24GB), as stacked bars, one per way
  to train it: full fine-tuning in fp32, in bf16 mixed precision, with gradient
  checkpointing, with 8-bit AdamW, in pure bf16; LoRA; QLoRA; and bf16 inference. Each
  bar is the step's peak, labelled with where the peak is; the card's memory is a line
  and the region past it is shaded. A bar is what nvidia-smi shows; its label, what the
  step needs (the allocator's OOM line plus the context), which decides the verdict.
* ``docs/img/memory_vs_batch.png`` (recipes page): device memory against batch size for
  the QLoRA recipe, ``torchfit plan llama-2-7b --gpu "RTX 4090" --train --dtype nf4
  --checkpointing --plot ...``, drawn by the same ``plot_plan`` the command uses.
* ``docs/img/accuracy_published.png`` (benchmarks page): torchfit's error on every figure
  of ``published_runs.toml`` it can express (``published.py``'s comparison), one row per
  publication, the tuning and held-out sets apart, with the +-10% band.

Every figure comes from torchfit's estimates (analytic, or a trace where the comparison
traces): deterministic for a given torchfit and matplotlib.
Run: python benchmarks/figures.py [--out docs/img] [--only NAME]
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
MODEL, CARD, BATCH, SEQ = "Qwen/Qwen2.5-1.5B", "RTX 4090", 1, 2048
CHECKPOINTING = {"gradient_checkpointing": True}
ADAPTERS = {"lora_rank": 16, "lora_targets": ["q_proj", "v_proj"]}
LORA = {"precision": "bf16-true", **ADAPTERS}

#: (label, estimate keyword arguments) for the breakdown bars, top to bottom.
KNOBS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("full fine-tune, fp32", {"dtype": "fp32"}),
    ("full, bf16 mixed precision", {"dtype": "bf16"}),
    ("full, bf16 mixed\n+ checkpointing", {"dtype": "bf16", **CHECKPOINTING}),
    (
        "full, bf16 mixed + checkp.\n+ 8-bit AdamW",
        {"dtype": "bf16", "optimizer": "adamw-8bit", **CHECKPOINTING},
    ),
    ("full, pure bf16\n+ checkpointing", {"precision": "bf16-true", **CHECKPOINTING}),
    ("LoRA r=16, bf16 base\n+ checkpointing", {**LORA, **CHECKPOINTING}),
    ("QLoRA r=16, nf4 base\n+ checkpointing", {"dtype": "nf4", **ADAPTERS, **CHECKPOINTING}),
    ("inference, bf16", {"dtype": "bf16", "mode": "inference", "optimizer": None}),
)

#: Stacked segments: (label, colour, bytes of an estimate taken to the device).
SEGMENTS = (
    ("weights", "#4c72b0", lambda e: e.weights),
    ("gradients", "#55a868", lambda e: e.gradients),
    ("optimizer state", "#c44e52", lambda e: e.optimizer),
    ("activations", "#dd8452", lambda e: e.activations),
    ("KV cache", "#8172b3", lambda e: e.kv_cache),
    ("workspace (transients, see caption)", "#937860", lambda e: e.workspace),
    ("autocast copies, rounding", "#da8bc3", lambda e: e.overhead),
    ("allocator slack", "#bbbbbb", lambda e: e.reserved - e.total),
    ("CUDA context", "#555555", lambda e: e.context),
)


def device_estimate(**kwargs: Any) -> MemoryEstimate:
    raw = estimate(MODEL, batch_size=BATCH, seq_len=SEQ, device="cuda", **kwargs)
    return to_device(raw, gpu=CARD)


def breakdown(path: Path) -> None:
    card = torchfit.gpu(CARD)
    limit = card.memory / GiB
    rows = [(label, device_estimate(**kwargs)) for label, kwargs in KNOBS]
    figure, axes = plt.subplots(figsize=(9, 6))
    positions = list(range(len(rows)))[::-1]
    left = [0.0] * len(rows)
    for name, colour, value in SEGMENTS:  # every category in the legend, zero or not
        widths = [value(e) / GiB for _, e in rows]
        axes.barh(positions, widths, left=left, color=colour, label=name, height=0.6)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    right = max(*left, limit) * 1.5  # room for the labels past the longest bar
    axes.axvspan(limit, right, color="#d62728", alpha=0.08, linewidth=0)
    axes.axvline(limit, color="#d62728", linestyle="--")
    axes.text(limit, len(rows) - 0.45, f" {card.name}: {limit:.0f} GiB", color="#d62728")
    for y, (_, e) in zip(positions, rows, strict=True):  # the total and where the peak is
        total = e.device_total / GiB
        fits = e.device_needed <= card.memory  # the verdict's rule: the OOM line decides
        verdict = "fits" if fits else "does not fit"
        axes.text(
            total + 0.4,
            y,
            f"needs {e.device_needed / GiB:.1f} GiB, {verdict}\npeak: {e.peak_at}",
            va="center",
            color="black" if fits else "#b22222",
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 1},
        )
    axes.set_yticks(positions, [label for label, _ in rows], fontsize=9)
    axes.set_xlabel("device memory (nvidia-smi), GiB; the label: what the step needs")
    axes.set_xlim(0, right)
    axes.set_ylim(-0.6, len(rows) - 0.1)
    axes.set_title(
        f"Qwen2.5-1.5B, batch {BATCH} x {SEQ} tokens, AdamW, on {card.name}:\n"
        "where the memory of one training step goes",
        fontsize=11,
    )
    axes.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.42, -0.1), ncols=3)
    figure.tight_layout()
    figure.savefig(path, dpi=120, metadata={"Software": None})
    plt.close(figure)


def memory_vs_batch(path: Path) -> None:
    plan = torchfit.fits(
        "llama-2-7b", "RTX 4090", mode="train", dtype="nf4", gradient_checkpointing=True
    )
    plot_plan("llama-2-7b", plan, str(path))


def accuracy_published(path: Path) -> None:
    import published  # noqa: PLC0415 - benchmarks/ is on the path when run as a script
    import published_data  # noqa: PLC0415

    data = published_data.load()
    cases = [(case, False) for case in data.cases] + [(case, True) for case in data.heldout]
    rows = [published.compare(case, heldout=heldout) for case, heldout in cases]
    rows = [r for r in rows if r.error is not None and not r.case.ambiguous]
    sources = sorted({published.source_of(r.case) for r in rows}, reverse=True)
    figure, axes = plt.subplots(figsize=(9, 0.45 * len(sources) + 1.8))
    axes.axvspan(-10, 10, color="#55a868", alpha=0.12, linewidth=0, label="within 10%")
    axes.axvline(0, color="#333333", linewidth=0.8)
    for heldout, marker, label in ((False, "o", "tuning set"), (True, "D", "held out")):
        chosen = [r for r in rows if r.heldout is heldout]
        axes.scatter(
            [100 * (r.error or 0.0) for r in chosen],
            [sources.index(published.source_of(r.case)) for r in chosen],
            marker=marker,
            facecolors="#4c72b0" if not heldout else "none",
            edgecolors="#4c72b0",
            alpha=0.8,
            label=f"{label} ({len(chosen)})",
            zorder=3,
        )
    axes.set_yticks(range(len(sources)), sources, fontsize=8)
    errors = [100 * (r.error or 0.0) for r in rows]
    reach = max(15.0, *(abs(e) + 2 for e in errors))
    axes.set_xlim(-reach, reach)
    axes.set_xlabel("torchfit's estimate against the published figure, % (under: left)")
    axes.set_title(
        f"GPU memory others measured and published: {len(rows)} figures, "
        f"{len(sources)} publications",
        fontsize=11,
    )
    axes.legend(fontsize=8, loc="lower right")
    axes.grid(axis="x", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120, metadata={"Software": None})
    plt.close(figure)


FIGURES = {
    "memory_breakdown": breakdown,
    "memory_vs_batch": memory_vs_batch,
    "accuracy_published": accuracy_published,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent.parent / "docs/img")
    parser.add_argument("--only", choices=sorted(FIGURES), help="draw this figure alone")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, draw in FIGURES.items():
        if args.only and name != args.only:
            continue
        path = args.out / f"{name}.png"
        draw(path)
        print(f"wrote {path} ({path.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
