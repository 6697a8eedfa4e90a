"""`step_time`: one step's kernels (`workload`) timed on a card (`roofline`)."""

from __future__ import annotations

import collections
from typing import Any

import torch

from torchfit._core import checks
from torchfit._core.imports import require
from torchfit._core.step import parse_optimizer
from torchfit._core.units import DType, parse_dtype
from torchfit.memory.gpus import GPU, gpu
from torchfit.memory.step import Step
from torchfit.memory.step.entry import card_step
from torchfit.speed.build import build_step_model
from torchfit.speed.cards import peaks
from torchfit.speed.dispatch import SYNCHRONIZED, host_seconds, serial_host_seconds
from torchfit.speed.ops import OpKind, Phase
from torchfit.speed.result import KindTime, StepTime
from torchfit.speed.roofline import kernel_seconds, math_of
from torchfit.speed.workload import Workload, add_lora, hold_quantized_in, record_workload

__all__ = ["NOT_MODELLED", "step_time", "time_workload"]

#: What a one-card prediction leaves out, by name; a data-parallel step's time models
#: ``"communication"`` (`torchfit.speed.comm`).
UNMODELLED: dict[str, str] = {
    "python": "Python work outside ATen ops (generate's loop, a library's own Python)",
    "compile": "torch.compile and CUDA graphs",
    "input": "data loading and host-to-device copies",
    "communication": "communication between GPUs",
    "clocks": "clock throttling",
}


def not_modelled(*, modelled: frozenset[str] = frozenset()) -> str:
    """The note of what a prediction leaves out, less what it ``modelled`` (`UNMODELLED`)."""
    return "not modelled: " + ", ".join(v for k, v in UNMODELLED.items() if k not in modelled)


#: What the prediction leaves out; every one-card `StepTime` carries it in its notes.
NOT_MODELLED = not_modelled()
_TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
_COMPUTE_KINDS = (OpKind.MATMUL, OpKind.CONV, OpKind.ATTENTION)


def _torch_dtype(dtype: DType) -> torch.dtype:
    return getattr(torch, _TORCH_DTYPES[dtype.value])  # type: ignore[no-any-return]


def _lora_config(step: Step, config: Any) -> Any:
    """The step's ``peft.LoraConfig``: given, or from its rank, targets and dropout."""
    if step.lora is not None:
        return step.lora
    peft = require("peft", feature="timing LoRA adapters")
    targets = step.lora_targets
    return peft.LoraConfig(
        r=step.lora_rank or 8,
        target_modules=list(targets) if isinstance(targets, tuple) else targets,
        lora_dropout=step.lora_dropout or 0.0,
        task_type="CAUSAL_LM",
        # GPT-2's Conv1D stores its weight transposed; PEFT wants to be told
        fan_in_fan_out=getattr(config, "model_type", "") == "gpt2",
    )


def time_workload(work: Workload, card: GPU, *, compute: str, checkpointing: bool) -> StepTime:
    """Time every kernel of ``work`` on ``card`` and sum (kernels run one after another).

    A phase whose kernels the host dispatches slower than the GPU runs them takes the
    host's time, and a kernel the host waits for adds the host's work around it
    (`torchfit.speed.dispatch`); what the GPU waits is a ``"host"`` row.

    Example:
        >>> from torchfit.speed.ops import Op
        >>> w = Workload((Op("mm", OpKind.MATMUL, Phase.FORWARD, 2 * 4096**3, 1e8, "bf16",
        ...               (1, 4096, 4096, 4096)),), 1, None, 0, 0, "mm", ())
        >>> round(time_workload(w, gpu("H100"), compute="bf16", checkpointing=False).seconds * 1e6)
        179
    """
    ceilings = peaks(card)
    hopper = card.architecture == "Hopper"
    rows: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    overlapped = dict.fromkeys(Phase, 0.0)  # GPU seconds the host's launches can hide behind
    for op in work.ops:
        if op.kind is OpKind.PYTHON:  # host time only (`host_seconds`)
            continue
        row = rows[(op.kind.value, op.phase.value)]
        seconds = kernel_seconds(op, ceilings, hopper=hopper) * op.count
        row[0] += seconds
        row[1] += op.flops * op.count
        row[2] += op.bytes * op.count
        row[3] += op.count
        overlapped[op.phase] += 0.0 if op.backend == SYNCHRONIZED else seconds
    breakdown = tuple(
        KindTime(kind, phase, s, f, b, int(n)) for (kind, phase), (s, f, b, n) in rows.items()
    )
    train = any(op.phase is Phase.BACKWARD for op in work.ops)
    serial = serial_host_seconds(work.ops)
    for phase, host in host_seconds(work.ops, train=train).items():
        # the GPU waits for the host's launches where they are slower, and for all of
        # the host's work around a kernel the host waits for
        waiting = max(0.0, host - overlapped[phase]) + serial[phase]
        if waiting > 0:
            breakdown += (KindTime("host", phase.value, waiting, 0.0, 0.0, 0),)
    compute_kinds = {kind.value for kind in _COMPUTE_KINDS}
    flops = {
        phase: sum(r.flops for r in breakdown if r.phase == phase.value and r.kind in compute_kinds)
        for phase in Phase
    }
    model_flops = flops[Phase.FORWARD] + flops[Phase.BACKWARD]
    # MFU's denominator: the peak of the units the most FLOPs run on (an fp32 CNN's
    # convolutions run on TF32 tensor cores, its few matmuls on CUDA cores)
    heaviest = max(
        (op for op in work.ops if op.kind in _COMPUTE_KINDS),
        key=lambda op: op.flops * op.count,
        default=None,
    )
    peak = ceilings.dense_peak(compute if heaviest is None else math_of(heaviest, ceilings))
    if checkpointing:  # recomputation repeats (about) the forward inside backward
        model_flops -= flops[Phase.FORWARD]
    notes = (*work.notes, *ceilings.notes, NOT_MODELLED)
    return StepTime(
        model=work.name,
        gpu=card.name,
        seconds=sum(r.seconds for r in breakdown),
        samples=work.samples,
        tokens=work.tokens,
        model_flops=model_flops,
        peak_flops=peak,
        breakdown=breakdown,
        notes=notes,
        parameters=work.parameters,
        trainable=work.trainable,
    )


@checks.arguments()
def step_time(
    model: Any,
    gpu_name: str | GPU,
    step: Step | None = None,
    *,
    channels_last: bool = False,
    **keywords: Any,
) -> StepTime:
    """Predict how long one step takes on a card, before running it.

    The step is recorded kernel by kernel on fake tensors (nothing is allocated; the
    model is built on the meta device), each kernel is timed on the card's roofline
    with efficiencies from published measurements, and the times are added.

    The step is the one `torchfit.fits` plans: a `torchfit.Step`, or its fields as
    keywords (``batch_size=8, seq_len=1024, precision="bf16-mixed"``...). Without a
    ``precision`` the card picks bf16 or fp16, as `fits` does. What the kernels do
    not depend on (``set_to_none``, ``keep_output``) is memory's alone (``fp32_output``
    adds the loop's cast of the outputs and a loss in fp32); the optimizer
    names its implementation (``"adamw-fused"``, ``"adamw-for-loop"``; foreach, CUDA's
    default, otherwise), and ``optimizer_in_backward`` steps one parameter at a time.

    Args:
        model: What `torchfit.memory.estimate` takes: a catalog name, Hub id, config,
            ``"torchvision/<name>"`` or an ``nn.Module`` (with ``input_shape``).
        gpu_name: A card name (``"H100"``, ``"RTX 4090"``) or a `torchfit.memory.GPU`.
        step: The step, a `torchfit.Step`; or give its fields as ``keywords``.
        channels_last: An image model trained in ``torch.channels_last`` memory format
            (NHWC): its tensor-core convolutions need no NCHW transposes.
        **keywords: The step's fields, as `torchfit.estimate` takes them.

    Returns:
        A `StepTime`: seconds, samples and tokens per second, MFU, the breakdown.

    Raises:
        ValueError: a bad size, unknown card, dtype, precision, optimizer or mode,
            settings that contradict each other, or a step the timing cannot express
            (a CPU step, a count of trainable parameters); the message
            says which and the fix.
        TypeError: a value of the wrong kind, an unknown keyword, a `Step` and
            keywords together.

    Example:
        >>> t = step_time("gpt2", "H100", batch_size=8, seq_len=1024, precision="bf16-mixed")
        >>> 0.02 < t.seconds < 0.2, t.tokens
        (True, 8192)
        >>> from torchfit import Step
        >>> step_time("gpt2", "H100", Step(batch_size=8, seq_len=1024,
        ...                               precision="bf16-mixed")).seconds == t.seconds
        True
    """
    if "optimizer_implementation" in keywords:
        raise TypeError(
            f"optimizer_implementation={keywords['optimizer_implementation']!r}: the "
            "optimizer names its implementation: optimizer='adamw-fused' or 'adamw-for-loop' "
            "(foreach, CUDA's default, otherwise)"
        )
    card = gpu(gpu_name)
    chosen = card_step(step, keywords, card, where="step_time(model, gpu, step)", model=model)
    _refuse_untimed(chosen)
    train = chosen.training
    numerics = chosen.numerics
    weights, compute, mixed = numerics.weights, chosen.compute, chosen.mixed
    build_dtype = DType.FP32 if mixed else weights
    if weights.is_quantized:
        # PEFT's prepare_model_for_kbit_training (the QLoRA recipe) casts every parameter
        # bitsandbytes left unquantized to fp32 (peft/utils/other.py); without it (or for
        # inference) the model is held in the compute dtype
        build_dtype = DType.FP32 if train and mixed and chosen.kbit_prepared else compute
    if chosen.base_dtype is not None and mixed:
        build_dtype = parse_dtype(chosen.base_dtype)
    built = build_step_model(
        model,
        batch_size=chosen.batch_size,
        seq_len=chosen.seq_len,
        input_shape=chosen.input_shape,
        dtype=_torch_dtype(build_dtype),
        attention=chosen.attn_implementation,
        train=train,
        checkpointing=chosen.gradient_checkpointing,
        channels_last=channels_last,
    )
    matmul = None if chosen.bnb_compute_dtype is None else parse_dtype(chosen.bnb_compute_dtype)
    if weights.is_quantized:  # dequantized, the 4/8-bit weights are compute-dtype tensors
        hold_quantized_in(built.module, _torch_dtype(matmul or compute), head=chosen.quantize_head)
    if chosen.wants_lora or (weights.is_quantized and train):
        add_lora(built, _lora_config(chosen, built.config))
    opt = parse_optimizer(chosen.optimizer) if train and chosen.optimizer is not None else None
    work = record_workload(
        built,
        train=train,
        autocast=_torch_dtype(compute) if mixed and compute.bits == 16 else None,
        weights=weights,
        optimizer=opt,
        # torchtune's optimizer-in-backward steps each parameter alone, as a loop does
        implementation="loop" if chosen.optimizer_in_backward else "foreach",
        state_bytes=4 if mixed or build_dtype is DType.FP32 else 2,
        accumulation=chosen.gradient_accumulation_steps if train else 1,
        batch_size=chosen.batch_size,
        new_tokens=chosen.max_new_tokens,
        grad_scaler=train and mixed and compute is DType.FP16,
        matmul=None if matmul is None else _torch_dtype(matmul),
        quantized_head=chosen.quantize_head and weights.is_quantized,
        fp32_output=train and chosen.fp32_output,
    )
    work = Workload(**{**work.__dict__, "notes": _notes(chosen) + work.notes})
    return time_workload(
        work, card, compute=compute.value, checkpointing=chosen.gradient_checkpointing and train
    )


def _refuse_untimed(step: Step) -> None:
    """A field whose effect on the kernels the timing cannot say is an error, not ignored."""
    if step.trainable_params is not None:
        raise ValueError(
            f"Step(trainable_params={step.trainable_params}): a count does not say which "
            "weights get gradients, so their kernels cannot be timed; describe the adapters "
            "(lora=LoraConfig(...) or lora_rank=...) or leave trainable_params out"
        )
    if step.frozen_base and not step.wants_lora:
        raise ValueError(
            "Step(frozen_base=True) without adapters: the timing needs to know what trains; "
            "give lora=LoraConfig(...) or lora_rank=..., or leave frozen_base out"
        )


def _notes(step: Step) -> tuple[str, ...]:
    """How the step was recorded, and what of it changes memory only."""
    how = "mixed" if step.mixed else "true"
    notes: tuple[str, ...] = (
        (
            f"recorded kernel by kernel on fake tensors ({how} {step.compute.value}, "
            f"{step.mode}, attention {step.attn_implementation})"
        ),
    )
    if step.bnb_compute_dtype:
        notes += (
            (
                f"4-bit layers compute in {step.bnb_compute_dtype} (bnb_4bit_compute_dtype): "
                "their input cast to it, their weight dequantized into it, their matmul in "
                "it, their output cast back"
            ),
        )
    if step.loss_chunk_size:
        notes += (
            (
                f"loss in chunks of {step.loss_chunk_size} positions timed as one loss: the "
                "same FLOPs, a smaller logits tensor"
            ),
        )
    if step.max_new_tokens:
        notes += (
            (
                "generate: prefill plus decoding steps timed on the GPU alone; transformers' "
                "generate loop is usually bound by Python on the host, often several times this"
            ),
        )
    return notes
