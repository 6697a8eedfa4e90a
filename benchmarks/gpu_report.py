"""torchfit's predictions beside real GPU runs: allocated, reserved, device total, batch.

Reads the records `gpu_check.py` wrote on a GPU (``benchmarks/gpu_runs/*.jsonl``) and,
on any machine, predicts each case with torchfit: the analytic estimate through
`to_device` for that card and CUDA version, and the CUDA-target trace of the same step on
meta tensors. Prints one Markdown table per run (errors are predicted / real - 1) and,
for the capped-card cases, the largest batch `max_batch_size` picks against the true one.

    python benchmarks/gpu_report.py                       # every run in benchmarks/gpu_runs
    python benchmarks/gpu_report.py benchmarks/gpu_runs/h200-b.jsonl --no-trace
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import transformers

sys.path.insert(0, str(Path(__file__).parent))
from gpu_check import CONFIGS
from vision_import import load_torchvision

from torchfit.memory import estimate, max_batch_size, to_device, trace

RUNS = Path(__file__).parent / "gpu_runs"
GPU = "H200"
transformers.logging.set_verbosity_error()
warnings.filterwarnings("ignore")
load_torchvision()  # before transformers probes it (the vision cases build its models)

# The first H200 run (h200-a) named its models and precisions its own way.
_A_CONFIGS = {"gpt2-eager": ("GPT2Config", {"attn_implementation": "eager"})}
_A_PRECISION = {
    "32-true": ("fp32", None),
    "bf16-true": ("bf16", None),
    "bf16-mixed": ("fp32", "bf16"),
    "16-mixed": ("fp32", "fp16"),
}


def normalise(rec: dict[str, Any]) -> dict[str, Any]:
    """A record of either harness in `gpu_check.Case`'s fields."""
    if "weights" in rec or rec.get("kind") not in {"train", "inference"}:
        return rec
    out = dict(rec)
    out["model"] = rec["model"]
    if rec.get("kind") == "inference":
        out["kind"] = "generate" if rec.get("call") == "generate" else "forward"
        out["new_tokens"] = rec.get("max_new_tokens", 0)
        return out
    if rec.get("prepare_model_for_kbit_training"):
        out.update(weights="fp32", autocast="bf16", qlora=True)
        out["lora"] = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.05}
        out["lora"]["target_modules"] = "all-linear"
        return out
    if rec.get("model", "").startswith("torchvision/"):
        out["task"] = "vision"
    out["weights"], out["autocast"] = _A_PRECISION[rec["precision"]]
    return out


def config_of(rec: dict[str, Any]) -> Any:
    if rec.get("config"):
        return transformers.AutoConfig.for_model(**rec["config"])
    cls, kwargs = {**CONFIGS, **_A_CONFIGS}[rec["model"]]
    return getattr(transformers, cls)(**kwargs)


def lora_config(rec: dict[str, Any]) -> Any:
    import peft  # noqa: PLC0415

    return peft.LoraConfig(task_type="CAUSAL_LM", **rec["lora"])


def precision_of(rec: dict[str, Any]) -> str:
    weights, auto = rec.get("weights", "fp32"), rec.get("autocast")
    if auto:
        return {"bf16": "bf16-mixed", "fp16": "16-mixed"}[auto]
    return {"fp32": "32-true", "bf16": "bf16-true"}[weights]


def estimate_kwargs(rec: dict[str, Any], batch: int) -> dict[str, Any]:
    """The case in `estimate`'s words (every gpu_check.py recipe has them)."""
    kw: dict[str, Any] = {"batch_size": batch, "device": "cuda"}
    if rec.get("task") == "vision":
        kw["input_shape"] = (3, 224, 224)
    else:
        kw["seq_len"] = rec["seq"]
    if rec["kind"] in {"forward", "generate"}:
        kw.update(mode="inference", dtype="bf16")
        if rec["kind"] == "generate":
            kw["max_new_tokens"] = rec["new_tokens"]
        return kw
    # gpu_check's "adamw-loop" is torch.optim.AdamW(foreach=False): torchfit's "adamw-for-loop"
    kw["optimizer"] = {"adamw-loop": "adamw-for-loop"}.get(
        rec.get("optimizer", "adamw"), rec.get("optimizer", "adamw")
    )
    kw["gradient_checkpointing"] = bool(rec.get("gradient_checkpointing"))
    if rec.get("qlora"):
        kw.update(dtype="nf4", lora=lora_config(rec), gradient_checkpointing=True)
    elif rec.get("lora"):
        kw.update(lora=lora_config(rec), base_dtype=rec["weights"], precision=precision_of(rec))
    else:
        kw["precision"] = precision_of(rec)
    if rec.get("task") != "vision" and config_of(rec)._attn_implementation == "eager":  # noqa: SLF001
        kw["attn_implementation"] = "eager"
    return kw


def model_ref(rec: dict[str, Any]) -> Any:
    return rec["model"] if rec["model"].startswith("torchvision/") else config_of(rec)


def analytic(rec: dict[str, Any], context: int, batch: int | None = None) -> Any:
    found = estimate(model_ref(rec), **estimate_kwargs(rec, batch or rec["batch"]))
    return to_device(found, gpu=GPU, context_bytes=context)


@contextlib.contextmanager
def _meta() -> Iterator[None]:
    with torch.device("meta"):
        yield


def traced(rec: dict[str, Any]) -> Any:
    """The CUDA-target trace of the step on meta tensors (plain steps only)."""
    if rec.get("lora") or rec.get("qlora") or rec["kind"] != "train":
        return None
    if rec.get("task") == "vision":
        return _traced_vision(rec)
    config = config_of(rec)
    cls = {"mlm": transformers.AutoModelForMaskedLM}.get(
        rec.get("task", ""), transformers.AutoModelForCausalLM
    )
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[rec.get("weights", "fp32")]
    with _meta():
        model = cls.from_config(config, dtype=dtype)
        ids = torch.zeros(rec["batch"], rec["seq"], dtype=torch.long)
    model.config.use_cache = False
    if rec.get("gradient_checkpointing"):
        model.gradient_checkpointing_enable()
    model.train()
    return trace(
        model,
        {"input_ids": ids, "labels": ids},
        optimizer=estimate_kwargs(rec, rec["batch"])["optimizer"],
        precision=precision_of(rec),
        device="cuda",
        gpu=GPU,
    )


class _WithLoss(torch.nn.Module):
    """``F.cross_entropy(model(x), y)``: the loss `gpu_check.py`'s vision step computes."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(self.inner(x), y)


def _traced_vision(rec: dict[str, Any]) -> Any:
    """The torchvision model's step with its labels and cross-entropy, traced for CUDA."""
    import torchvision  # noqa: PLC0415

    with _meta():
        model = getattr(torchvision.models, rec["model"].split("/", 1)[1])()
        images = torch.zeros(rec["batch"], 3, 224, 224)
        labels = torch.zeros(rec["batch"], dtype=torch.long)
    return trace(
        _WithLoss(model),
        (images, labels),
        optimizer=estimate_kwargs(rec, rec["batch"])["optimizer"],
        precision=precision_of(rec),
        device="cuda",
        gpu=GPU,
    )


def _err(predicted: float | None, real: float) -> str:
    if predicted is None:
        return "-"
    return f"{predicted / real - 1:+.1%}"


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f}"


def context_of(env: dict[str, Any], rec: dict[str, Any]) -> int:
    """The measured context the step ran with (a CNN has loaded cuDNN too)."""
    if rec.get("task") == "vision" and "context_after_conv" in env:
        return int(env["context_after_conv"])
    return int(env.get("context_after_fp32_matmul", env.get("context_after_first_matmul", 0)))


def report(path: Path, *, with_trace: bool) -> tuple[str, list[float], list[float]]:
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    env = records[0]
    rows = [
        f"### {path.stem}: {env.get('gpu')}, torch {env['torch']}, CUDA {env['cuda']}",
        "",
        (
            "| case | allocated | analytic | trace | reserved | analytic | trace | "
            "device | analytic |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    alloc_errs: list[float] = []
    res_errs: list[float] = []
    capped = []
    for raw in records[1:]:
        if "error" in raw or "skipped" in raw or raw.get("case") in {"DONE", "ENV_EAGER"}:
            continue
        rec = normalise(raw)
        if rec.get("kind") == "load":
            continue
        if rec.get("kind") == "capped":
            capped.append(rec)
            continue
        real = rec["step2"] if "step2" in rec else rec["after"]
        alloc, reserved = real["peak_alloc"], real["peak_reserved"]
        context = context_of(env, rec)
        try:
            a = analytic(rec, context)
        except Exception as e:  # noqa: BLE001 - a case torchfit cannot say is a finding
            rows.append(f"| {rec['case']} | {_gib(alloc)} | {type(e).__name__}: {e!s:.80} |")
            continue
        t = None
        if with_trace:
            with contextlib.suppress(Exception):
                t = traced(rec)
        alloc_errs.append(a.total / alloc - 1)
        res_errs.append(a.reserved / reserved - 1)
        rows.append(
            f"| {rec['case']} | {_gib(alloc)} | {_err(a.total, alloc)} | "
            f"{_err(t and t.total, alloc)} | {_gib(reserved)} | {_err(a.reserved, reserved)} | "
            f"{_err(t and t.reserved, reserved)} | {_gib(reserved + context)} | "
            f"{_err(a.device_total, reserved + context)} |"
        )
    if alloc_errs:
        rows += ["", summary(alloc_errs, res_errs)]
    if capped:
        rows += capped_rows(env, capped)
    context_rows = [
        f"| {k.removeprefix('context_').replace('_', ' ')} | {v / 2**20:.1f} MiB |"
        for k, v in env.items()
        if k.startswith("context_") and isinstance(v, int)
    ]
    if context_rows:
        rows += ["", "| CUDA context, measured | |", "|---|---|", *context_rows]
    return "\n".join(rows) + "\n", alloc_errs, res_errs


def summary(alloc_errs: list[float], res_errs: list[float]) -> str:
    def med(errs: list[float]) -> str:
        return f"{statistics.median(abs(e) for e in errs):.1%}"

    def worst(errs: list[float]) -> str:
        return f"{max(errs, key=abs):+.1%}"

    return (
        f"Analytic: allocated median |error| {med(alloc_errs)}, worst {worst(alloc_errs)}; "
        f"reserved median {med(res_errs)}, worst {worst(res_errs)}."
    )


def capped_rows(env: dict[str, Any], capped: list[dict[str, Any]]) -> list[str]:
    """The largest batch `max_batch_size` picks under each cap, against the true one."""
    rows = ["", "| capped card | cap GiB | true largest batch | max_batch_size | share |"]
    rows.append("|---|---|---|---|---|")
    for rec in capped:
        context = context_of(env, rec)
        try:
            pick = max_batch_size(
                lambda b, rec=rec, context=context: analytic(rec, context, b), rec["cap_bytes"]
            )
        except Exception as e:  # noqa: BLE001 - a case torchfit cannot say is a finding
            rows.append(f"| {rec['case']} | {type(e).__name__}: {e!s:.80} |")
            continue
        rows.append(
            f"| {rec['case']} | {_gib(rec['cap_bytes'])} | {rec['largest_batch']} | {pick} | "
            f"{pick / rec['largest_batch']:.0%} |"
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("runs", nargs="*", type=Path)
    parser.add_argument("--no-trace", action="store_true")
    args = parser.parse_args()
    paths = args.runs or sorted(p for p in RUNS.glob("*.jsonl") if not p.stem.endswith("times"))
    for path in paths:
        text, _, _ = report(path, with_trace=not args.no_trace)
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
