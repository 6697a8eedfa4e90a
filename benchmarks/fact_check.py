"""Fact check: hardware rules of thumb people repeat, each re-estimated with torchfit.

For every claim: the setting it is read as, torchfit's estimate of that setting on the
card (the same numbers ``torchfit plan`` / ``torchfit.fits`` print: the analytic
estimate taken to the device with the allocator model and the CUDA context), the
largest batch that fits, and each knob that could flip the verdict, re-estimated with
the same estimator. Every verdict, headroom and largest batch decides on
``MemoryEstimate.device_needed`` (the allocator's OOM line plus the CUDA context), the
rule ``torchfit.fits`` applies; the device total (what nvidia-smi shows) is printed
beside it. Transformers go through the closed forms, CNNs through their step traced
on fake tensors under CUDA's rules (what `estimate` does on CUDA for a model without a
closed form); nothing is allocated, no GPU is needed, and the output is deterministic.
``docs/fact-check.md`` is these tables plus the verdicts in words.

Run: python benchmarks/fact_check.py  (prints markdown; about 5 minutes on 2 cores, most of it
EfficientNet-B7's traced steps)
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from typing import Any

from torchfit import quantize
from torchfit._core.units import format_bytes
from torchfit.memory import GPU, estimate, to_device
from torchfit.memory.catalog import model_entry
from torchfit.memory.plan import resolve_budget
from torchfit.memory.result import MemoryEstimate

GiB = 2**30


def gpu(name: str) -> GPU:
    """A catalog card, or a custom one from a size ("4GB"), as `fits` resolves it."""
    return resolve_budget(name)[0]


def budget(name: str) -> int:
    """The bytes `fits` compares with: the card's total as nvidia-smi shows it."""
    return gpu(name).total


def fits_on(e: MemoryEstimate, card: str) -> bool:
    """`fits`' rule: the device need (OOM line + context) is within the card."""
    return e.device_needed <= budget(card)


@dataclasses.dataclass(frozen=True)
class Claim:
    """A rule of thumb, the setting it is read as, and the knobs to turn."""

    key: str
    text: str
    model: str
    card: str
    setting: dict[str, Any]
    command: str
    knobs: tuple[tuple[str, dict[str, Any]], ...]


CLAIMS = (
    Claim(
        key="gpt3",
        text="An A100 40GB runs GPT-3 175B with 8-bit quantization",
        model="gpt3-175b",
        card="A100 40GB",
        setting={"mode": "inference", "dtype": "int8", "seq_len": 2048, "batch_size": 1},
        command='torchfit plan gpt3-175b --gpu "A100 40GB" --inference --dtype int8 --seq 2048',
        knobs=(
            ("context 256 tokens (smaller KV cache)", {"seq_len": 256}),
            ("NF4 (4-bit) weights", {"dtype": "nf4"}),
            ("int8 on an A100 80GB", {"card": "A100 80GB"}),
            ("int8 on an H200 (141 GiB)", {"card": "H200"}),
            ("NF4 on an A100 80GB", {"card": "A100 80GB", "dtype": "nf4"}),
            ("NF4 on an H200", {"card": "H200", "dtype": "nf4"}),
            ("int8 on an MI300X (192 GiB)", {"card": "MI300X"}),
        ),
    ),
    Claim(
        key="gpt2",
        text="GPT-2 small at 512 tokens needs about 4 GB",
        model="gpt2",
        card="4GB",
        setting={"mode": "train", "dtype": "fp32", "seq_len": 512, "batch_size": 2},
        command="torchfit plan gpt2 --gpu 4GB --train --dtype fp32 --seq 512 --batch 2",
        knobs=(
            ("batch 1", {"batch_size": 1}),
            ("batch 8", {"batch_size": 8}),
            ("fp16 mixed precision, batch 4", {"dtype": "fp16", "batch_size": 4}),
            ("fp16 mixed precision, batch 8", {"dtype": "fp16", "batch_size": 8}),
            (
                "batch 8 + gradient checkpointing",
                {"batch_size": 8, "gradient_checkpointing": True},
            ),
            ("8-bit AdamW", {"optimizer": "adamw-8bit"}),
            ("plain SGD", {"optimizer": "sgd"}),
            ("seq 1024", {"seq_len": 1024}),
            ("inference (fp32), batch 1", {"mode": "inference", "batch_size": 1}),
        ),
    ),
    Claim(
        key="resnet50",
        text="A GTX 1060 6GB trains ResNet-50",
        model="resnet-50",
        card="GTX 1060",
        setting={"mode": "train", "dtype": "fp32", "input_shape": (3, 224, 224), "batch_size": 32},
        command='torchfit plan resnet-50 --gpu "GTX 1060" --train --dtype fp32 --batch 32',
        knobs=(
            ("batch 64", {"batch_size": 64}),
            ("batch 256 (the ImageNet recipe)", {"batch_size": 256}),
            ("fp16 mixed precision, batch 64", {"dtype": "fp16", "batch_size": 64}),
            ("SGD with momentum", {"optimizer": "sgd-momentum"}),
            ("8-bit AdamW", {"optimizer": "adamw-8bit"}),
            ("320 x 320 images", {"input_shape": (3, 320, 320)}),
        ),
    ),
    Claim(
        key="effnet-b7",
        text="An RTX 3060 12GB handles EfficientNet-B7",
        model="efficientnet-b7",
        card="RTX 3060",
        setting={"mode": "train", "dtype": "bf16", "input_shape": (3, 600, 600), "batch_size": 8},
        command=(
            'torchfit plan efficientnet-b7 --gpu "RTX 3060" --train --dtype bf16 --batch 8 '
            "--input-shape 3,600,600"
        ),
        knobs=(
            ("batch 4", {"batch_size": 4}),
            ("fp32, batch 4", {"dtype": "fp32", "batch_size": 4}),
            ("SGD with momentum", {"optimizer": "sgd-momentum"}),
            ("380 x 380 images", {"input_shape": (3, 380, 380)}),
            ("224 x 224 images", {"input_shape": (3, 224, 224)}),
            ("inference (bf16)", {"mode": "inference"}),
        ),
    ),
)


class Evaluator:
    """Device-level estimates (as `fits` makes them), cached per setting."""

    def __init__(self) -> None:
        self.cache: dict[tuple[Any, ...], MemoryEstimate] = {}

    def device(self, model: str, card: str, setting: dict[str, Any]) -> MemoryEstimate:
        kwargs = dict(setting)
        if kwargs.get("mode") == "inference":
            kwargs["optimizer"] = None
        key = (model, card, tuple(sorted(kwargs.items())))
        if key not in self.cache:
            self.cache[key] = to_device(estimate(model, device="cuda", **kwargs), gpu=gpu(card))
        return self.cache[key]

    def fits(self, model: str, card: str, setting: dict[str, Any]) -> bool:
        return fits_on(self.device(model, card, setting), card)

    def largest_batch(self, model: str, card: str, setting: dict[str, Any]) -> int:
        """Largest batch whose device need fits (`fits`' rule), from a line then checked."""

        def ok(batch: int) -> bool:
            return self.fits(model, card, {**setting, "batch_size": batch})

        if not ok(1):
            return 0
        one = self.device(model, card, {**setting, "batch_size": 1}).device_needed
        two = self.device(model, card, {**setting, "batch_size": 2}).device_needed
        slope = two - one
        guess = 1 + (budget(card) - one) // slope if slope > 0 else 2
        good, bad = 1, max(int(guess), 2)
        if ok(bad):
            good, bad = bad, bad + 1
            while ok(bad):
                good, bad = bad, 2 * bad
        while bad - good > 1:
            mid = (good + bad) // 2
            good, bad = (mid, bad) if ok(mid) else (good, mid)
        return good


#: The figure every verdict decides on (`MemoryEstimate.device_needed`).
NEEDS = "needs on the card (OOM line + context)"


def gib(n: int) -> str:
    return f"{n / GiB:.2f}"


def setting_text(setting: dict[str, Any]) -> str:
    parts = [setting["mode"], setting["dtype"], f"batch {setting['batch_size']}"]
    if "seq_len" in setting:
        parts.append(f"seq {setting['seq_len']}")
    if "input_shape" in setting:
        parts.append("x".join(map(str, setting["input_shape"][1:])))
    if setting["mode"] == "train":
        parts.append(setting.get("optimizer", "adamw"))
    if setting.get("gradient_checkpointing"):
        parts.append("checkpointing")
    return ", ".join(parts)


def breakdown(claim: Claim, e: MemoryEstimate, card_bytes: int, largest: int) -> list[str]:
    rows = [
        ("weights", e.weights),
        ("gradients", e.gradients),
        ("optimizer state", e.optimizer),
        ("activations", e.activations),
        ("KV cache", e.kv_cache),
        ("workspace", e.workspace),
        ("allocated peak", e.total),
        ("reserved (allocator)", e.reserved or 0),
        ("CUDA context", e.context),
        ("device total (nvidia-smi)", e.device_total),
        (NEEDS, e.device_needed),
        ("card", card_bytes),
        ("headroom (card - needs)", card_bytes - e.device_needed),
    ]
    lines = [
        f"`{claim.command}`",
        "",
        f"Setting checked: {setting_text(claim.setting)} on {gpu(claim.card).name}.",
        "",
        "| | GiB |",
        "|---|---:|",
    ]
    lines += [f"| {label} | {gib(value)} |" for label, value in rows if value or label == "card"]
    lines.append(f"| **largest batch that fits** | **{largest}** |")
    return lines


def knob_table(claim: Claim, ev: Evaluator) -> list[str]:
    lines = [
        (
            "| knob (changed from the setting above) | device total GiB | needs GiB "
            "| card GiB | fits? | largest batch |"
        ),
        "|---|---:|---:|---:|---|---:|",
    ]
    for label, changes in claim.knobs:
        card = changes.get("card", claim.card)
        setting = {**claim.setting, **{k: v for k, v in changes.items() if k != "card"}}
        e = ev.device(claim.model, card, setting)
        largest = ev.largest_batch(claim.model, card, setting)
        mark = "**yes**" if fits_on(e, card) else "no"
        lines.append(
            f"| {label} | {gib(e.device_total)} | {gib(e.device_needed)} "
            f"| {gib(budget(card))} | {mark} | {largest} |"
        )
    return lines


def gpt3_arithmetic() -> list[str]:
    """Weights alone, before any activation or cache: the claim fails here already."""
    params = model_entry("gpt3-175b").params
    card = budget("A100 40GB")
    int8 = quantize.quantized_footprint("gpt3-175b", bits=8, dtype="bf16")
    nf4 = quantize.quantized_footprint("gpt3-175b", bits=4, dtype="bf16")
    # Weights split evenly over N cards (tensor/pipeline parallel), each card also holding
    # its CUDA context: a lower bound on the cards, before the KV cache and activations.
    usable = card - to_device(MemoryEstimate(), gpu=gpu("A100 40GB")).context
    return [
        (
            f"- {params:,} parameters x 1 byte (int8) = {params / 1e9:.1f} GB "
            f"= {params / GiB:.1f} GiB, against {card / GiB:.0f} GiB on the card "
            f"({params / card:.1f}x)."
        ),
        (
            f"- `quantize.quantized_footprint('gpt3-175b', bits=8, dtype='bf16')`: "
            f"{format_bytes(int8.total)} ({int8.bits_per_parameter:.2f} bits/parameter: "
            "row scales, embeddings and head in bf16)."
        ),
        (
            f"- The same with `bits=4` (NF4, double quantization): {format_bytes(nf4.total)} "
            f"({nf4.bits_per_parameter:.2f} bits/parameter)."
        ),
        (
            f"- Cards needed just to hold the weights, split evenly: int8 "
            f"{math.ceil(int8.total / usable)} x A100 40GB, NF4 {math.ceil(nf4.total / usable)} "
            "x A100 40GB (arithmetic; torchfit has no inference-sharding plan yet)."
        ),
    ]


def main() -> None:
    started = time.perf_counter()
    ev = Evaluator()
    summary = [
        (
            "| claim | setting checked | device total GiB | needs GiB | card GiB | torchfit "
            "| largest batch |"
        ),
        "|---|---|---:|---:|---:|---|---:|",
    ]
    sections: list[str] = []
    for claim in CLAIMS:
        e = ev.device(claim.model, claim.card, claim.setting)
        card_bytes = budget(claim.card)
        largest = ev.largest_batch(claim.model, claim.card, claim.setting)
        verdict = "FITS" if fits_on(e, claim.card) else "DOES NOT FIT"
        summary.append(
            f"| {claim.text} | {setting_text(claim.setting)} | {gib(e.device_total)} "
            f"| {gib(e.device_needed)} | {gib(card_bytes)} | {verdict} | {largest} |"
        )
        sections += ["", f"### {claim.text}", "", *breakdown(claim, e, card_bytes, largest), ""]
        if claim.key == "gpt3":
            sections += [*gpt3_arithmetic(), ""]
        sections += knob_table(claim, ev)
    print("### Summary\n")
    print("\n".join(summary))
    print("\n".join(sections))
    seconds = time.perf_counter() - started
    print(f"benchmarks/fact_check.py: {seconds:.0f} s", file=sys.stderr)  # stdout stays exact


if __name__ == "__main__":
    main()
