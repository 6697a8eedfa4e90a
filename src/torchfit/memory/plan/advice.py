"""The knobs `fits` suggests, each re-estimated with the same estimator."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torchfit._core.optimizers import parse_optimizer
from torchfit._core.units import DType, format_bytes
from torchfit.memory.plan.settings import Settings, transformer_spec
from torchfit.memory.result import MemoryEstimate
from torchfit.memory.step import Step

if TYPE_CHECKING:
    from torchfit.memory.gpus import GPU

__all__ = ["Advice", "advise", "all_linear_lora_parameters"]

_LORA_RANK = 16
_SHARDS = (2, 4, 8, 16, 32, 64)
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
    """One knob and what it buys, with the step it was estimated with.

    Attributes:
        knob: What to change, in words (``"gradient checkpointing"``).
        device_needed: The re-estimated device need (`MemoryEstimate.device_needed`).
        saves: Bytes saved against the current plan.
        fits: Whether the card holds it with that change.
        detail: How to apply it, or the rule the figure assumes.
        changes: What changed, by name: `Step` fields and `fits`' own arguments
            (``strategy``, ``world_size``, ``param_dtype``, ``offload_optimizer``).
        step: The changed `Step`; ``torchfit.fits(model, gpu, advice.step)`` plans it
            (with the ``changes`` that are not step fields as keywords).
    """

    knob: str
    device_needed: int
    saves: int
    fits: bool
    detail: str = ""
    changes: dict[str, Any] = dataclasses.field(default_factory=dict)
    step: Step | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain Python values (the step's by `Step.to_dict`)."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {**data, "step": None if self.step is None else self.step.to_dict()}

    def __str__(self) -> str:
        """One line: verdict, knob, new total, saving, detail."""
        mark = "fits" if self.fits else "no  "
        text = f"[{mark}] {self.knob}: {format_bytes(self.device_needed)}"
        text += f" (saves {format_bytes(self.saves)})"
        return f"{text}; {self.detail}" if self.detail else text


@dataclasses.dataclass(frozen=True)
class _Baseline:
    """What each piece of advice is weighed against: the plan's settings, estimate, card."""

    settings: Settings
    current: MemoryEstimate
    budget: int
    refuses: Callable[[dict[str, Any]], bool]

    def advice(self, knob: str, changes: dict[str, Any], needed: int, detail: str = "") -> Advice:
        """An `Advice` for ``changes`` to the settings, which need ``needed`` bytes."""
        step = self.settings.replace(**changes).step
        saves = self.current.device_needed - needed
        return Advice(knob, needed, saves, needed <= self.budget, detail, dict(changes), step)


def all_linear_lora_parameters(settings: Settings, rank: int = _LORA_RANK) -> int | None:
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
    step = settings.step
    training = step.training
    options: list[tuple[str, dict[str, Any], str]] = []
    half = DType.BF16 if card.bf16 else DType.FP16
    quantized = step.quantization is not None
    if step.compute is DType.FP32 and not quantized:
        how = "torchfit.precision.MixedPrecision" if training else "model.to(torch.bfloat16)"
        prefix = "bf16" if half is DType.BF16 else "16"
        precision = f"{prefix}-mixed" if training else f"{prefix}-true"
        options.append((f"{half.value} mixed precision", {"precision": precision}, how))
    if training and not step.gradient_checkpointing and step.seq_len is not None:
        options.append(
            (
                "gradient checkpointing",
                {"gradient_checkpointing": True},
                "model.gradient_checkpointing_enable(); about 30% more compute",
            )
        )
    # FSDP under autocast: the 16-bit copies of each gathered layer's weights are saved for
    # backward, a whole 16-bit model per rank, which 16-bit gathers do not make
    autocast = step.mixed and step.compute.bits == 16 and not quantized
    if training and autocast and settings.strategy in {"fsdp", "hsdp"} and not settings.param_dtype:
        compute = step.compute.value
        how = f"{compute} gathers: autocast keeps no 16-bit weight copies for backward"
        policy = f"FSDP2 MixedPrecisionPolicy(param_dtype={compute})"
        options.append((policy, {"param_dtype": compute}, how))
    if training and _optimizer(step) in {"adam", "adamw"}:
        options.append(("8-bit AdamW", {"optimizer": "adamw-8bit"}, "bitsandbytes.optim.AdamW8bit"))
    if step.bnb_compute_dtype is not None and step.bnb_compute_dtype != step.compute.value:
        torch_name = "bfloat16" if step.compute is DType.BF16 else "float16"
        options.append(
            (
                f"4-bit layers computing in {step.compute.value}",
                {"bnb_compute_dtype": None},
                f"BitsAndBytesConfig(bnb_4bit_compute_dtype=torch.{torch_name}); faster too",
            )
        )
    lora = all_linear_lora_parameters(settings) if step.seq_len is not None else None
    if not training and not quantized and step.seq_len is not None:
        options.append(
            ("int8 weights", {"quantization": "int8"}, "torchfit.quantize.load_quantized(bits=8)")
        )
        options.append(
            ("NF4 weights", {"quantization": "nf4"}, "torchfit.quantize.load_quantized(bits=4)")
        )
    if training and lora and step.trainable_params is None and not step.wants_lora:
        options.append(
            (f"LoRA r={_LORA_RANK}", {"trainable_params": lora}, f"{lora:,} trainable parameters")
        )
        if not quantized:
            options.append(
                (
                    f"QLoRA (NF4 base, LoRA r={_LORA_RANK})",
                    {"trainable_params": lora, "quantization": "nf4"},
                    "load_quantized(bits=4) + peft LoRA",
                )
            )
    if step.seq_len and step.seq_len >= 256:
        options.append((f"sequence {step.seq_len // 2}", {"seq_len": step.seq_len // 2}, ""))
    return options


def _optimizer(step: Step) -> str | None:
    """The step's optimizer by name (None for a factory torchfit traces instead)."""
    if callable(step.optimizer) and not isinstance(step.optimizer, str):
        return None
    return str(parse_optimizer(step.optimizer).value)


def advise(
    reestimate: Callable[[dict[str, Any]], MemoryEstimate],
    *,
    settings: Settings,
    current: MemoryEstimate,
    card: GPU,
    num_gpus: int,
    refuses: Callable[[dict[str, Any]], bool] | None = None,
) -> tuple[Advice, ...]:
    """Every applicable knob, re-estimated, sorted by bytes saved (largest first).

    ``refuses(changes)`` is a quick test that a change cannot fit the card (its allocated
    bytes alone exceed it): the searches over micro-batches and GPU counts skip the full
    re-estimate of such a step and make it only for the size they report.
    """
    base = _Baseline(settings, current, card.total, refuses or (lambda _: False))
    found: list[Advice] = []
    for knob, changes, detail in _changes(settings, card):
        try:
            needed = reestimate(changes).device_needed
        except ValueError:
            continue
        found.append(base.advice(knob, changes, needed, detail))
    if settings.step.training:
        found += _accumulation(reestimate, base)
        found += _sharding(reestimate, base, num_gpus)
    found = [a for a in found if a.saves > 0]
    return tuple(sorted(found, key=lambda a: (not a.fits, -a.saves)))


def _accumulation(
    reestimate: Callable[[dict[str, Any]], MemoryEstimate], base: _Baseline
) -> list[Advice]:
    step = base.settings.step
    if step.batch_size <= 1:
        return []
    micro = step.batch_size // 2
    while micro >= 1:
        # the run's own accumulation times the micro-batches one batch now takes
        steps = math.ceil(step.batch_size / micro) * step.gradient_accumulation_steps
        # re-estimated with the accumulation: the gradients live through the micro-batches
        changes = {
            "batch_size": micro,
            "gradient_accumulation_steps": steps,
            "optimizer_in_backward": False,
        }
        try:
            if micro > 1 and base.refuses(changes):
                micro //= 2
                continue
            needed = reestimate(changes).device_needed
        except ValueError:  # the estimator cannot model accumulation for this model
            return []
        if needed <= base.budget or micro == 1:
            knob = f"batch {micro} x {steps} accumulation steps"
            return [base.advice(knob, changes, needed, f"same effective batch ({micro * steps})")]
        micro //= 2
    return []


def _sharding(
    reestimate: Callable[[dict[str, Any]], MemoryEstimate], base: _Baseline, num_gpus: int
) -> list[Advice]:
    """Per strategy: the fewest GPUs that hold the step with the global batch kept."""
    advice: list[Advice] = []
    step, budget = base.settings.step, base.budget
    global_batch = step.batch_size * max(1, base.settings.world_size)
    accumulated = step.gradient_accumulation_steps
    counts = [n for n in _SHARDS if n >= max(2, num_gpus)]
    for strategy, label, detail in _STRATEGIES:
        try:
            found = _fewest_gpus(
                reestimate,
                strategy,
                counts,
                global_batch,
                budget,
                accumulated=accumulated,
                refuses=base.refuses,
            )
        except ValueError:  # no transformer description: per-rank plans need one
            return _offload(base)
        if found is None:
            continue
        n, micro, steps, needed = found
        kept = n * micro * steps
        if kept != global_batch and base.current.device_needed <= budget:
            continue  # it fits already: a bigger global batch is another run, not a saving
        knob = f"{label} on {n} GPUs at batch {micro} per GPU"
        knob += f", {steps} steps accumulated" if steps > 1 else ""
        knob += (
            f" (global {kept})" if kept == global_batch else f" (global {kept}, was {global_batch})"
        )
        changes = _sharded(strategy, n, micro, steps, accumulated)
        advice.append(base.advice(knob, changes, needed, detail))
    return advice + _offload(base)


def _fewest_gpus(
    reestimate: Callable[[dict[str, Any]], MemoryEstimate],
    strategy: str,
    counts: list[int],
    global_batch: int,
    budget: int,
    *,
    accumulated: int,
    refuses: Callable[[dict[str, Any]], bool],
) -> tuple[int, int, int, int] | None:
    """(GPUs, per-GPU micro-batch, accumulation steps, device need) for one strategy.

    For N = 2, 4, ... the per-GPU share of the global batch is ``ceil(B / N)``; when
    it does not fit, it is halved with gradient accumulation making up the rest. The
    first N with a micro-batch that fits wins; with none, the largest N at micro-batch 1
    is returned as the nearest miss (``None`` when even that saves nothing new).
    """
    last: tuple[int, int, int, int | None] | None = None
    for n in counts:
        share = math.ceil(global_batch / n)
        micro = share
        while micro >= 1:
            steps = math.ceil(share / micro)
            changes = _sharded(strategy, n, micro, steps, accumulated)
            needed = None if refuses(changes) else reestimate(changes).device_needed
            if needed is not None and needed <= budget:
                return n, micro, steps, needed
            last = (n, micro, steps, needed)
            micro //= 2
    if last is None:
        return None
    n, micro, steps, needed = last
    if needed is None:  # refused quickly: the nearest miss is reported, so estimate it
        needed = reestimate(_sharded(strategy, n, micro, steps, accumulated)).device_needed
    return n, micro, steps, needed


def _sharded(strategy: str, n: int, micro: int, steps: int, accumulated: int) -> dict[str, Any]:
    """The changes of one sharded layout: its micro-batch, and accumulation if it needs it."""
    changes: dict[str, Any] = {"strategy": strategy, "world_size": n, "batch_size": micro}
    if steps > 1:  # the gradients live through the micro-batches
        changes["gradient_accumulation_steps"] = steps * accumulated
    return changes


def _offload(base: _Baseline) -> list[Advice]:
    """Optimizer state off the card: its bytes subtracted (no ZeRO-Offload estimate alone)."""
    optimizer = base.current.optimizer
    if not optimizer:
        return []
    needed = base.current.device_needed - optimizer
    detail = "ZeRO-Offload / FSDP CPUOffload; slower steps"
    return [
        base.advice("optimizer state offloaded to CPU", {"offload_optimizer": True}, needed, detail)
    ]
