"""torchfit against real GPU runs that others measured and published.

Every case of ``benchmarks/published_cases.py`` (a figure or a fits / OOM verdict, with
its citation and setup) is turned into the torchfit call that describes the same run,
and the matching quantity is compared: nvidia-smi with ``device_total``,
``max_memory_allocated`` and ``active_bytes.all.peak`` with ``total``,
``max_memory_reserved`` with ``reserved``; a verdict with whether ``device_total`` fits
the card. A setup torchfit cannot express yet is listed with the reason, never
approximated silently. Ambiguous cases and the held-out set are reported apart.

Run: python benchmarks/published.py            (markdown tables, about a minute)
     python benchmarks/published.py --heldout  (the held-out set only)
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import published_cases as published

from torchfit.memory import describe, estimate, gpu, model_config, to_device
from torchfit.memory.result import MemoryEstimate

#: Cards the sources name, as torchfit's catalog knows them.
CARDS = {
    "Tesla V100-SXM2 16GB": "V100 16GB",
    "NVIDIA A100-SXM4-40GB": "A100 40GB",
    "A100 40GB": "A100 40GB",
    "NVIDIA A10G 24GB (1xA10G)": "A10G",
    "A100 (memory size not stated)": "A100 80GB",
}
#: Allocator statistics barely depend on the card; where none is named, this one is used.
DEFAULT_CARD = "A100 80GB"

#: Hub ids of the sources -> torchfit catalog names.
MODELS = {
    "google-bert/bert-large-uncased": "bert-large",
    "meta-llama/Llama-2-7b-hf": "llama-2-7b",
    "meta-llama/Llama-2-13b-hf": "llama-2-13b",
    "meta-llama/Llama-2-70b-hf": "llama-2-70b",
}

#: Precision as the sources write it -> estimate() keywords.
PRECISIONS: dict[str, dict[str, Any]] = {
    "fp32": {"dtype": "fp32"},
    "fp16-mixed": {"dtype": "fp16", "mixed_precision": True},
    "bf16-mixed": {"dtype": "bf16", "mixed_precision": True},
    "bf16-true": {"dtype": "bf16", "mixed_precision": False},
    "bf16": {"dtype": "bf16", "mixed_precision": False},
    "bf16-true + bnb.nf4 base": {"dtype": "nf4", "mixed_precision": False},
    "bf16-true + bnb.nf4-dq base": {"dtype": "nf4", "mixed_precision": False},
}

OPTIMIZERS = {
    "adamw": "adamw",
    "adam": "adam",
    "sgd": "sgd",
    "adam-8bit": "adamw-8bit",
    "adamw-8bit": "adamw-8bit",
    "adafactor": "adafactor",
    "paged_adamw_32bit": "paged-adamw",
    "paged_adamw_8bit": "paged-adamw-8bit",
}

#: How each framework's training loop runs, read from its source at the cited version:
#: (zero_grad's set_to_none, whether the output is referenced through backward).
#: - The 2022 Hugging Face Trainer zeroes with ``model.zero_grad()``, PyTorch 1.x's
#:   default set_to_none=False, and computes the loss in ``compute_loss`` (outputs dropped).
#: - Lit-GPT's finetune/lora.py keeps ``logits`` in scope across ``fabric.backward``.
#: - torchtune's recipes ``del logits`` before backward.
#: - A plain PyTorch / Fabric loop keeps ``outputs`` in scope (rasbt/pytorch-memory-optim).
LOOPS: dict[str, dict[str, bool]] = {
    "transformers Trainer": {"set_to_none": False, "keep_output": False},
    "Lit-GPT": {"set_to_none": True, "keep_output": True},
    "litgpt": {"set_to_none": True, "keep_output": True},
    "torchtune": {"set_to_none": True, "keep_output": False},
    "plain PyTorch": {"set_to_none": True, "keep_output": True},
    "Lightning Fabric": {"set_to_none": True, "keep_output": True},
}

#: Which torchfit figure a published quantity is compared with.
QUANTITY = {
    "nvidia-smi": "device_total",
    "max_memory_allocated": "total",
    "active_bytes.all.peak": "total",
    "max_memory_reserved": "reserved",
}


class NotExpressible(Exception):  # noqa: N818 - a reason, not a failure
    """The case's setup has something torchfit cannot model yet."""


@dataclasses.dataclass(frozen=True)
class Row:
    """One case compared (or the reason it could not be)."""

    case: published.Case
    heldout: bool
    predicted: int | None = None
    verdict: str | None = None
    reason: str = ""

    @property
    def error(self) -> float | None:
        """(torchfit - published) / published."""
        if self.predicted is None or self.case.value_bytes is None:
            return None
        return (self.predicted - self.case.value_bytes) / self.case.value_bytes


def _lora_params(case: published.Case, model: str) -> int:
    """Adapter parameters of ``r=..`` on the named projections (q/k/v/o, MLP)."""
    text = case.lora or ""
    rank = re.search(r"r=(\d+)", text)
    if rank is None:
        raise NotExpressible(f"LoRA rank not readable from {text!r}")
    r = int(rank.group(1))
    spec = describe(model_config(model))
    h, kv = spec.hidden, spec.num_kv_heads * spec.head_dim
    shapes = {"query": (h, h), "key": (h, kv), "value": (h, kv), "projection": (h, h)}
    wanted = [name for name in shapes if name in text]
    if "mlp" in text or "head" in text:
        raise NotExpressible("LoRA on the MLP or head: needs lora_targets (issue 14.6)")
    if not wanted:
        raise NotExpressible(f"LoRA targets not readable from {text!r}")
    per_layer = sum(r * (shapes[name][0] + shapes[name][1]) for name in wanted)
    return spec.num_layers * per_layer


def setting(case: published.Case) -> tuple[str, dict[str, Any]]:
    """The catalog model and `estimate` keywords for ``case``; NotExpressible if none."""
    model = MODELS.get(case.model)
    if model is None:
        raise NotExpressible(f"model {case.model!r} is not in torchfit's catalog")
    if case.precision not in PRECISIONS:
        raise NotExpressible(f"precision {case.precision!r}")
    kwargs: dict[str, Any] = dict(PRECISIONS[case.precision])
    kwargs["batch_size"] = case.batch_size or 1
    if case.seq_len is None:
        raise NotExpressible("sequence length not given")
    kwargs["seq_len"] = case.seq_len
    if case.mode == "inference":
        kwargs["mode"] = "inference"
        kwargs.pop("mixed_precision", None)
        return model, kwargs
    kwargs["gradient_accumulation_steps"] = case.gradient_accumulation_steps or 1
    if case.optimizer not in OPTIMIZERS:
        raise NotExpressible(f"optimizer {case.optimizer!r}")
    kwargs["optimizer"] = OPTIMIZERS[case.optimizer]
    loop = next((v for k, v in LOOPS.items() if (case.framework or "").startswith(k)), None)
    if loop is None:
        raise NotExpressible(f"the training loop of {case.framework!r} is not known")
    kwargs.update(loop)
    tricks = set(case.other_tricks) - {"packed sequences"}
    if tricks:
        raise NotExpressible(f"not modelled: {', '.join(sorted(tricks))}")
    kwargs["gradient_checkpointing"] = bool(case.gradient_checkpointing)
    if case.attention is not None:
        kwargs["attn_implementation"] = case.attention
    if case.method in {"lora", "qlora"}:
        kwargs["trainable_params"] = _lora_params(case, model)
    return model, kwargs


def compare(case: published.Case, *, heldout: bool) -> Row:
    """Estimate ``case`` and read the figure its source measured."""
    try:
        model, kwargs = setting(case)
    except NotExpressible as reason:
        return Row(case, heldout, reason=str(reason))
    card = gpu(CARDS.get(case.gpu or "", DEFAULT_CARD))
    version = re.search(r"CUDA (\d+\.\d+)", case.cuda_torch or "")
    cuda = None if version is None else version.group(1)
    device: MemoryEstimate = to_device(estimate(model, **kwargs), gpu=card, cuda_version=cuda)
    if case.measured in {"fits", "oom"}:
        fits = device.device_total <= card.memory
        return Row(case, heldout, device.device_total, "fits" if fits else "oom")
    quantity = QUANTITY.get(case.measured)
    if quantity is None:
        return Row(case, heldout, reason=f"quantity {case.measured!r} has no torchfit twin")
    return Row(case, heldout, int(getattr(device, quantity)))


def _gib(nbytes: int | None) -> str:
    return "" if nbytes is None else f"{nbytes / 2**30:.2f}"


def _table(rows: list[Row]) -> list[str]:
    lines = [
        "| case | measured | published GiB | torchfit GiB | error |",
        "|---|---|---:|---:|---:|",
    ]
    for row in rows:
        error = "" if row.error is None else f"{row.error:+.1%}"
        lines.append(
            f"| {row.case.key} | {row.case.measured} | {_gib(row.case.value_bytes)} "
            f"| {_gib(row.predicted)} | {error} |"
        )
    return lines


def _summary(rows: list[Row]) -> list[str]:
    errors = [row.error for row in rows if row.error is not None]
    verdicts = [row for row in rows if row.verdict is not None]
    agree = sum(row.verdict == row.case.measured for row in verdicts)
    lines = [f"- compared: {len(errors)} figures, {len(verdicts)} verdicts"]
    if errors:
        lines.append(
            f"- median |error| {statistics.median(abs(e) for e in errors):.1%}; "
            f"signed from {min(errors):+.1%} to {max(errors):+.1%}; "
            f"under by more than 10%: {sum(e < -0.10 for e in errors)}"
        )
    if verdicts:
        lines.append(f"- verdicts agreeing with what happened: {agree} of {len(verdicts)}")
    return lines


def report(rows: list[Row]) -> str:
    """Markdown: per source, overall, and what could not be expressed."""
    done = [row for row in rows if not row.reason]
    lines = ["## Fully specified cases", "", *_summary(done), ""]
    by_source: dict[str, list[Row]] = {}
    for row in done:
        by_source.setdefault(row.case.source.split(" ")[0], []).append(row)
    for source, group in sorted(by_source.items()):
        lines += [f"### {source}", "", *_summary(group), "", *_table(group), ""]
    verdicts = [row for row in done if row.verdict is not None]
    if verdicts:
        lines += [
            "### Verdicts",
            "",
            "| case | card | happened | torchfit says |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {row.case.key} | {row.case.gpu} | {row.case.measured} | {row.verdict} "
            f"({_gib(row.predicted)} GiB) |"
            for row in verdicts
        ]
        lines.append("")
    skipped = [row for row in rows if row.reason]
    lines += ["## Not expressible yet", "", "| case | why |", "|---|---|"]
    lines += [f"| {row.case.key} | {row.reason} |" for row in skipped]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Print the comparison as markdown."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heldout", action="store_true", help="only the held-out cases")
    args = parser.parse_args(argv)
    cases = [(case, True) for case in published.HELDOUT]
    if not args.heldout:
        cases = [(case, False) for case in published.CASES if not case.ambiguous] + cases
    rows = [compare(case, heldout=heldout) for case, heldout in cases]
    print(report(rows))


if __name__ == "__main__":
    main()
