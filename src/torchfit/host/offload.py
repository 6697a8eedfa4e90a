"""Host memory of state moved off the GPU: offloaded optimizer state, offloaded KV cache.

* ZeRO-Offload (DeepSpeed ``offload_optimizer``, ZeRO stages 1-3) keeps each rank's
  partition of the optimizer state *and* its fp32 master weights on the CPU, with an fp32
  gradient partition for the CPU optimizer step
  (``deepspeed/runtime/zero/stage_1_and_2.py``: with ``cpu_offload`` the
  ``single_partition_of_fp32_groups`` and their gradients live on ``"cpu"``). With
  ``offload_params`` (ZeRO-3's ``offload_param``, FSDP's ``CPUOffload(offload_params=True)``)
  the parameter shards and their gradients live there too (FSDP then steps the optimizer
  on the CPU, so its state is there as well). DeepSpeed pins these buffers
  (``pin_memory: true``): page-locked memory the kernel cannot page out.
* transformers' offloaded KV cache (``cache_implementation="offloaded"``,
  ``DynamicCache(offloading=True)``; ``cache_utils.py``, ``CacheLayerMixin.offload``) moves
  every layer's keys and values to the CPU with ``.to("cpu", non_blocking=True)`` after
  its update and brings the next layer back ahead of time. A non-blocking copy from the
  GPU lands in pinned memory (``aten/src/ATen/native/TensorConversions.cpp``,
  ``_to_copy``: ``pin_out = non_blocking && self.is_cuda() && options.device().is_cpu()``),
  from ``CachingHostAllocator``, which rounds each block up to a power of two.
"""

from __future__ import annotations

import math

from torchfit._core.units import DType, parse_dtype
from torchfit.memory import MemoryEstimate

__all__ = ["kv_offload_bytes", "optimizer_offload_bytes"]

_FP32 = 4


def optimizer_offload_bytes(
    estimate: MemoryEstimate,
    *,
    trainable_params: int,
    world_size: int = 1,
    ranks_per_node: int | None = None,
    offload_params: bool = False,
) -> int:
    """Host bytes one node needs for the state its ranks offload to the CPU.

    Args:
        estimate: The single-GPU estimate of the step (`torchfit.memory.estimate`): its
            ``optimizer`` bytes hold the optimizer state and any fp32 master weights.
        trainable_params: Parameters that train (they have state and gradients).
        world_size: Ranks sharing the state (ZeRO / FSDP shard over them).
        ranks_per_node: Ranks on one node (default: all of them).
        offload_params: Parameter shards (and their gradients) on the CPU too.

    Returns:
        Bytes per node: per rank ``optimizer / N + 4 * params / N`` (the fp32 gradient
        partition), plus ``(weights + gradients) / N`` with ``offload_params``, times the
        ranks on the node.

    Example:
        >>> est = MemoryEstimate(weights=2 * 10**9, gradients=2 * 10**9, optimizer=12 * 10**9)
        >>> optimizer_offload_bytes(est, trainable_params=10**9) / 1e9  # 1B params, AdamW
        16.0
        >>> optimizer_offload_bytes(est, trainable_params=10**9, world_size=8) / 1e9
        16.0
    """
    if world_size < 1 or trainable_params < 0:
        raise ValueError(
            f"world_size must be >= 1 and trainable_params >= 0; got {world_size}, "
            f"{trainable_params}"
        )
    per_node = min(ranks_per_node or world_size, world_size)
    per_rank = math.ceil(estimate.optimizer / world_size)
    per_rank += math.ceil(_FP32 * trainable_params / world_size)
    if offload_params:
        per_rank += math.ceil((estimate.weights + estimate.gradients) / world_size)
    return per_rank * per_node


def _pow2(nbytes: int) -> int:
    return 0 if nbytes <= 0 else 1 << math.ceil(math.log2(nbytes))


def kv_offload_bytes(
    *,
    batch_size: int,
    seq_len: int,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: str | DType = "bf16",
    resident_layers: int = 0,
) -> int:
    """Pinned host bytes of transformers' offloaded KV cache at ``seq_len`` positions.

    Every offloaded layer keeps its keys and its values on the CPU, each in a pinned
    block rounded up to a power of two (the caching host allocator also keeps blocks the
    shorter cache freed, so the pool can reach up to twice this as the cache grows).

    Args:
        batch_size: Sequences decoded together.
        seq_len: Positions cached (prompt and generated tokens).
        num_layers: Decoder layers.
        num_kv_heads: Key/value heads (``num_key_value_heads``).
        head_dim: Size of one head.
        dtype: The cache's dtype.
        resident_layers: Layers never offloaded (sliding-window layers kept on the GPU
            with ``offload_only_non_sliding``).

    Example:
        >>> # Llama-3.1-8B, one 32k-token sequence in bf16: 4 GiB, all 64 tensors powers of 2
        >>> kv_offload_bytes(batch_size=1, seq_len=32768, num_layers=32, num_kv_heads=8,
        ...                  head_dim=128) / 2**30
        4.0
    """
    for name, value in (("batch_size", batch_size), ("seq_len", seq_len),
                        ("num_layers", num_layers), ("num_kv_heads", num_kv_heads),
                        ("head_dim", head_dim)):  # fmt: skip
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1; got {value!r}")
    per_tensor = (
        batch_size * num_kv_heads * seq_len * head_dim * math.ceil(parse_dtype(dtype).itemsize)
    )
    offloaded = max(num_layers - resident_layers, 0)
    return 2 * offloaded * _pow2(per_tensor)
