"""The knobs `fits` suggests, each re-estimated with the same estimator."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torchfit._core.units import format_bytes
from torchfit.memory.plan.settings import transformer_spec
from torchfit.memory.result import MemoryEstimate

if TYPE_CHECKING:
    from torchfit.memory.gpus import GPU
    from torchfit.memory.plan.settings import Settings

__all__ = ["Advice", "advise", "lora_parameters"]

_LORA_RANK = 16
_SHARDS = (2, 4, 8, 16, 32, 64)
#: Precisions under which a 16-bit training dtype means autocast (None: fits' default).
_AUTOCAST = frozenset({None, "bf16-mixed", "16-mixed"})
#: Data-parallel strategies the advice tries, cheapest communication first, with what
#: each shards (`torchfit.memory.sharding`).
_STRATEGIES = (
    ("ddp", "DDP", "a full replica per GPU; only the batch is split"),
    ("zero2", "ZeRO-2", "optimizer state and gradients sharded, activations per GPU"),
    (
        "fsdp",
        "FSDP / ZeRO-3",
        "weights, gradients and optimizer state sharded, activations per GPU",
    ),
)


@dataclasses.dataclass(frozen=True)
class Advice:
    """One knob and what it buys.

    Attributes:
        knob: What to change, in words (``"gradient checkpointing"``).
        device_needed: The re-estimated device need (`MemoryEstimate.device_needed`).
        saves: Bytes saved against the current plan.
        fits: Whether the card holds it with that change.
        detail: How to apply it, or the rule the figure assumes.
    """

    knob: str
    device_needed: int
    saves: int
    fits: bool
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Plain Python values."""
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        """One line: verdict, knob, new total, saving, detail."""
        mark = "fits" if self.fits else "no  "
        text = f"[{mark}] {self.knob}: {format_bytes(self.device_needed)}"
        text += f" (saves {format_bytes(self.saves)})"
        return f"{text}; {self.detail}" if self.detail else text


def lora_parameters(settings: Settings, rank: int = _LORA_RANK) -> int | None:
    """LoRA adapter parameters on every block Linear: rank · (in + out) per layer."""
    from torchfit.memory.analytic.quantized import block_linear_shapes  # noqa: PLC0415

    try:
        spec = transformer_spec(settings.model)
    except (ValueError, ImportError):
        return None
    if spec is None:
        return None
    return sum(rank * (o + i) for o, i in block_linear_shapes(spec))


def _changes(settings: Settings, card: GPU) -> list[tuple[str, dict[str, Any], str]]:
    training = settings.mode == "train"
    options: list[tuple[str, dict[str, Any], str]] = []
    half = "bf16" if card.bf16 else "fp16"
    if settings.dtype in {"fp32", "tf32"}:
        how = "torchfit.precision.MixedPrecision" if training else "model.to(torch.bfloat16)"
        options.append((f"{half} mixed precision", {"dtype": half}, how))
    if training and not settings.gradient_checkpointing and settings.seq_len is not None:
        options.append(
            (
                "gradient checkpointing",
                {"gradient_checkpointing": True},
                "model.gradient_checkpointing_enable(); about 30% more compute",
            )
        )
    # FSDP under autocast: the 16-bit copies of each gathered layer's weights are saved for
    # backward, a whole 16-bit model per rank, which 16-bit gathers do not make
    autocast = settings.dtype in {"bf16", "fp16"} and settings.precision in _AUTOCAST
    if training and autocast and settings.strategy in {"fsdp", "hsdp"} and not settings.param_dtype:
        how = f"{settings.dtype} gathers: autocast keeps no 16-bit weight copies for backward"
        policy = f"FSDP2 MixedPrecisionPolicy(param_dtype={settings.dtype})"
        options.append((policy, {"param_dtype": settings.dtype}, how))
    if training and settings.optimizer in {"adam", "adamw"}:
        options.append(("8-bit AdamW", {"optimizer": "adamw-8bit"}, "bitsandbytes.optim.AdamW8bit"))
    quantized = settings.dtype in {"int8", "int4", "nf4", "fp4"}
    lora = lora_parameters(settings) if settings.seq_len is not None else None
    if not training and not quantized and settings.seq_len is not None:
        options.append(
            ("int8 weights", {"dtype": "int8"}, "torchfit.quantize.load_quantized(bits=8)")
        )
        options.append(
            ("NF4 weights", {"dtype": "nf4"}, "torchfit.quantize.load_quantized(bits=4)")
        )
    if training and lora and settings.trainable_params is None:
        options.append(
            (f"LoRA r={_LORA_RANK}", {"trainable_params": lora}, f"{lora:,} trainable parameters")
        )
        if not quantized:
            options.append(
                (
                    f"QLoRA (NF4 base, LoRA r={_LORA_RANK})",
                    {"trainable_params": lora, "dtype": "nf4"},
                    "load_quantized(bits=4) + peft LoRA",
                )
            )
    if settings.seq_len and settings.seq_len >= 256:
        options.append(
            (f"sequence {settings.seq_len // 2}", {"seq_len": settings.seq_len // 2}, "")
        )
    return options


def advise(
    reestimate: Callable[[dict[str, Any]], MemoryEstimate],
    *,
    settings: Settings,
    current: MemoryEstimate,
    card: GPU,
    num_gpus: int,
) -> tuple[Advice, ...]:
    """Every applicable knob, re-estimated, sorted by bytes saved (largest first)."""
    budget = card.total
    found: list[Advice] = []
    for knob, changes, detail in _changes(settings, card):
        try:
            total = reestimate(changes).device_needed
        except ValueError:
            continue
        found.append(Advice(knob, total, current.device_needed - total, total <= budget, detail))
    found += _accumulation(reestimate, settings, current, budget)
    if settings.mode == "train":
        found += _sharding(reestimate, settings, current, budget, num_gpus)
    found = [a for a in found if a.saves > 0]
    return tuple(sorted(found, key=lambda a: (not a.fits, -a.saves)))


def _accumulation(
    reestimate: Callable[[dict[str, Any]], MemoryEstimate],
    settings: Settings,
    current: MemoryEstimate,
    budget: int,
) -> list[Advice]:
    if settings.mode != "train" or settings.batch_size <= 1:
        return []
    micro = settings.batch_size // 2
    while micro >= 1:
        steps = math.ceil(settings.batch_size / micro)
        # re-estimated with the accumulation: the gradients live through the micro-batches
        changes = {
            "batch_size": micro,
            "gradient_accumulation_steps": steps * settings.gradient_accumulation_steps,
            "optimizer_in_backward": False,
        }
        try:
            total = reestimate(changes).device_needed
        except ValueError:  # the estimator cannot model accumulation for this model
            return []
        if total <= budget or micro == 1:
            return [
                Advice(
                    f"batch {micro} x {steps} accumulation steps",
                    total,
                    current.device_needed - total,
                    total <= budget,
                    f"same effective batch ({micro * steps})",
                )
            ]
        micro //= 2
    return []


def _sharding(
    reestimate: Callable[[dict[str, Any]], MemoryEstimate],
    settings: Settings,
    current: MemoryEstimate,
    budget: int,
    num_gpus: int,
) -> list[Advice]:
    """Per strategy: the fewest GPUs that hold the step with the global batch kept."""
    advice: list[Advice] = []
    world = max(1, settings.world_size)
    global_batch = settings.batch_size * world
    counts = [n for n in _SHARDS if n >= max(2, num_gpus)]
    for strategy, label, detail in _STRATEGIES:
        try:
            found = _fewest_gpus(reestimate, strategy, counts, global_batch, budget)
        except ValueError:  # no transformer description: per-rank plans need one
            return _offload(current, budget)
        if found is None:
            continue
        n, micro, steps, total = found
        kept = n * micro * steps
        if kept != global_batch and current.device_needed <= budget:
            continue  # it fits already: a bigger global batch is another run, not a saving
        knob = f"{label} on {n} GPUs at batch {micro} per GPU"
        knob += f", {steps} steps accumulated" if steps > 1 else ""
        knob += (
            f" (global {kept})" if kept == global_batch else f" (global {kept}, was {global_batch})"
        )
        fits = total <= budget
        advice.append(Advice(knob, total, current.device_needed - total, fits, detail))
    return advice + _offload(current, budget)


def _fewest_gpus(
    reestimate: Callable[[dict[str, Any]], MemoryEstimate],
    strategy: str,
    counts: list[int],
    global_batch: int,
    budget: int,
) -> tuple[int, int, int, int] | None:
    """(GPUs, per-GPU micro-batch, accumulation steps, device total) for one strategy.

    For N = 2, 4, ... the per-GPU share of the global batch is ``ceil(B / N)``; when
    it does not fit, it is halved with gradient accumulation making up the rest. The
    first N with a micro-batch that fits wins; with none, the largest N at micro-batch 1
    is returned as the nearest miss (``None`` when even that saves nothing new).
    """
    last: tuple[int, int, int, int] | None = None
    for n in counts:
        share = math.ceil(global_batch / n)
        micro = share
        while micro >= 1:
            change = {"strategy": strategy, "world_size": n, "batch_size": micro}
            total = reestimate(change).device_needed
            steps = math.ceil(share / micro)
            if total <= budget:
                return n, micro, steps, total
            last = (n, micro, steps, total)
            micro //= 2
    return last


def _offload(current: MemoryEstimate, budget: int) -> list[Advice]:
    if not current.optimizer:
        return []
    total = current.device_needed - current.optimizer
    return [
        Advice(
            "optimizer state offloaded to CPU",
            total,
            current.optimizer,
            total <= budget,
            "ZeRO-Offload / FSDP CPUOffload; slower steps",
        )
    ]
