"""torchfit.speed's step times beside real ones: this project's H200 runs.

Reads the step times `gpu_check.py` measured (``benchmarks/gpu_runs/h200-b.jsonl`` and
``h200-c.jsonl``: each record's recipe beside ``step_median_s``; ``h200-a-times.jsonl``
with the recipes of ``h200-a.jsonl``), predicts each case with `torchfit.speed.step_time`
for an H200, and prints predicted against real with the median and worst error. The constants of
`torchfit.speed` come from published measurements (docs/speed.md); these runs check
them, nothing here is fitted to them.

    python benchmarks/step_time.py
    python benchmarks/step_time.py --published   # the published-throughput set

``--published`` predicts every run of ``speed_published.json`` (published training
throughputs, each with its source URL and recipe) on its own card, or for a run over
several cards (``gpus``, ``strategy``) with `torchfit.fits(..., time=True)`.

Vision cases build torchvision's models; without torchvision they are listed as skipped.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import warnings
from pathlib import Path
from typing import Any

import transformers

import torchfit
from torchfit.speed import step_time

sys.path.insert(0, str(Path(__file__).parent))
from vision_import import load_torchvision

RUNS = Path(__file__).parent / "gpu_runs"
PUBLISHED = Path(__file__).parent / "speed_published.json"
GPU = "H200"
transformers.logging.set_verbosity_error()
warnings.filterwarnings("ignore")


def _config(rec: dict[str, Any]) -> Any:
    if rec.get("config"):
        return transformers.AutoConfig.for_model(**rec["config"])
    sys.path.insert(0, str(Path(__file__).parent))
    from gpu_check import CONFIGS  # noqa: PLC0415 - the harness's model table

    extra = {"gpt2-eager": ("GPT2Config", {"attn_implementation": "eager"})}
    cls, kwargs = {**CONFIGS, **extra}[rec["model"]]
    return getattr(transformers, cls)(**kwargs)


def _precision(rec: dict[str, Any]) -> str:
    if "precision" in rec and rec["precision"] in {
        "32-true",
        "bf16-true",
        "bf16-mixed",
        "16-mixed",
    }:
        return str(rec["precision"])
    if rec.get("autocast"):
        return {"bf16": "bf16-mixed", "fp16": "16-mixed"}[rec["autocast"]]
    return {"fp32": "32-true", "bf16": "bf16-true"}[rec.get("weights", "fp32")]


def step_kwargs(rec: dict[str, Any]) -> dict[str, Any]:
    """The recorded recipe in `step_time`'s words (the mapping `gpu_report.py` uses)."""
    kw: dict[str, Any] = {"batch_size": rec["batch"]}
    vision = rec.get("task") == "vision" or rec["model"].startswith("torchvision/")
    if vision:
        kw["input_shape"] = (3, 224, 224)
    else:
        kw["seq_len"] = rec["seq"]
    if rec["kind"] in {"forward", "generate"}:
        kw.update(mode="inference", dtype="bf16")
        if rec["kind"] == "generate":
            kw["max_new_tokens"] = rec["new_tokens"]
        return kw
    optimizer = rec.get("optimizer", "adamw")
    kw["optimizer"] = {"adamw-loop": "adamw-for-loop"}.get(optimizer, optimizer)
    kw["gradient_checkpointing"] = bool(rec.get("gradient_checkpointing"))
    if rec.get("qlora") or rec.get("prepare_model_for_kbit_training"):
        kw.update(dtype="nf4", precision="bf16-mixed", gradient_checkpointing=True)
        kw.update(lora_rank=16, lora_targets="all-linear", lora_dropout=0.05)
    elif rec.get("lora"):
        kw.update(lora_rank=16, lora_targets="all-linear", lora_dropout=0.05)
        kw.update(precision=_precision(rec), base_dtype=rec.get("weights", "fp32"))
    else:
        kw["precision"] = _precision(rec)
    if not vision and rec.get("attn") == "eager":
        kw["attn_implementation"] = "eager"
    return kw


def cases() -> list[dict[str, Any]]:
    """Every timed record of this project's H200 runs, with its real seconds.

    ``h200-a.jsonl`` also holds each step measured once more while the allocator recorded
    its history (``step2_s``: one synced step after a warm-up, the host slowed by the
    recording); it is kept as ``other_s`` beside the timed median, and a step only
    measured that way (GPT-2 with eager attention, QLoRA with double quantization) takes
    it as its real time.
    """
    found = []
    for run in ("h200-b.jsonl", "h200-c.jsonl"):
        for raw in map(json.loads, (RUNS / run).read_text().splitlines()):
            real = raw.get("step_median_s") or raw.get("generate_s")
            if real and raw.get("kind") in {"train", "forward", "generate"}:
                found.append({**raw, "real_s": real})
    recipes = {
        r["case"]: r for r in map(json.loads, (RUNS / "h200-a.jsonl").read_text().splitlines())
    }
    timed = {
        raw["case"]: raw
        for raw in map(json.loads, (RUNS / "h200-a-times.jsonl").read_text().splitlines())
        if "step_median_s" in raw
    }
    for name, recipe in recipes.items():
        other = recipe.get("step2_s") if recipe.get("kind") == "train" else None
        if name in timed:
            real = timed[name]["step_median_s"]
            found.append({**recipe, **timed[name], "real_s": real, "other_s": other})
        elif other:
            found.append({**recipe, "real_s": other, "note": "memory-history step only"})
    return found


def h200_table() -> list[float]:
    vision = load_torchvision()
    errors: list[float] = []
    print(
        "| case | real s | predicted s | error | other run s | error there |\n"
        "|---|---|---|---|---|---|"
    )
    for rec in cases():
        name = rec["case"] + (f" ({rec['note']})" if rec.get("note") else "")
        if rec["model"].startswith("torchvision/") and not vision:
            print(f"| {name} | {rec['real_s']:.4f} | skipped: no torchvision | | | |")
            continue
        model = rec["model"] if rec["model"].startswith("torchvision/") else _config(rec)
        predicted = step_time(model, GPU, **step_kwargs(rec)).seconds
        error = predicted / rec["real_s"] - 1
        if rec["kind"] != "generate":
            errors.append(error)
        other = rec.get("other_s")
        there = f"{rec['other_s']:.4f} | {predicted / other - 1:+.1%}" if other else " | "
        print(f"| {name} | {rec['real_s']:.4f} | {predicted:.4f} | {error:+.1%} | {there} |")
    if errors:
        worst = max(errors, key=abs)
        print(
            f"\n{len(errors)} steps (generate listed, not counted: its host loop is not "
            f"modelled): median |error| {statistics.median(abs(e) for e in errors):.1%}, "
            f"worst {worst:+.1%}"
        )
    profiled(cases())
    return errors


def profiled(records: list[dict[str, Any]], top: int = 5) -> None:
    """For each step the harness profiled: how long the GPU was busy, its heaviest kernels."""
    found = [rec for rec in records if rec.get("profile")]
    if not found:
        return
    print("\n| case | timed s | GPU busy s | busy share | heaviest kernels (ms, count) |")
    print("|---|---|---|---|---|")
    for rec in found:
        prof = rec["profile"]
        heaviest = "; ".join(
            f"{k['name'][:60]} {k['us'] / 1e3:.2f} x{k['count']}" for k in prof["top"][:top]
        )
        share = prof["gpu_busy_s"] / rec["real_s"]
        print(
            f"| {rec['case']} | {rec['real_s']:.4f} | {prof['gpu_busy_s']:.4f} | {share:.0%} "
            f"| {heaviest} |"
        )


def published_kwargs(run: dict[str, Any]) -> dict[str, Any]:
    """A published run's recipe in `step_time`'s words."""
    kw: dict[str, Any] = {"batch_size": run["batch"], "precision": run["precision"]}
    if "input_shape" in run:
        kw["input_shape"] = tuple(run["input_shape"])
    else:
        kw["seq_len"] = run["seq"]
    optimizer = run.get("optimizer", "adamw")
    implementation = run.get("optimizer_implementation", "foreach")  # foreach: the name alone
    kw["optimizer"] = {"fused": f"{optimizer}-fused", "loop": f"{optimizer}-for-loop"}.get(
        implementation, optimizer
    )
    kw["gradient_checkpointing"] = bool(run.get("gradient_checkpointing"))
    if run.get("channels_last"):
        kw["channels_last"] = True
    if run.get("lora"):
        kw.update(lora_rank=run["lora"]["rank"], lora_targets=run["lora"]["targets"])
    return kw


def _predicted_seconds(model: Any, run: dict[str, Any]) -> float:
    """One step of ``run`` on its card, or over its ``gpus`` cards with their collectives."""
    if "gpus" not in run:
        return step_time(model, run["card"], **published_kwargs(run)).seconds
    plan = torchfit.fits(
        model,
        [run["card"]] * run["gpus"],
        strategy=run["strategy"],
        param_dtype=run.get("param_dtype"),
        time=True,
        **published_kwargs(run),
    )
    return plan.time.seconds


def published_table() -> list[float]:
    """Predict each published run on its card; print the error of each and the median."""
    data = json.loads(PUBLISHED.read_text())
    vision = load_torchvision()
    errors: list[float] = []
    print("| run | card | published s | predicted s | error | source |\n|---|---|---|---|---|---|")
    for run in data["runs"]:
        url = data["sources"][run["source"]]["url"]
        if run.get("model", "").startswith("torchvision/") and not vision:
            print(f"| {run['id']} | {run['card']} | {run['step_s']:.4f} | skipped | | {url} |")
            continue
        model = (
            transformers.AutoConfig.for_model(**run["config"]) if "config" in run else run["model"]
        )
        predicted = _predicted_seconds(model, run)
        error = predicted / run["step_s"] - 1
        errors.append(error)
        print(
            f"| {run['id']} | {run['card']} | {run['step_s']:.4f} | {predicted:.4f} "
            f"| {error:+.1%} | {url} |"
        )
    if errors:
        print(
            f"\n{len(errors)} runs from {len(data['sources'])} sources: median |error| "
            f"{statistics.median(abs(e) for e in errors):.1%}, "
            f"worst {max(errors, key=abs):+.1%}"
        )
    return errors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--published", action="store_true", help="the published-throughput set")
    if parser.parse_args().published:
        published_table()
    else:
        h200_table()
    return 0


if __name__ == "__main__":
    sys.exit(main())
