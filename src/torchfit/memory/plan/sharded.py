"""A plan under a data-parallel strategy: the per-rank estimate `fits` gives.

DDP, ZeRO and FSDP/HSDP (`torchfit.memory.sharding.shard_estimate`) split the model
states of one rank's step; the start of backward is estimated as its own moment, and an
FSDP2 ``MixedPrecisionPolicy`` with a 16-bit ``param_dtype`` gathers 16-bit parameters.
"""

from __future__ import annotations

import math
from typing import Any

from torchfit._core.units import DType, parse_dtype
from torchfit.memory import knobs
from torchfit.memory.analytic.lora import lora_parameters
from torchfit.memory.analytic.loraconfig import lora_setup
from torchfit.memory.analytic.quantized import linear_bytes
from torchfit.memory.analytic.transformer import adapters_only
from torchfit.memory.estimator import estimate
from torchfit.memory.plan.settings import Settings, transformer_spec
from torchfit.memory.result import MemoryEstimate
from torchfit.memory.sharding import parse_strategy

__all__ = ["gathered_bytes", "per_rank", "shard_param_dtype", "stored_itemsize"]


def shard_param_dtype(param_dtype: str | DType | None, strategy: str | None) -> str | None:
    """FSDP2's MixedPrecisionPolicy param dtype, checked: 16-bit, and only with FSDP."""
    if param_dtype is None:
        return None
    kind = None if strategy is None else parse_strategy(strategy).value
    chosen = parse_dtype(param_dtype)
    if kind not in {"fsdp", "hsdp"} or chosen not in {DType.BF16, DType.FP16}:
        raise ValueError(
            f"param_dtype={str(param_dtype)!r} with strategy={strategy!r}: param_dtype is "
            "FSDP2's MixedPrecisionPolicy(param_dtype=...), 'bf16' or 'fp16', with "
            "strategy='fsdp'; drop it, or pass strategy='fsdp'"
        )
    return str(chosen.value)


def per_rank(model: Any, settings: Settings, single: MemoryEstimate) -> MemoryEstimate:
    """The per-rank estimate under a data-parallel strategy (`shard_estimate`)."""
    from torchfit.memory.sharding import shard_estimate  # noqa: PLC0415

    spec = transformer_spec(model)
    if spec is None or settings.strategy is None:
        raise ValueError("strategy= needs a transformers config or a catalog name")
    # the start of backward as its own moment: activations alive, no gradients yet
    # (trainable_params=1 keeps gradients out; the saved tensors stay those of the real run)
    step = settings.step
    trainable = step.trainable_params
    adapters = step.wants_lora or (step.training and step.quantization is not None)
    if adapters:
        # LoRA adapters train (a 4/8-bit base trains through PEFT's default ones): count
        # them, and take the moment with the adapters' fields replaced by that count
        setup = knobs.lora_of(
            spec, step.lora, step.lora_rank, step.lora_targets, step.lora_dropout
        ) or lora_setup(spec)
        trainable = lora_parameters(spec, setup)
        plain = {"lora": None, "lora_rank": None, "lora_targets": None, "lora_dropout": None}
        start = estimate(model, step.replace(**plain, trainable_params=1, frozen_base=True))
    else:
        adapters = adapters_only(trainable, spec.num_params)
        start = estimate(model, step.replace(trainable_params=1, frozen_base=adapters))
    # a unit's gradients in flight: a block's adapters on a frozen base, else its weights;
    # the root (embeddings, head) trains in a full fine-tune only
    root = spec.embedding_params + spec.head_params
    block = (spec.num_params - root) // spec.num_layers
    unit_trainable, root_trainable = block, root
    head = spec.head_params or spec.embedding_params  # a tied head is the embedding
    if adapters and trainable is not None:
        unit_trainable, root_trainable, head = math.ceil(trainable / spec.num_layers), 0, 0
    stored = stored_itemsize(step)
    root_bytes, unit_bytes = gathered_bytes(spec, step, single.weights, settings.param_dtype)
    sharded = shard_estimate(
        single,
        strategy=settings.strategy,
        backward_start=start,
        world_size=settings.world_size,
        params=trainable or spec.num_params,
        largest_layer_params=block,
        unit_trainable_params=unit_trainable,
        root_bytes=root_bytes,
        root_trainable_params=root_trainable,
        root_head_params=head,
        unit_bytes=unit_bytes,
        offload_optimizer=settings.offload_optimizer,
        offload_params=settings.offload_params,
        gpus_per_node=settings.gpus_per_node,
        **{"param_bytes": stored, "grad_bytes": stored, **_policy(spec, settings)},
    )
    if settings.param_dtype is None:
        return sharded
    policy = f"FSDP2 MixedPrecisionPolicy(param_dtype={settings.param_dtype}): 16-bit gathers"
    return sharded.replace(notes=(*sharded.notes, policy))


def gathered_bytes(spec: Any, step: Any, weights: int, param_dtype: str | None) -> tuple[int, int]:
    """Bytes of the root unit (embeddings, head) and of one block, as FSDP gathers them.

    Each block is a unit and the root holds the rest, as accelerate's transformer-layer
    wrap does. Each unit is gathered as stored: the root in the dtype of the base's other
    parameters (fp32 after ``prepare_model_for_kbit_training``, a frozen base's
    ``base_dtype``, fp32 master weights under autocast), a block as its share of what is
    left of the single-GPU ``weights`` (4-bit Linears with their scales, norms, adapters).
    A 16-bit ``MixedPrecisionPolicy`` (``param_dtype``) gathers 2 bytes a parameter, and
    a 4-bit block's packed codes as they are.
    """
    root = spec.embedding_params + spec.head_params
    if step.quantization is not None:
        rest = 4 if step.kbit_prepared else int(step.compute.itemsize)
        head = spec.head_params * rest
        if step.quantize_head:
            fmt = parse_dtype(step.quantization)
            head = linear_bytes([(spec.vocab, spec.hidden)], fmt, double_quant=step.double_quant)
        root_bytes = spec.embedding_params * rest + head
    else:
        base = step.base_dtype
        rest = int(parse_dtype(base).itemsize) if base is not None else stored_itemsize(step)
        root_bytes = root * rest
    block = max(0, math.ceil((weights - root_bytes) / spec.num_layers))
    if param_dtype is None:
        return root_bytes, block
    if step.quantization is None:
        block = 2 * ((spec.num_params - root) // spec.num_layers)
    return 2 * root, block


def stored_itemsize(step: Any) -> int:
    """Bytes of a parameter (and of its gradient) as the step holds it.

    fp32 master weights under autocast, the compute dtype under a ``*-true`` precision:
    what FSDP gathers, DDP's buckets copy and the collectives send.
    """
    return 4 if step.mixed else int(step.compute.itemsize)


def _policy(spec: Any, settings: Settings) -> dict[str, Any]:
    """shard_estimate's arguments for a 16-bit FSDP2 MixedPrecisionPolicy (none without)."""
    if settings.param_dtype is None:
        return {}
    from torchfit.memory.analytic.model_states import model_state_bytes  # noqa: PLC0415

    copies = model_state_bytes(
        params=spec.num_params,
        dtype=settings.step.compute,
        mixed_precision=True,
        autocast_params=spec.autocast_params,
    ).autocast_copies
    # gathered 16-bit parameters feed autocast 16-bit tensors: its weight copies go away
    return {"param_bytes": 2, "autocast_copies": copies}
