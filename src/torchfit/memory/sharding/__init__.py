"""Per-rank memory of data-parallel training: DDP, ZeRO-1/2/3, FSDP2 and HSDP.

`shard_estimate` turns a single-GPU `MemoryEstimate` into what one rank of ``N`` holds.
Activations, KV cache and the step's other transients stay per rank: they depend on the
per-rank batch, which data parallelism does not split. Model states (weights, gradients,
optimizer state) are what the strategies replicate or shard (see `Strategy`).
"""

from torchfit.memory.sharding.ranks import shard_estimate
from torchfit.memory.sharding.sizing import deepspeed_zero_bytes, min_gpus
from torchfit.memory.sharding.strategies import Strategy, parse_strategy

__all__ = ["Strategy", "deepspeed_zero_bytes", "min_gpus", "parse_strategy", "shard_estimate"]
