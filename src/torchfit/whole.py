"""`fits` for the whole run: the card's memory plan, the step's time, the host's side.

`torchfit.memory.plan.plan_card` plans the card. This layer sits above memory, speed and host, so
it can add what they answer about the same step: with ``time=True`` its predicted time on
the card (`torchfit.speed.step_time`), with ``machine=`` the host's RAM to load and run
the model and, given a loader's measured cost, the cores and disk that keep the card fed
(`torchfit.host.host_fits`). The `Plan` carries them and prints them after its advice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from torchfit._core import checks
from torchfit._core.units import DType, parse_dtype
from torchfit.host import HostPlan, Machine, SampleCost, host_fits, machine, this_machine
from torchfit.loaders import LoaderReport
from torchfit.memory.estimator import estimate
from torchfit.memory.gpus import GPU
from torchfit.memory.plan import Plan, plan_card
from torchfit.memory.plan.settings import transformer_spec
from torchfit.memory.plan.sharded import gathered_bytes, stored_itemsize
from torchfit.memory.step import Step
from torchfit.speed import StepTime, step_time
from torchfit.speed.comm import comm_for, data_parallel_time, link_of

__all__ = ["fits"]


@checks.arguments()
def fits(
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
    time: bool = False,
    machine: Machine | str | None = None,
    loader: LoaderReport | SampleCost | None = None,
    **keywords: Any,
) -> Plan:
    """Will ``model``'s step fit ``gpu``, how long does it take, and does the host hold it?

    The card's verdict, largest batch and advice come from
    `torchfit.memory.plan.plan_card`; the step's time and the host are added when asked.

    Args:
        model: A catalog name, Hub id, local ``config.json``, transformers config or
            model, or an ``nn.Module`` (with ``input_shape``).
        gpu: A card name (``"RTX 3060"``), a `GPU`, a byte budget (``"10GiB"``) or a list
            of cards.
        step: The step, a `torchfit.Step`. Its ``precision`` may be ``"auto"``: bf16
            where the card has native bf16, else fp16 (mixed in training).
        strategy: Training over the cards of a list: ``"ddp"``, ``"zero1"``, ``"zero2"``,
            ``"fsdp"``/``"zero3"``, ``"hsdp"``; the estimate is per rank, with the step's
            ``batch_size`` per rank.
        offload_optimizer: With a ZeRO/FSDP ``strategy``: optimizer state and its step on
            the CPU (DeepSpeed ZeRO-Offload, FSDP2 ``CPUOffloadPolicy``).
        offload_params: With ``strategy="fsdp"``/``"zero3"``: parameter and gradient
            shards on the CPU too.
        param_dtype: With ``strategy="fsdp"``: FSDP2's ``MixedPrecisionPolicy(param_dtype=)``.
        gpus_per_node: GPUs per node for ``strategy="hsdp"``.
        cuda_version: The CUDA version the job runs (the context is larger before 11.7).
        context_bytes: The CUDA context you measured (``"420MiB"``), or ``"measure"``.
        time: Predict the step's time on the card (`Plan.time`: ms per step, tokens/s,
            MFU; one card: the communication between several is not modelled).
        machine: Plan the host too (`Plan.host`): a `torchfit.host.Machine`, an example
            name (``"desktop-3060"``, ``"workstation-a100"``) or ``"this"``. The weights
            load as the step holds them (4/8-bit on load, fp32 master weights under a
            ``*-mixed`` precision, else the compute dtype) onto the card.
        loader: With ``machine``: what the DataLoader measured per sample (a
            `torchfit.loaders.LoaderReport` from ``tuned_loader_and_report``, or a
            `torchfit.host.SampleCost`): the cores and disk the step's pace needs (the
            step is timed for it).
        **keywords: Or the step as keywords, as `torchfit.estimate` takes them (`Step`'s
            fields, ``dtype=``...). Without ``precision`` the card chooses, as with
            ``precision="auto"``; ``dtype`` may then name a 4/8-bit base (``"nf4"``).

    Returns:
        A `Plan`; truthy when the step fits the card, ``plan.machine_fits`` for card
        and host together; ``print`` it for the report.

    Raises:
        ValueError: ``loader`` over several cards, ``loader`` without
            ``machine``, ``machine`` with state offloaded to the CPU (plan that host with
            `torchfit.host.host_fits(offloaded=...)`), a bad value or a contradiction (each
            message names the fix).
        TypeError: a `Step` and step keywords together; an unknown keyword.

    Example:
        >>> plan = fits("gpt2", "RTX 3060", batch_size=4, seq_len=512, time=True,
        ...             machine="desktop-3060")
        >>> plan.fits, plan.time.tokens_per_s > 1000, plan.machine_fits
        (True, True, True)
    """
    if loader is not None and machine is None:
        raise ValueError(
            "loader= checks the cores and disk of a machine: give machine= too "
            "(machine='this' for this one)"
        )
    if machine is not None and (offload_optimizer or offload_params):
        raise ValueError(
            "machine= with offload_optimizer/offload_params: the host's share of offloaded "
            "state is not planned here; plan the host with torchfit.host.host_fits(..., "
            "offloaded=torchfit.host.optimizer_offload_bytes(...)), or leave machine= out"
        )
    plan = plan_card(
        model,
        gpu,
        step,
        strategy=strategy,
        offload_optimizer=offload_optimizer,
        offload_params=offload_params,
        param_dtype=param_dtype,
        gpus_per_node=gpus_per_node,
        cuda_version=cuda_version,
        context_bytes=context_bytes,
        **keywords,
    )
    if loader is not None and plan.num_gpus > 1:
        raise ValueError(
            f"loader= checks that one machine feeds one card; this plan is over "
            f"{plan.num_gpus} cards: plan one card with loader=, or leave loader out"
        )
    timed = None
    if time or loader is not None:
        timed = _time(model, plan)
    host = None if machine is None else _host(model, plan, machine, loader, timed)
    return dataclasses.replace(plan, time=timed if time else None, host=host)


def _time(model: Any, plan: Plan) -> StepTime:
    """The planned step timed on the plan's card, or over its cards with their collectives."""
    timed = step_time(model, plan.gpu, plan.step)
    if plan.num_gpus == 1:
        return timed
    settings, step = plan.settings, plan.step
    strategy = settings.strategy or "ddp"  # a list of cards without a strategy replicates
    stored = stored_itemsize(step)
    gathered: float = stored
    if settings.param_dtype is not None:  # FSDP2 MixedPrecisionPolicy(param_dtype=...)
        gathered = parse_dtype(settings.param_dtype).itemsize
    updated = timed.trainable * gathered  # ZeRO all-gathers the parameters it updated
    link = link_of(plan.gpu)
    root, blocks = _fsdp_gathers(model, plan) if strategy == "fsdp" else (0.0, updated)
    collectives = comm_for(
        strategy,
        ranks=plan.num_gpus,
        link=link,
        grad_bytes=timed.trainable * stored,
        param_bytes=root + blocks,
        resident_bytes=root,
    )
    return data_parallel_time(
        timed,
        collectives,
        ranks=plan.num_gpus,
        accumulation=step.gradient_accumulation_steps,
        link=link,
    )


def _fsdp_gathers(model: Any, plan: Plan) -> tuple[float, float]:
    """Bytes FSDP gathers for one pass over the model, ``(root, blocks)``, each as stored.

    The root and each block as `torchfit.memory.plan.sharded.gathered_bytes` sizes them
    (a 4-bit block's packed codes, a prepared fp32 root, 16-bit ``param_dtype`` gathers).
    """
    spec = transformer_spec(model)
    if spec is None:  # per-rank plans need a transformer; kept for a direct call
        raise ValueError("strategy='fsdp' with time=True needs a transformers config")
    single = estimate(model, plan.step)
    root, unit = gathered_bytes(spec, plan.step, single.weights, plan.settings.param_dtype)
    return float(root), float(spec.num_layers * unit)


def _host(
    model: Any,
    plan: Plan,
    chosen: Machine | str,
    loader: LoaderReport | SampleCost | None,
    timed: StepTime | None,
) -> HostPlan:
    """The host's side of the planned step: the weights as it holds them, onto the card."""
    if isinstance(chosen, str) and chosen.strip().lower() == "this":
        chosen = this_machine()
    elif isinstance(chosen, str):
        chosen = machine(chosen)
    step = plan.step
    bits = None if step.quantization is None else parse_dtype(step.quantization).bits
    dtype = None if bits else ("fp32" if step.mixed else step.compute.value)
    return host_fits(
        model,
        chosen,
        dtype=dtype,
        bits=bits,
        device_map="cuda",
        cost=loader,
        batch_size=step.batch_size if loader is not None else None,
        step_seconds=timed.seconds if (loader is not None and timed is not None) else None,
    )
