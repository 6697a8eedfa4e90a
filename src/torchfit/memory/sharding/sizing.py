"""`deepspeed_zero_bytes` (DeepSpeed's own estimators) and `min_gpus` (fewest ranks that fit)."""

from __future__ import annotations

from torchfit._core import checks
from torchfit.memory.result import MemoryEstimate
from torchfit.memory.sharding.ranks import shard_estimate
from torchfit.memory.sharding.strategies import (
    DEFAULT_BUCKET_BYTES,
    SIZE_RULES,
    Strategy,
    check_count,
    check_world_size,
)

__all__ = ["WORLD_SIZES", "deepspeed_zero_bytes", "min_gpus"]

#: World sizes `min_gpus` tries, in order.
WORLD_SIZES: tuple[int, ...] = tuple(2**k for k in range(11))  # 1, 2, 4, ..., 1024


@checks.arguments(
    world_size=checks.whole(at_least=1, fix="use world_size=1 for a single GPU"),
    stage=checks.whole(at_least=1, at_most=3),
)
def deepspeed_zero_bytes(
    params: int,
    world_size: int,
    stage: int,
    *,
    largest_layer_params: int = 0,
    offload_optimizer: bool = False,
    offload_params: bool = False,
) -> int:
    """GPU bytes of model states per rank, as DeepSpeed's own estimators compute them.

    Mixed-precision Adam. Stage 1 follows the ZeRO paper (Rajbhandari et al. 2019,
    arXiv 1910.02054, Fig. 1: 2P + 2P + 12P/N; DeepSpeed has no stage-1 estimator).
    Stage 2 is ``estimate_zero2_model_states_mem_needs`` (deepspeed/runtime/zero/
    stage_1_and_2.py): 2P + 18P/N, or 2P with optimizer offload. Stage 3 is
    ``estimate_zero3_model_states_mem_needs`` (stage3.py): 4 x largest layer + 18P/N,
    + 2P/N with optimizer offload, + nothing more with parameter offload.

    Args:
        params: Total parameters P.
        world_size: Number of GPUs N.
        stage: 1, 2 or 3.
        largest_layer_params: Parameters of the largest module (stage 3).
        offload_optimizer: DeepSpeed ``offload_optimizer`` to the CPU.
        offload_params: DeepSpeed ``offload_param`` to the CPU (stage 3 only).

    Example:
        >>> deepspeed_zero_bytes(10**9, 8, 2) / 10**9  # 2P + 18P/8
        4.25
    """
    check_world_size(world_size)
    check_count("params", params)
    check_count("largest_layer_params", largest_layer_params)
    if offload_params and stage != 3:
        raise ValueError(f"offload_params needs ZeRO stage 3; got stage={stage}")
    p, n = params, world_size
    if stage == 1:
        return 2 * p + 2 * p + (0 if offload_optimizer else int(12 * p / n))
    if stage == 2:
        return 2 * p if offload_optimizer else 2 * p + int(18 * p / n)
    largest = 4 * largest_layer_params
    if offload_params:
        return largest
    if offload_optimizer:
        return largest + int(2 * p / n)
    return largest + int(18 * p / n)


@checks.arguments(
    gpu_memory_bytes=checks.whole(at_least=1),
    **SIZE_RULES,
)
def min_gpus(
    estimate: MemoryEstimate,
    gpu_memory_bytes: int,
    *,
    strategy: str | Strategy,
    params: int,
    backward_start: MemoryEstimate | None = None,
    largest_layer_params: int = 0,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    reshard_after_forward: bool = True,
    offload_optimizer: bool = False,
    offload_params: bool = False,
    param_bytes: float = 4,
    grad_bytes: float = 4,
    autocast_copies: int = 0,
    root_bytes: int = 0,
    root_trainable_params: int = 0,
    root_head_params: int | None = None,
    unit_bytes: int | None = None,
) -> int | None:
    """The smallest world size in 1, 2, 4, ..., 1024 whose per-rank estimate fits.

    A rank fits when `shard_estimate`'s ``device_total`` (allocated bytes plus the CUDA
    context) is at most ``gpu_memory_bytes``. Replicating strategies (single, DDP) fit
    at every N or at none, so they answer 1 or ``None``.

    Args:
        estimate: Single-GPU estimate at the per-rank batch size.
        gpu_memory_bytes: Memory of one GPU, in bytes.
        strategy: See `shard_estimate`; the other keywords are passed on to it.
        params: Parameters that train.
        backward_start: The start-of-backward moment (see `shard_estimate`).
        largest_layer_params: Parameters of the largest sharded unit.
        bucket_bytes: Gradient bucket size.
        reshard_after_forward: FSDP2 option (see `shard_estimate`).
        offload_optimizer: Optimizer state on the CPU.
        offload_params: Parameter shards on the CPU.
        param_bytes: Bytes per gathered parameter.
        grad_bytes: Bytes per gradient element.
        autocast_copies: Autocast weight copies in the estimate (see `shard_estimate`).
        root_bytes: The root unit's gathered bytes (see `shard_estimate`).
        root_trainable_params: The root's parameters that train (see `shard_estimate`).
        root_head_params: Of those, the output head's (see `shard_estimate`).
        unit_bytes: The largest other unit's gathered bytes (see `shard_estimate`).

    Returns:
        The world size, or ``None`` when even 1024 ranks do not fit.

    Example:
        >>> single = MemoryEstimate(weights=4_000, gradients=4_000, optimizer=8_000)
        >>> min_gpus(single, 6_000, strategy="fsdp", params=1_000, bucket_bytes=0)
        4
        >>> min_gpus(single, 6_000, strategy="ddp", params=1_000) is None
        True
    """
    if gpu_memory_bytes <= 0:
        raise ValueError(f"gpu_memory_bytes must be > 0; got {gpu_memory_bytes!r}")
    for n in WORLD_SIZES:
        rank = shard_estimate(
            estimate,
            strategy=strategy,
            backward_start=backward_start,
            world_size=n,
            params=params,
            largest_layer_params=largest_layer_params,
            bucket_bytes=bucket_bytes,
            reshard_after_forward=reshard_after_forward,
            offload_optimizer=offload_optimizer,
            offload_params=offload_params,
            param_bytes=param_bytes,
            grad_bytes=grad_bytes,
            autocast_copies=autocast_copies,
            root_bytes=root_bytes,
            root_trainable_params=root_trainable_params,
            root_head_params=root_head_params,
            unit_bytes=unit_bytes,
        )
        if rank.device_total <= gpu_memory_bytes:
            return n
    return None
