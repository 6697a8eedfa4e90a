"""Does it fit? `fits` turns an estimate and a card into a verdict, limits and advice.

The estimate (analytic, `estimate`) is taken to the device with the allocator model
(`to_device`: reserved bytes plus CUDA context), compared with the card's memory, and
re-run for every knob a user could turn, so each piece of advice carries its own
re-estimated figure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from torchfit._core import checks
from torchfit._core.bisection import largest_fitting
from torchfit._core.step import (
    Mode,
    OptimizerName,
    parse_mode,
    parse_optimizer,
    parse_precision_name,
    resolve_numerics,
)
from torchfit._core.units import DType, format_bytes, parse_dtype
from torchfit.memory.allocator.context import (
    check_context_size,
    given_context,
    parse_cuda_version,
)
from torchfit.memory.gpus import GPU
from torchfit.memory.gpus.budget import resolve_budget
from torchfit.memory.knobs import ESTIMATE_RULES
from torchfit.memory.plan.advice import Advice, advise
from torchfit.memory.plan.device import device_estimate as _device_estimate
from torchfit.memory.plan.settings import Settings, default_seq_len, max_positions
from torchfit.memory.plan.sharded import shard_param_dtype
from torchfit.memory.result import MemoryEstimate
from torchfit.memory.sharding import parse_strategy

__all__ = ["Plan", "fits"]


@dataclasses.dataclass(frozen=True)
class Plan:
    """The verdict for one model on one card (or several).

    Attributes:
        fits: The step's device need (`MemoryEstimate.device_needed`: the allocator's OOM
            line plus the CUDA context) is within the card's memory.
        estimate: The device-level `MemoryEstimate` of the planned step.
        gpu: The card (the smallest one when several were given).
        num_gpus: How many cards were given.
        budget: Bytes available on one card.
        headroom: ``budget - estimate.device_needed`` (negative when it does not fit).
        max_batch_size: Largest batch that fits with these settings (0 if none).
        max_seq_len: Longest sequence at batch 1 that fits (transformers), else ``None``.
        advice: Knobs that make it fit or fit more, each re-estimated, best first.
        settings: What was estimated.
    """

    fits: bool
    estimate: MemoryEstimate
    gpu: GPU
    num_gpus: int
    budget: int
    headroom: int
    max_batch_size: int
    max_seq_len: int | None
    advice: tuple[Advice, ...]
    settings: Settings

    def to_dict(self) -> dict[str, Any]:
        """Plain Python values, for ``--json``."""
        return {
            "fits": self.fits,
            "gpu": self.gpu.name,
            "num_gpus": self.num_gpus,
            "budget": self.budget,
            "headroom": self.headroom,
            "max_batch_size": self.max_batch_size,
            "max_seq_len": self.max_seq_len,
            "estimate": self.estimate.to_dict(),
            "advice": [a.to_dict() for a in self.advice],
            "settings": dataclasses.asdict(self.settings),
        }

    def __bool__(self) -> bool:
        """True exactly when it fits: ``if torchfit.fits(...):`` reads as it says."""
        return self.fits

    def __repr__(self) -> str:
        """One line: model, verdict, device total against the card (``print`` for the report).

        Example:
            >>> fits("gpt2", "RTX 3060", seq_len=128)  # doctest: +ELLIPSIS
            <Plan gpt2, train, bf16, batch 1, seq 128: FITS, ... of 12.00 GiB on NVIDIA GeForce ...>
        """
        s = self.settings
        what = f"{s.model}, {s.mode}, {self._numbers()}, batch {s.batch_size}"
        what += f", seq {s.seq_len}" if s.seq_len else ""
        what += f", input {'x'.join(map(str, s.input_shape))}" if s.input_shape else ""
        verdict = "FITS" if self.fits else "DOES NOT FIT"
        used = f"needs {format_bytes(self.estimate.device_needed)} of {format_bytes(self.budget)}"
        return f"<Plan {what}: {verdict}, {used} on {self._cards()}>"

    def _numbers(self) -> str:
        s = self.settings
        if s.precision is not None and s.dtype in {"int8", "nf4", "int4", "fp4"}:
            return f"{s.dtype} base, {s.precision}"
        return s.dtype if s.precision is None else s.precision

    def _cards(self) -> str:
        cards = f"{self.num_gpus} x {self.gpu.name}" if self.num_gpus > 1 else self.gpu.name
        if self.settings.strategy is not None:
            cards += f" ({self.settings.strategy}, per rank)"
        return cards

    def __str__(self) -> str:
        """The breakdown, the verdict, the limits and the advice, as a report."""
        s = self.settings
        what = f"{s.model}, {s.mode}, {self._numbers()}, batch {s.batch_size}"
        if s.gradient_accumulation_steps > 1:
            what += f" x {s.gradient_accumulation_steps} accumulation steps"
        what += f", seq {s.seq_len}" if s.seq_len else ""
        what += f", input {'x'.join(map(str, s.input_shape))}" if s.input_shape else ""
        what += f", {s.optimizer}" if s.mode == "train" else ""
        verdict = "FITS" if self.fits else "DOES NOT FIT"
        lines = [
            f"{what} on {self._cards()} ({format_bytes(self.budget)})",
            str(self.estimate),
            f"verdict: {verdict} (headroom {format_bytes(self.headroom)})",
            f"largest batch that fits: {self.max_batch_size}",
        ]
        if self.max_seq_len is not None:
            lines.append(f"longest sequence at batch 1: {self.max_seq_len}")
        if self.advice:
            lines.append("advice (each re-estimated):")
            lines += [f"  {a}" for a in self.advice]
        return "\n".join(lines)


def _lora_settings(
    lora: Any, rank: int | None, targets: str | Sequence[str] | None, dropout: float | None
) -> dict[str, Any]:
    """The LoRA fields of `Settings`, from a ``peft.LoraConfig`` or the separate knobs."""
    if lora is not None:
        if rank is not None or targets is not None or dropout is not None:
            raise ValueError(
                "lora= (a peft.LoraConfig) and lora_rank=/lora_targets=/lora_dropout= both "
                "describe the adapters; pass one of them"
            )
        if getattr(lora, "modules_to_save", None):
            raise ValueError(
                "fits() plans adapters only; for a LoraConfig with modules_to_save, "
                "call torchfit.memory.estimate(..., lora=config)"
            )
        rank, targets = int(lora.r), lora.target_modules
        dropout = float(getattr(lora, "lora_dropout", 0.0) or 0.0)
    names = (
        None if targets is None else ((targets,) if isinstance(targets, str) else tuple(targets))
    )
    return {"lora_rank": rank, "lora_targets": names, "lora_dropout": dropout}


@checks.arguments(
    **ESTIMATE_RULES,
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
def fits(
    model: Any,
    gpu: str | float | GPU | Sequence[str | GPU],
    *,
    mode: str = "train",
    dtype: str | DType = "auto",
    batch_size: int = 1,
    seq_len: int | None = None,
    input_shape: tuple[int, ...] | None = None,
    optimizer: str | None = "adamw",
    gradient_checkpointing: bool = False,
    attn_implementation: str = "sdpa",
    trainable_params: int | None = None,
    strategy: str | None = None,
    offload_optimizer: bool = False,
    offload_params: bool = False,
    param_dtype: str | DType | None = None,
    gpus_per_node: int | None = None,
    precision: str | None = None,
    gradient_accumulation_steps: int = 1,
    set_to_none: bool = True,
    keep_output: bool = False,
    optimizer_in_backward: bool = False,
    cuda_version: str | None = None,
    context_bytes: int | str | None = None,
    loss_chunk_size: int | None = None,
    max_new_tokens: int | None = None,
    lora: Any = None,
    lora_rank: int | None = None,
    lora_targets: str | Sequence[str] | None = None,
    lora_dropout: float | None = None,
    bitsandbytes_version: str | None = None,
    double_quant: bool = True,
    quantize_head: bool = False,
    base_dtype: str | None = None,
) -> Plan:
    """Will ``model`` fit ``gpu``? The verdict, the largest batch, and advice.

    Args:
        model: A catalog name, a local config.json, a transformers config or model, or
            an ``nn.Module`` (with ``input_shape``).
        gpu: A card name (``"RTX 3060"``), a `GPU`, a byte budget (``"10GiB"``) or a list
            of cards.
        mode: ``"train"`` or ``"inference"``.
        dtype: ``"auto"`` (bf16 where the card has native bf16, else fp16: mixed
            precision in training), or ``"fp32"``, ``"bf16"``, ``"fp16"``, ``"int8"``,
            ``"nf4"``...
        batch_size: The batch to check.
        seq_len: Tokens per sample (transformers; the model's maximum by default).
        input_shape: One sample's shape for non-transformer models.
        optimizer: See `estimate`.
        gradient_checkpointing: See `estimate`.
        attn_implementation: ``"eager"``, ``"sdpa"`` or ``"flash"``.
        trainable_params: Parameters that train (LoRA, frozen layers).
        strategy: Training over the cards of a list: ``"ddp"``, ``"zero1"``, ``"zero2"``,
            ``"fsdp"``/``"zero3"`` (`torchfit.memory.sharding`); the estimate is per rank,
            with ``batch_size`` per rank.
        offload_optimizer: With a ZeRO/FSDP ``strategy``: optimizer state and its step on
            the CPU (DeepSpeed ZeRO-Offload, FSDP2 ``CPUOffloadPolicy``).
        offload_params: With ``strategy="fsdp"``/``"zero3"``: parameter and gradient
            shards on the CPU too.
        param_dtype: With ``strategy="fsdp"``: FSDP2's
            ``MixedPrecisionPolicy(param_dtype=...)`` (``"bf16"``/``"fp16"``): gathered
            parameters are 16-bit, so autocast makes no weight copies.
        gpus_per_node: GPUs per node for ``strategy="hsdp"`` (sharded within a node,
            replicated across nodes), and for the host memory offloading needs per node.
        precision: Lightning's names (``"bf16-true"``, ``"bf16-mixed"``, ``"16-mixed"``,
            ``"16-true"``, ``"32-true"``); see `estimate`. With it, ``dtype`` stays
            ``"auto"`` or names a quantized base.
        gradient_accumulation_steps: Micro-batches per optimizer step (``batch_size`` is
            one micro-batch); see `estimate`.
        set_to_none: ``zero_grad(set_to_none=...)``; see `estimate`.
        keep_output: The output is referenced through backward; see `estimate`.
        optimizer_in_backward: See `estimate`.
        cuda_version: The CUDA version the job runs (``"11.2"``, ``"12.4"``): the CUDA
            context is larger before 11.7 (see `cuda_context_bytes`).
        context_bytes: The CUDA context you measured (``"420MiB"``), instead of the model;
            ``"measure"`` measures it on this machine's GPU (`measure_cuda_context`).
        loss_chunk_size: A loss computed in chunks of this many positions; see `estimate`.
        max_new_tokens: Inference is ``generate`` of that many tokens after a ``seq_len``
            prompt; see `estimate`.
        lora: A ``peft.LoraConfig`` (its r, target_modules and lora_dropout); or
        lora_rank: LoRA rank, and
        lora_targets: the Linears that get adapters (see `estimate`); a 4/8-bit base
            without these or ``trainable_params`` assumes PEFT's default adapters.
        lora_dropout: The adapters' dropout.
        bitsandbytes_version: The bitsandbytes of a 4-bit run (default: the installed one).
        double_quant: With a 4-bit ``dtype``: double quantization of the absmax values.
        quantize_head: The output head quantized too (see `estimate`).
        base_dtype: A frozen base's dtype under mixed precision (see `estimate`).

    Example:
        >>> plan = fits("gpt3-175b", "A100 40GB", mode="inference", dtype="int8")
        >>> plan.fits
        False
        >>> fits("gpt2", "RTX 2070 Super", mode="inference", dtype="nf4", seq_len=1024).fits
        True
    """
    card, count = resolve_budget(gpu)
    if (offload_optimizer or offload_params) and strategy is None:
        raise ValueError(
            "offload_optimizer/offload_params move sharded state to the CPU and need a "
            "strategy: pass strategy='fsdp' (or 'zero2'), with one card or several "
            "(torchfit plan ... --gpus N --strategy fsdp --offload-optimizer)"
        )
    step = parse_mode(mode)
    auto = str(dtype) == "auto"
    if precision is not None:
        numerics = resolve_numerics(
            precision=precision, dtype=None if auto else dtype, mixed_precision=None
        )
        chosen = numerics.weights.value
    else:
        chosen = ("bf16" if card.bf16 else "fp16") if auto else parse_dtype(dtype).value
    opt = parse_optimizer(optimizer) if step is Mode.TRAIN else OptimizerName.NONE
    settings = Settings(
        model=model if isinstance(model, str) else type(model).__name__,
        mode=step.value,
        dtype=chosen,
        batch_size=batch_size,
        seq_len=seq_len,
        input_shape=input_shape,
        optimizer=opt.value,
        gradient_checkpointing=gradient_checkpointing,
        attn_implementation=attn_implementation,
        trainable_params=trainable_params,
        strategy=None if strategy is None else parse_strategy(strategy).value,
        world_size=count,
        offload_optimizer=offload_optimizer,
        offload_params=offload_params,
        param_dtype=shard_param_dtype(param_dtype, strategy),
        gpus_per_node=gpus_per_node,
        precision=None if precision is None else parse_precision_name(precision).value,
        gradient_accumulation_steps=gradient_accumulation_steps,
        set_to_none=set_to_none,
        keep_output=keep_output,
        optimizer_in_backward=optimizer_in_backward,
        cuda_version=None if cuda_version is None else str(cuda_version),
        context_bytes=given_context(context_bytes),
        loss_chunk_size=loss_chunk_size,
        max_new_tokens=max_new_tokens,
        **_lora_settings(lora, lora_rank, lora_targets, lora_dropout),
        bitsandbytes_version=bitsandbytes_version,
        double_quant=double_quant,
        quantize_head=quantize_head,
        base_dtype=base_dtype,
    )
    if seq_len is None and input_shape is None:
        settings = default_seq_len(model, settings)
    current = _device_estimate(model, settings, card)

    def fits_with(**changes: Any) -> bool:
        changed = dataclasses.replace(settings, **changes)
        return _device_estimate(model, changed, card).device_needed <= card.total

    max_batch = largest_fitting(lambda b: fits_with(batch_size=b), 1 << 20)
    max_seq = None
    if settings.seq_len is not None:
        max_seq = largest_fitting(
            lambda s: fits_with(batch_size=1, seq_len=s), max_positions(model, settings)
        )
    advice = advise(
        lambda changes: _device_estimate(model, dataclasses.replace(settings, **changes), card),
        settings=settings,
        current=current,
        card=card,
        num_gpus=count,
    )
    return Plan(
        fits=current.device_needed <= card.total,
        estimate=current,
        gpu=card,
        num_gpus=count,
        budget=card.total,
        headroom=card.total - current.device_needed,
        max_batch_size=max_batch,
        max_seq_len=max_seq,
        advice=advice,
        settings=settings,
    )
