"""Strategies of data-parallel training, and what each one replicates or shards per rank.

`shard_estimate` turns a single-GPU `MemoryEstimate` into what one rank of ``N`` holds.
Activations, KV cache and the step's other transients stay per rank: they depend on the
per-rank batch, which data parallelism does not split. Model states (weights, gradients,
optimizer state) are what the strategies replicate or shard:

============  ==========================  ===========================  ==================
strategy      weights                     gradients                    optimizer state
============  ==========================  ===========================  ==================
single        W                           G                            O
DDP           W                           G + flat bucket buffer       O
ZeRO-1        W                           G + flat bucket buffer       O / N
ZeRO-2        W                           G / N + one bucket           O / N
ZeRO-3/FSDP   W / N + 2 gathered units    G / N + 2 units in flight    O / N
HSDP          as FSDP with N = GPUs per node (sharded in a node, replicated across nodes)
============  ==========================  ===========================  ==================

FSDP's gathered units and gradients in flight exist in forward and backward only: at the
optimizer step a rank holds bare shards. Its peak is the start of backward (activations)
or the end of backward (all gradient shards); ``reshard_after_forward=False`` gathers
every unit at the start of backward, the backward-time footprint of ZeRO-2 (FSDP1's
``SHARD_GRAD_OP``). Measured on CPU ranks (gloo and the fake process group, 2 and 4
ranks: tests/memory/sharding/test_sharding_fsdp_ranks.py).

At the optimizer step, CUDA's foreach temporaries shrink with the optimizer shard; the
CPU's per-tensor temporaries shrink only under FSDP (every tensor is a dim-0 shard), not
under ZeroRedundancyOptimizer (whole tensors per rank). Offloaded state counts 0 on the
device.

`deepspeed_zero_bytes` reproduces DeepSpeed's own estimators for cross-checking, and
`min_gpus` finds the smallest power-of-two world size whose per-rank total fits.
"""

from __future__ import annotations

import enum

from torchfit._core import checks

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "SIZE_RULES",
    "Strategy",
    "check_count",
    "check_world_size",
    "parse_strategy",
]

#: The checks of the sizes `shard_estimate` and `min_gpus` both take.
SIZE_RULES = {
    "param_bytes": checks.number(above=0),
    "grad_bytes": checks.number(above=0),
    "root_bytes": checks.whole(at_least=0),
    "root_trainable_params": checks.whole(at_least=0),
    "root_head_params": checks.whole(at_least=0),
    "unit_bytes": checks.whole(at_least=0),
}

#: DDP's default ``bucket_cap_mb=25`` (torch/nn/parallel/distributed.py,
#: ``DistributedDataParallel.__init__``; ``kDefaultBucketBytesCap`` in c10d/reducer.hpp).
DEFAULT_BUCKET_BYTES = 25 * 2**20


class Strategy(enum.StrEnum):
    """How data-parallel training places model states on each rank."""

    NONE = "single"
    DDP = "ddp"
    ZERO1 = "zero1"
    ZERO2 = "zero2"
    ZERO3 = "fsdp"
    HSDP = "hsdp"


_ALIASES: dict[str, Strategy] = {
    "single": Strategy.NONE,
    "none": Strategy.NONE,
    "ddp": Strategy.DDP,
    "zero1": Strategy.ZERO1,
    "zero2": Strategy.ZERO2,
    "zero3": Strategy.ZERO3,
    "fsdp": Strategy.ZERO3,
    "fsdp2": Strategy.ZERO3,
    "fullyshard": Strategy.ZERO3,
    "hsdp": Strategy.HSDP,
    "hybridshard": Strategy.HSDP,
}


#: The names an error message lists (``none`` and spelling variants are accepted too).
_CHOICES = ("single", "ddp", "zero1", "zero2", "zero3", "fsdp", "fsdp2", "fully_shard", "hsdp")


@checks.arguments()
def parse_strategy(value: str | Strategy) -> Strategy:
    """Turn ``"ddp"``, ``"zero2"``, ``"fsdp"``, ``"fully_shard"``... into a `Strategy`.

    Raises:
        ValueError: an unknown name; the message lists the choices.

    Example:
        >>> parse_strategy("FSDP2") is Strategy.ZERO3
        True
        >>> parse_strategy("zero-2")
        <Strategy.ZERO2: 'zero2'>
    """
    if isinstance(value, Strategy):
        return value
    key = str(value).strip().lower().replace("-", "").replace("_", "").replace(" ", "")
    try:
        return _ALIASES[key]
    except KeyError:
        choices = ", ".join(repr(name) for name in _CHOICES)
        raise ValueError(
            f"unknown sharding strategy {value!r}; expected one of {choices}"
        ) from None


def check_world_size(world_size: int) -> None:
    """Refuse a world size that is not a positive int."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(
            f"world_size must be a positive number of ranks (GPUs); got {world_size!r}; "
            "use world_size=1 for a single GPU"
        )


def check_count(name: str, value: int) -> None:
    """Refuse a count that is not an int >= 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0; got {value!r}")
