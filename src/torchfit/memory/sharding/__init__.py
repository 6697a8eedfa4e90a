"""Per-rank memory of data-parallel training: DDP, ZeRO-1/2/3, FSDP2 and HSDP."""

from torchfit.memory.sharding.strategies import (
    Strategy,
    deepspeed_zero_bytes,
    min_gpus,
    parse_strategy,
    shard_estimate,
)

__all__ = [
    "Strategy",
    "deepspeed_zero_bytes",
    "min_gpus",
    "parse_strategy",
    "shard_estimate",
]
