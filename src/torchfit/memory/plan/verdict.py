"""Does it fit? `fits` turns an estimate and a card into a verdict, limits and advice.

The estimate (analytic, `estimate`) is taken to the device with the allocator model
(`to_device`: reserved bytes plus CUDA context), compared with the card's memory, and
re-run for every knob a user could turn, so each piece of advice carries its own
re-estimated figure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from torchfit._core import checks
from torchfit._core.bisection import largest_fitting
from torchfit._core.optimizers import parse_optimizer
from torchfit._core.units import DType, format_bytes, parse_dtype
from torchfit.memory.allocator.context import (
    check_context_size,
    given_context,
    parse_cuda_version,
)
from torchfit.memory.gpus import GPU
from torchfit.memory.gpus.budget import resolve_budget
from torchfit.memory.outline import RecordedStep
from torchfit.memory.plan.advice import Advice, advise
from torchfit.memory.plan.device import (
    allocated_budget,
    estimated_once,
    holds,
    line_guess,
    on_card,
    outgrows,
    redrawn_guess,
    step_estimate,
)
from torchfit.memory.plan.device import device_estimate as _device_estimate
from torchfit.memory.plan.settings import Settings, config_of, default_seq_len, max_positions
from torchfit.memory.plan.sharded import shard_param_dtype
from torchfit.memory.result import MemoryEstimate
from torchfit.memory.sharding import parse_strategy
from torchfit.memory.step import Step
from torchfit.memory.step.built import built_fields
from torchfit.memory.step.entry import card_step

__all__ = ["Plan", "card_fit", "plan_card"]


@dataclasses.dataclass(frozen=True)
class Plan:
    """The verdict for one step of a model on one card (or several).

    Attributes:
        fits: The step's device need (`MemoryEstimate.device_needed`: the allocator's OOM
            line plus the CUDA context) is within the card's memory.
        estimate: The device-level `MemoryEstimate` of the planned step.
        gpu: The card (the smallest one when several were given).
        budget: Bytes available on one card.
        headroom: ``budget - estimate.device_needed`` (negative when it does not fit).
        largest_batch: Largest batch that fits with this step (0 if none).
        longest_seq: Longest sequence at batch 1 that fits (transformers), else ``None``.
        advice: Knobs that make it fit or fit more, each re-estimated, best first; each
            carries its changed `Step`.
        settings: What was planned: the model, the `Step` and where it runs.
        time: The step's predicted time on the card (a `torchfit.speed.StepTime`), when
            `torchfit.fits` was asked for it (``time=True``); else None.
        host: The host's side (a `torchfit.host.HostPlan`: RAM to load and run, cores and
            disk), when `torchfit.fits` was given a ``machine``; else None.
    """

    fits: bool
    estimate: MemoryEstimate
    gpu: GPU
    budget: int
    headroom: int
    largest_batch: int
    longest_seq: int | None
    advice: tuple[Advice, ...]
    settings: Settings
    # filled by the layers above memory (torchfit.fits), which know time and the host
    time: Any = None
    host: Any = None

    @property
    def step(self) -> Step:
        """The planned `Step` (its precision made concrete for the card)."""
        return self.settings.step

    @property
    def machine_fits(self) -> bool | None:
        """Card and host both hold the run; None when no host was planned."""
        if self.host is None:
            return None
        return self.fits and bool(self.host.fits)

    @property
    def num_gpus(self) -> int:
        """How many cards were given."""
        return self.settings.world_size

    def to_dict(self) -> dict[str, Any]:
        """Plain Python values, for ``--json``."""
        return (
            {
                "fits": self.fits,
                "gpu": self.gpu.name,
                "num_gpus": self.num_gpus,
                "budget": self.budget,
                "headroom": self.headroom,
                "largest_batch": self.largest_batch,
                "longest_seq": self.longest_seq,
                "estimate": self.estimate.to_dict(),
                "advice": [a.to_dict() for a in self.advice],
                "settings": self.settings.to_dict(),
            }
            | {
                key: value.to_dict()
                for key, value in (("time", self.time), ("host", self.host))
                if value is not None
            }
            | ({} if self.host is None else {"machine_fits": self.machine_fits})
        )

    def __bool__(self) -> bool:
        """True exactly when it fits: ``if torchfit.fits(...):`` reads as it says."""
        return self.fits

    def __repr__(self) -> str:
        """One line: model, verdict, device need against the card (``print`` for the report).

        Example:
            >>> plan_card("gpt2", "RTX 3060", seq_len=128)  # doctest: +ELLIPSIS
            <Plan gpt2, train, bf16-mixed, batch 1, seq 128: FITS, ... of 12.00 GiB on NVIDIA ...>
        """
        verdict = "FITS" if self.fits else "DOES NOT FIT"
        used = f"needs {format_bytes(self.estimate.device_needed)} of {format_bytes(self.budget)}"
        return f"<Plan {self._what(short=True)}: {verdict}, {used} on {self._cards()}>"

    def _what(self, *, short: bool) -> str:
        """The model and the step in words: mode, numbers, batch, sample, optimizer."""
        step = self.step
        numbers = step.precision
        if step.quantization is not None:
            numbers = f"{step.quantization} base, {numbers}"
        what = f"{self.settings.model}, {step.mode}, {numbers}, batch {step.batch_size}"
        if step.gradient_accumulation_steps > 1 and not short:
            what += f" x {step.gradient_accumulation_steps} accumulation steps"
        what += f", seq {step.seq_len}" if step.seq_len else ""
        what += f", input {'x'.join(map(str, step.input_shape))}" if step.input_shape else ""
        if step.training and not short:
            what += f", {_optimizer_name(step.optimizer)}"
        return what

    def _cards(self) -> str:
        cards = f"{self.num_gpus} x {self.gpu.name}" if self.num_gpus > 1 else self.gpu.name
        if self.settings.strategy is not None:
            cards += f" ({self.settings.strategy}, per rank)"
        return cards

    def __str__(self) -> str:
        """The breakdown, the verdict, the limits and the advice, as a report."""
        verdict = "FITS" if self.fits else "DOES NOT FIT"
        lines = [
            f"{self._what(short=False)} on {self._cards()} ({format_bytes(self.budget)})",
            str(self.estimate),
            f"verdict: {verdict} (headroom {format_bytes(self.headroom)})",
            f"largest batch that fits: {self.largest_batch}",
        ]
        if self.longest_seq is not None:
            lines.append(f"longest sequence at batch 1: {self.longest_seq}")
        if self.advice:
            lines.append("advice (each re-estimated):")
            lines += [f"  {a}" for a in self.advice]
        if self.time is not None:
            fit = "" if self.fits else "; it does not fit, so this is its time if it did"
            lines += ["", f"step time (predicted, the planned step on this card{fit}):"]
            lines.append(str(self.time))
        if self.host is not None:
            verdict = "FITS" if self.machine_fits else "DOES NOT FIT"
            card = "fits" if self.fits else "does not fit"
            lines += ["", str(self.host)]
            lines.append(
                f"machine verdict: {verdict} (the card: {card}; the host: {self.host.verdict})"
            )
        return "\n".join(lines)


def _as_planned(model: Any) -> Any:
    """A built model's config once its step holds what the model says (a ``PeftModel``).

    The search, the other moments and the advice change the step (its batch, a start of
    backward without adapters, another precision): read from the model again, its
    adapters and dtypes would contradict those changes.
    """
    config = config_of(model)
    return config if config is not None and built_fields(model) is not None else model


def _searched(model: Any, settings: Settings, card: GPU) -> tuple[Settings, MemoryEstimate, int]:
    """The settings (a sequence set where none was given), estimate and largest batch.

    The estimate is the settings' step on ``card``; the largest batch, the largest that
    fits it, searched from where the allocated bytes' line meets `allocated_budget`.
    """
    if settings.step.seq_len is None and settings.step.input_shape is None:
        settings = default_seq_len(model, settings)
    single = step_estimate(model, settings)
    current = on_card(single, settings, card)
    largest = _largest(
        model,
        card,
        lambda b: settings.replace(batch_size=b),
        start=(settings.step.batch_size, single),
        budget=allocated_budget(card, single.total, current),
        upper=1 << 20,
    )
    return settings, current, largest


def _longest(model: Any, settings: Settings, card: GPU, current: MemoryEstimate) -> int:
    """The longest sequence at batch 1 that fits ``card``."""
    one = settings.replace(batch_size=1)
    start = settings.step.seq_len or 1
    return _largest(
        model,
        card,
        lambda s: one.replace(seq_len=s),
        start=(start, step_estimate(model, one.replace(seq_len=start))),
        budget=allocated_budget(card, current.total, current),
        upper=max_positions(model, settings),
    )


def _largest(
    model: Any,
    card: GPU,
    settings_at: Callable[[int], Settings],
    *,
    start: tuple[int, MemoryEstimate],
    budget: int,
    upper: int,
) -> int:
    """The largest size in ``[1, upper]`` whose settings fit ``card``, from a line's guess.

    ``settings_at`` makes a size's settings; ``start`` is the size asked first and its
    `step_estimate`. The guess is where the allocated bytes' line meets ``budget``
    (`line_guess`), for a traced step redrawn with the card's view at the guess
    (`redrawn_guess`), then checked and bracketed by `largest_fitting`; each size is
    estimated once (a traced step takes about a second).
    """
    known = dict([start])

    def at(size: int) -> MemoryEstimate:
        if size not in known:
            known[size] = step_estimate(model, settings_at(size))
        return known[size]

    guess = line_guess(lambda n: at(n).total, start[0], budget, upper)
    # a traced step takes about a second a size: the card's view at the guess, redrawn up to
    # twice, spares the sizes a gallop from a 10%-short guess asks (closed forms take ms)
    if guess is not None and isinstance(start[1].outline, RecordedStep):
        for _ in range(2):
            near = guess
            other = min((n for n in known if n != near), key=lambda n: abs(n - near), default=near)
            guess = redrawn_guess(
                lambda n: at(n).total,
                lambda n: allocated_budget(card, at(n).total, on_card(at(n), settings_at(n), card)),
                near,
                other,
                upper,
            )
            if guess == near:
                break
    return largest_fitting(
        lambda n: holds(model, settings_at(n), card, single=at(n)), upper, guess=guess
    )


def card_fit(model: Any, card: GPU, step: Step) -> tuple[Settings, MemoryEstimate, int]:
    """A one-card plan's settings, device estimate and largest batch, as `plan_card`.

    Without the plan's longest sequence and advice: what a comparison of cards reads.
    ``step`` is already the card's (`card_step`).
    """
    name = model if isinstance(model, str) else type(model).__name__
    return _searched(model, Settings(model=name, step=step), card)


def _optimizer_name(optimizer: Any) -> str:
    """An optimizer as the report names it: its torchfit name, or a factory's name."""
    if callable(optimizer) and not isinstance(optimizer, str):
        return str(getattr(optimizer, "__name__", type(optimizer).__name__))
    return str(parse_optimizer(optimizer).value)


@checks.arguments(
    # a budget in bytes: under 1 MiB nothing fits, so a small number was meant as GB
    gpu=checks.number(
        at_least=2**20,
        integral=True,
        fix="give a card name ('RTX 4090'), a size string ('24GB') or bytes (24 * 2**30)",
    ),
    gpus_per_node=checks.whole(at_least=1),
    param_dtype=checks.parsed(parse_dtype, kinds=(str,)),
    context_bytes=checks.parsed(check_context_size, kinds=(str, int, float)),
    cuda_version=checks.parsed(parse_cuda_version, kinds=(str,)),
)
def plan_card(
    model: Any,
    gpu: str | float | GPU | Sequence[str | GPU],
    step: Step | None = None,
    *,
    strategy: str | None = None,
    offload_optimizer: bool = False,
    offload_params: bool = False,
    param_dtype: str | DType | None = None,
    gpus_per_node: int | None = None,
    cuda_version: str | None = None,
    context_bytes: int | str | None = None,
    **keywords: Any,
) -> Plan:
    """Will ``model``'s step fit ``gpu``? The verdict, the largest batch, and advice.

    Args:
        model: A catalog name, a local config.json, a transformers config or model, or
            an ``nn.Module`` (with ``input_shape``).
        gpu: A card name (``"RTX 3060"``), a `GPU`, a byte budget (``"10GiB"``) or a list
            of cards.
        step: The step, a `torchfit.Step`. Its ``precision`` may be ``"auto"``: bf16
            where the card has native bf16, else fp16 (mixed in training).
        strategy: Training over the cards of a list: ``"ddp"``, ``"zero1"``, ``"zero2"``,
            ``"fsdp"``/``"zero3"`` (`torchfit.memory.sharding`); the estimate is per rank,
            with the step's ``batch_size`` per rank.
        offload_optimizer: With a ZeRO/FSDP ``strategy``: optimizer state and its step on
            the CPU (DeepSpeed ZeRO-Offload, FSDP2 ``CPUOffloadPolicy``).
        offload_params: With ``strategy="fsdp"``/``"zero3"``: parameter and gradient
            shards on the CPU too.
        param_dtype: With ``strategy="fsdp"``: FSDP2's
            ``MixedPrecisionPolicy(param_dtype=...)`` (``"bf16"``/``"fp16"``): gathered
            parameters are 16-bit, so autocast makes no weight copies.
        gpus_per_node: GPUs per node for ``strategy="hsdp"`` (sharded within a node,
            replicated across nodes), and for the host memory offloading needs per node.
        cuda_version: The CUDA version the job runs (``"11.2"``, ``"12.4"``): the CUDA
            context is larger before 11.7 (see `cuda_context_bytes`).
        context_bytes: The CUDA context you measured (``"420MiB"``), instead of the model;
            ``"measure"`` measures it on this machine's GPU (`measure_cuda_context`).
        **keywords: Or the step as keywords, as `torchfit.estimate` takes them (`Step`'s
            fields, ``dtype=``...). Without ``precision`` the card chooses, as with
            ``precision="auto"``; ``dtype`` may then name a 4/8-bit base (``"nf4"``).

    Returns:
        A `Plan`: truthy exactly when it fits; ``print`` it for the report.

    Raises:
        ValueError: a bad value or a contradiction (each message names the fix).
        TypeError: a `Step` and step keywords together; an unknown keyword.

    Example:
        >>> plan = plan_card("gpt3-175b", "A100 40GB", mode="inference", dtype="int8")
        >>> plan.fits
        False
        >>> from torchfit import Step
        >>> bool(plan_card("gpt2", "RTX 2070 Super", Step(mode="inference", seq_len=1024,
        ...                                          quantization="nf4")))
        True
    """
    card, count = resolve_budget(gpu)
    if (offload_optimizer or offload_params) and strategy is None:
        raise ValueError(
            "offload_optimizer/offload_params move sharded state to the CPU and need a "
            "strategy: pass strategy='fsdp' (or 'zero2'), with one card or several "
            "(torchfit plan ... --gpus N --strategy fsdp --offload-optimizer)"
        )
    settings = Settings(
        model=model if isinstance(model, str) else type(model).__name__,
        step=card_step(step, keywords, card, where="fits(model, gpu, step)", model=model),
        world_size=count,
        strategy=None if strategy is None else parse_strategy(strategy).value,
        offload_optimizer=offload_optimizer,
        offload_params=offload_params,
        param_dtype=shard_param_dtype(param_dtype, strategy),
        gpus_per_node=gpus_per_node,
        cuda_version=None if cuda_version is None else str(cuda_version),
        context_bytes=given_context(context_bytes),
    )
    model = _as_planned(model)
    with estimated_once():  # the search and the advice ask some steps twice
        settings, current, largest = _searched(model, settings, card)
        longest = None
        if settings.step.seq_len is not None:
            longest = _longest(model, settings, card, current)
        advice = advise(
            lambda changes: _device_estimate(model, settings.replace(**changes), card),
            settings=settings,
            current=current,
            card=card,
            num_gpus=count,
            refuses=lambda changes: outgrows(model, settings.replace(**changes), card),
        )
    return Plan(
        fits=current.device_needed <= card.total,
        estimate=current,
        gpu=card,
        budget=card.total,
        headroom=card.total - current.device_needed,
        largest_batch=largest,
        longest_seq=longest,
        advice=advice,
        settings=settings,
    )
