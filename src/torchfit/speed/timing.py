"""`step_time`: one step's kernels (`workload`) timed on a card (`roofline`)."""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

import torch

from torchfit._core import checks
from torchfit._core.step import Mode, parse_mode, parse_optimizer, resolve_numerics
from torchfit._core.units import DType, parse_dtype
from torchfit.memory.gpus import GPU, gpu
from torchfit.memory.knobs import ESTIMATE_RULES, check_generation
from torchfit.speed.build import build_step_model
from torchfit.speed.cards import peaks
from torchfit.speed.dispatch import host_seconds
from torchfit.speed.ops import OpKind, Phase
from torchfit.speed.optimizer import OPTIMIZER_IMPLEMENTATIONS
from torchfit.speed.result import KindTime, StepTime
from torchfit.speed.roofline import kernel_seconds, math_of
from torchfit.speed.workload import Workload, add_lora, hold_quantized_in, record_workload

__all__ = ["NOT_MODELLED", "step_time", "time_workload"]

#: What the prediction leaves out; every `StepTime` carries these in its notes.
NOT_MODELLED = (
    "not modelled: Python work outside ATen ops (generate's loop, a library's own "
    "Python), torch.compile and CUDA graphs, data loading and host-to-device copies, "
    "communication between GPUs, clock throttling"
)
#: The keywords `step_time` shares with `estimate`, checked by the same rules.
_SHARED_RULES = frozenset(
    {
        "batch_size",
        "seq_len",
        "input_shape",
        "attn_implementation",
        "gradient_accumulation_steps",
        "max_new_tokens",
        "lora_rank",
        "lora_dropout",
        "base_dtype",
    }
)
_TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
_COMPUTE_KINDS = (OpKind.MATMUL, OpKind.CONV, OpKind.ATTENTION)


def _torch_dtype(dtype: DType) -> torch.dtype:
    return getattr(torch, _TORCH_DTYPES[dtype.value])  # type: ignore[no-any-return]


def _lora_config(
    lora: Any, rank: int | None, targets: Any, dropout: float | None, config: Any
) -> Any:
    if lora is not None:
        return lora
    import peft  # noqa: PLC0415 - optional: only LoRA timing needs it

    return peft.LoraConfig(
        r=rank or 8,
        target_modules=targets,
        lora_dropout=dropout or 0.0,
        task_type="CAUSAL_LM",
        # GPT-2's Conv1D stores its weight transposed; PEFT wants to be told
        fan_in_fan_out=getattr(config, "model_type", "") == "gpt2",
    )


def time_workload(work: Workload, card: GPU, *, compute: str, checkpointing: bool) -> StepTime:
    """Time every kernel of ``work`` on ``card`` and sum (kernels run one after another).

    A phase whose kernels the host dispatches slower than the GPU runs them takes the
    host's time (`torchfit.speed.dispatch`); the difference is a ``"host"`` row.

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
    for op in work.ops:
        row = rows[(op.kind.value, op.phase.value)]
        row[0] += kernel_seconds(op, ceilings, hopper=hopper) * op.count
        row[1] += op.flops * op.count
        row[2] += op.bytes * op.count
        row[3] += op.count
    breakdown = tuple(
        KindTime(kind, phase, s, f, b, int(n)) for (kind, phase), (s, f, b, n) in rows.items()
    )
    train = any(op.phase is Phase.BACKWARD for op in work.ops)
    for phase, host in host_seconds(work.ops, train=train).items():
        gpu_s = sum(r.seconds for r in breakdown if r.phase == phase.value)
        if host > gpu_s:  # the GPU waits for the host's launches
            breakdown += (KindTime("host", phase.value, host - gpu_s, 0.0, 0.0, 0),)
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
    )


@checks.arguments(
    **{k: v for k, v in ESTIMATE_RULES.items() if k in _SHARED_RULES},
    optimizer_implementation=checks.one_of(*OPTIMIZER_IMPLEMENTATIONS),
)
def step_time(
    model: Any,
    gpu_name: str | GPU,
    *,
    batch_size: int,
    seq_len: int | None = None,
    input_shape: tuple[int, ...] | None = None,
    dtype: str | DType | None = None,
    precision: str | None = None,
    mode: str = "train",
    optimizer: str | None = "adamw",
    optimizer_implementation: str = "foreach",
    gradient_checkpointing: bool = False,
    attn_implementation: str = "sdpa",
    gradient_accumulation_steps: int = 1,
    lora: Any = None,
    lora_rank: int | None = None,
    lora_targets: str | Sequence[str] | None = None,
    lora_dropout: float | None = None,
    base_dtype: str | DType | None = None,
    max_new_tokens: int | None = None,
    channels_last: bool = False,
) -> StepTime:
    """Predict how long one step takes on a card, before running it.

    The step is recorded kernel by kernel on fake tensors (nothing is allocated; the
    model is built on the meta device), each kernel is timed on the card's roofline
    with efficiencies from published measurements, and the times are added. The
    keywords are `torchfit.memory.estimate`'s.

    Args:
        model: What `torchfit.memory.estimate` takes: a catalog name, Hub id, config,
            ``"torchvision/<name>"`` or an ``nn.Module`` (with ``input_shape``).
        gpu_name: A card name (``"H100"``, ``"RTX 4090"``) or a `torchfit.memory.GPU`.
        batch_size: Samples per micro-batch.
        seq_len: Tokens per sample (language models; default the model's maximum).
        input_shape: One sample's shape for image models, e.g. ``(3, 224, 224)``.
        dtype: Compute dtype (``"fp32"``, ``"bf16"``, ``"fp16"``), or a quantized base
            (``"nf4"``, ``"int8"``: QLoRA, dequantized before every matmul).
        precision: Lightning's names: ``"32-true"``, ``"bf16-mixed"``, ``"bf16-true"``,
            ``"16-mixed"`` (adds GradScaler's unscale), ``"16-true"``.
        mode: ``"train"`` (forward, backward, optimizer) or ``"inference"`` (forward).
        optimizer: ``"adamw"``, ``"adam"``, ``"sgd"``, ``"sgd-momentum"``,
            ``"adamw-8bit"``, ``"lion"``, ``"adafactor"`` or None.
        optimizer_implementation: ``"foreach"`` (PyTorch's default on CUDA), ``"fused"``
            (``fused=True``) or ``"loop"`` (``foreach=False``).
        gradient_checkpointing: transformers' checkpointing: each block's forward runs
            again in backward.
        attn_implementation: ``"sdpa"`` (and ``"flash"``, the same kernel) or ``"eager"``
            (scores materialized).
        gradient_accumulation_steps: Micro-batches per optimizer step.
        lora: A ``peft.LoraConfig``; or ``lora_rank``/``lora_targets``/``lora_dropout``.
        lora_rank: Adapter rank (PEFT's default targets when ``lora_targets`` is None).
        lora_targets: Module names to adapt, or ``"all-linear"``.
        lora_dropout: Adapter dropout.
        base_dtype: The dtype a frozen base is held in under ``*-mixed`` precision
            (default: fp32, as the model is built).
        max_new_tokens: Inference is ``generate``: a ``seq_len`` prompt, then this many
            decoding steps with a KV cache (GPU time only; see the notes).
        channels_last: An image model trained in ``torch.channels_last`` memory format
            (NHWC): its tensor-core convolutions need no NCHW transposes.

    Returns:
        A `StepTime`: seconds, samples and tokens per second, MFU, the breakdown.

    Raises:
        ValueError: a bad size, unknown card, dtype, precision, optimizer or mode, or
            settings that contradict each other; the message says which and the fix.
        TypeError: a value of the wrong kind.

    Example:
        >>> t = step_time("gpt2", "H100", batch_size=8, seq_len=1024, precision="bf16-mixed")
        >>> 0.02 < t.seconds < 0.2, t.tokens
        (True, 8192)
    """
    card = gpu(gpu_name)
    chosen_mode = parse_mode(mode)
    train = chosen_mode is Mode.TRAIN
    check_generation(max_new_tokens, mode=mode, use_cache=None)
    numerics = resolve_numerics(precision=precision, dtype=dtype, mixed_precision=None)
    weights = numerics.weights
    mixed = numerics.mixed if numerics.mixed is not None else (train and weights.bits == 16)
    compute = numerics.compute
    build_dtype = DType.FP32 if mixed else weights
    if weights.is_quantized:
        # PEFT's prepare_model_for_kbit_training (the QLoRA recipe) casts every parameter
        # bitsandbytes left unquantized to fp32 (peft/utils/other.py); without it (or for
        # inference) the model is held in the compute dtype
        build_dtype = DType.FP32 if train and mixed else compute
    if base_dtype is not None and mixed:
        build_dtype = parse_dtype(base_dtype)
    built = build_step_model(
        model,
        batch_size=batch_size,
        seq_len=seq_len,
        input_shape=input_shape,
        dtype=_torch_dtype(build_dtype),
        attention=attn_implementation,
        train=train,
        checkpointing=gradient_checkpointing,
        channels_last=channels_last,
    )
    if weights.is_quantized:  # dequantized, the 4/8-bit weights are compute-dtype tensors
        hold_quantized_in(built.module, _torch_dtype(compute))
    wants_lora = any(v is not None for v in (lora, lora_rank, lora_targets, lora_dropout))
    if wants_lora or (weights.is_quantized and train):
        add_lora(built, _lora_config(lora, lora_rank, lora_targets, lora_dropout, built.config))
    opt = parse_optimizer(optimizer) if train and optimizer is not None else None
    work = record_workload(
        built,
        train=train,
        autocast=_torch_dtype(compute) if mixed and compute.bits == 16 else None,
        weights=weights,
        optimizer=opt,
        implementation=optimizer_implementation,
        state_bytes=4 if mixed or build_dtype is DType.FP32 else 2,
        accumulation=gradient_accumulation_steps if train else 1,
        batch_size=batch_size,
        new_tokens=max_new_tokens,
        grad_scaler=train and mixed and compute is DType.FP16,
    )
    how = "mixed" if mixed else "true"
    notes: tuple[str, ...] = (
        (
            f"recorded kernel by kernel on fake tensors ({how} {compute.value}, "
            f"{'train' if train else 'inference'}, attention {attn_implementation})"
        ),
    )
    if max_new_tokens:
        notes += (
            (
                "generate: prefill plus decoding steps timed on the GPU alone; transformers' "
                "generate loop is usually bound by Python on the host, often several times this"
            ),
        )
    work = Workload(**{**work.__dict__, "notes": notes + work.notes})
    return time_workload(
        work, card, compute=compute.value, checkpointing=gradient_checkpointing and train
    )
