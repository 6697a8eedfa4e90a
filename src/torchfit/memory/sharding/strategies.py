"""Per-rank memory of data-parallel training: DDP, ZeRO-1/2/3 and FSDP2.

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

import dataclasses
import enum
import math

from torchfit._core.units import format_bytes
from torchfit.memory.result import MemoryEstimate

__all__ = ["Strategy", "deepspeed_zero_bytes", "min_gpus", "parse_strategy", "shard_estimate"]

#: DDP's default ``bucket_cap_mb=25`` (torch/nn/parallel/distributed.py,
#: ``DistributedDataParallel.__init__``; ``kDefaultBucketBytesCap`` in c10d/reducer.hpp).
DEFAULT_BUCKET_BYTES = 25 * 2**20

#: World sizes `min_gpus` tries, in order.
WORLD_SIZES: tuple[int, ...] = tuple(2**k for k in range(11))  # 1, 2, 4, ..., 1024


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


def _check_world_size(world_size: int) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(
            f"world_size must be a positive number of ranks (GPUs); got {world_size!r}; "
            "use world_size=1 for a single GPU"
        )


def _check_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0; got {value!r}")


def shard_estimate(
    estimate: MemoryEstimate,
    *,
    strategy: str | Strategy,
    backward_start: MemoryEstimate | None = None,
    world_size: int,
    params: int,
    largest_layer_params: int,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    reshard_after_forward: bool = True,
    offload_optimizer: bool = False,
    offload_params: bool = False,
    param_bytes: float = 4,
    grad_bytes: float = 4,
    autocast_copies: int = 0,
    gpus_per_node: int | None = None,
) -> MemoryEstimate:
    """The per-rank memory of one training step under a data-parallel strategy.

    A step has two candidate peaks: the start of backward (activations alive, no
    gradients yet) and the optimizer step (all gradients, no activations). Sharding
    shrinks the second more than the first, so a single-GPU peak at the optimizer step
    can become a per-rank peak at the start of backward. Pass that moment as
    ``backward_start`` and the larger per-rank moment is returned; without it, only the
    moment ``estimate`` describes is sharded. Under FSDP / ZeRO-3 a third moment, the
    end of backward (all gradient shards, units still gathered, gradients in flight), is
    derived from an optimizer-step ``estimate`` and weighed too.

    Args:
        estimate: The single-GPU estimate at the per-rank batch size (e.g. from
            `torchfit.memory.estimate`).
        strategy: ``"single"``, ``"ddp"``, ``"zero1"``, ``"zero2"``, ``"zero3"``/``"fsdp"``
            (also ``"fsdp2"``, ``"fully_shard"``), or ``"hsdp"`` (FSDP2 over a 2-D mesh:
            sharded within a node, replicated across nodes; needs ``gpus_per_node``).
        backward_start: Optional estimate of the start of backward (its activations,
            KV cache, workspace and overhead are used; model states come from
            ``estimate`` with no gradients yet). For the analytic estimator,
            ``estimate(..., trainable_params=1, frozen_base=False)`` gives this moment's
            activations (for a full fine-tune; pass the real run's ``frozen_base``).
        world_size: Number of ranks ``N`` (GPUs) sharing the model states.
        params: Parameters that train (they have gradients and optimizer state).
        largest_layer_params: Parameters of the largest FSDP unit / ZeRO-3 module
            (a transformer block, or the embedding if larger).
        bucket_bytes: Gradient-reduction bucket size (DDP's ``bucket_cap_mb``, DeepSpeed's
            ``reduce_bucket_size``).
        reshard_after_forward: FSDP2 frees gathered parameters after each layer's forward
            (default); ``False`` keeps all of them until backward.
        offload_optimizer: Optimizer state and its step live on the CPU (ZeRO-1/2/3).
        offload_params: Parameter shards (and gradient shards) live on the CPU (ZeRO-3).
        param_bytes: Bytes per gathered parameter (4 for fp32, 2 for a bf16
            ``MixedPrecisionPolicy(param_dtype=...)``).
        grad_bytes: Bytes per gradient element in the reduction buckets.
        autocast_copies: Bytes of autocast's 16-bit weight copies inside
            ``estimate.overhead`` (`ModelStates.autocast_copies`). ZeRO-3 gathering
            16-bit parameters (``param_bytes < 4``, FSDP2 ``MixedPrecisionPolicy``) feeds
            autocast tensors that are already 16-bit, so these copies are dropped.
        gpus_per_node: GPUs (ranks) per node; ``None``: all ``world_size`` on one node.
            HSDP shards over them; with offload, the note gives the host memory each node
            needs for its ranks' offloaded state.

    Returns:
        A `MemoryEstimate` for one rank; ``reserved`` is reset to ``None`` (not modelled
        after sharding) and a note names the strategy and ``N``.

    Raises:
        ValueError: unknown strategy, ``world_size < 1``, negative counts, or offload
            with a strategy that has no offload.

    Example:
        >>> single = MemoryEstimate(weights=4_000, gradients=4_000, optimizer=8_000,
        ...                         activations=1_000)
        >>> rank = shard_estimate(single, strategy="fsdp", world_size=4, params=1_000,
        ...                       largest_layer_params=100)
        >>> rank.weights, rank.gradients, rank.optimizer, rank.activations
        (1800, 1800, 2000, 1000)

        Shards of 1/4, two units of 100 parameters gathered and two units of gradients
        in flight (fp32: 400 bytes each).
    """
    kind = parse_strategy(strategy)
    per_node = _check_per_node(gpus_per_node, world_size, kind)
    hybrid = kind is Strategy.HSDP
    if hybrid:  # FSDP within a node; replicas across nodes reduce already-sharded grads
        kind, world_size = Strategy.ZERO3, per_node
    options = _Options(
        kind=kind,
        world_size=world_size,
        params=params,
        largest_layer_params=largest_layer_params,
        bucket_bytes=bucket_bytes,
        reshard_after_forward=reshard_after_forward,
        offload_optimizer=offload_optimizer,
        offload_params=offload_params,
        param_bytes=param_bytes,
        grad_bytes=grad_bytes,
        autocast_copies=autocast_copies,
    )
    moments = [_shard_one(estimate, options)]
    if kind is Strategy.ZERO3 and estimate.peak_at == "optimizer step":
        # The end of backward: every gradient shard exists (activations are gone) while
        # the last units are still gathered and their gradients in flight. Under FSDP it
        # can outgrow the optimizer step, where nothing is gathered or in flight.
        end = estimate.replace(workspace=0, peak_at="end of backward")
        moments.append(_shard_one(end, options))
    if backward_start is not None:
        start = estimate.replace(
            gradients=0,
            activations=backward_start.activations,
            kv_cache=backward_start.kv_cache,
            workspace=backward_start.workspace,
            overhead=backward_start.overhead,
            layers=backward_start.layers,
            peak_at="start of backward",  # whatever moment ``backward_start`` was cut at
        )
        moments.append(_shard_one(start, options))
    rank = max(moments, key=lambda moment: moment.total)  # ties: the first
    notes: list[str] = []
    if hybrid:
        notes.append(f"HSDP: sharded over the {per_node} GPUs of a node, replicated per node")
    host = _host_bytes(estimate, options) * per_node
    if host:
        notes.append(
            f"host memory for offloaded state: {format_bytes(host)} per node "
            f"({per_node} rank(s) per node)"
        )
    return rank.replace(notes=(*rank.notes, *notes)) if notes else rank


def _check_per_node(gpus_per_node: int | None, world_size: int, kind: Strategy) -> int:
    """GPUs per node, checked against the world size; the whole world when not given."""
    if gpus_per_node is None:
        if kind is Strategy.HSDP:
            raise ValueError(
                "strategy='hsdp' shards within a node and replicates across nodes: pass "
                "gpus_per_node= (e.g. 8), or use strategy='fsdp' to shard over all GPUs"
            )
        return world_size
    if isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int) or gpus_per_node < 1:
        raise ValueError(f"gpus_per_node must be a positive integer; got {gpus_per_node!r}")
    if world_size > gpus_per_node and world_size % gpus_per_node:
        raise ValueError(
            f"world_size={world_size} is not a whole number of nodes of {gpus_per_node} "
            "GPUs; pass a multiple of gpus_per_node"
        )
    return min(gpus_per_node, world_size)


def _host_bytes(estimate: MemoryEstimate, o: _Options) -> int:
    """Bytes one rank offloads to host memory (its shard of the offloaded state)."""
    host = math.ceil(estimate.optimizer / o.world_size) if o.offload_optimizer else 0
    if o.offload_params:
        host += math.ceil(estimate.weights / o.world_size)
        host += math.ceil(max(estimate.gradients, o.params * o.grad_bytes) / o.world_size)
    return host


@dataclasses.dataclass(frozen=True)
class _Options:
    kind: Strategy
    world_size: int
    params: int
    largest_layer_params: int
    bucket_bytes: int
    reshard_after_forward: bool
    offload_optimizer: bool
    offload_params: bool
    param_bytes: float
    grad_bytes: float
    autocast_copies: int

    def __post_init__(self) -> None:
        """Reject bad sizes and offload options the strategy does not have."""
        _check_world_size(self.world_size)
        _check_count("params", self.params)
        _check_count("largest_layer_params", self.largest_layer_params)
        _check_count("bucket_bytes", self.bucket_bytes)
        _check_count("autocast_copies", self.autocast_copies)
        if self.offload_optimizer and self.kind in {Strategy.NONE, Strategy.DDP}:
            raise ValueError(
                f"offload_optimizer needs a ZeRO strategy; got strategy={self.kind.value!r}: "
                "use 'zero1', 'zero2' or 'fsdp'"
            )
        if self.offload_params and self.kind is not Strategy.ZERO3:
            raise ValueError(
                "offload_params needs fully sharded parameters; got "
                f"strategy={self.kind.value!r}: use strategy='fsdp' (ZeRO-3)"
            )


def _shard_one(estimate: MemoryEstimate, o: _Options) -> MemoryEstimate:
    kind, world_size, params = o.kind, o.world_size, o.params
    bucket_bytes = o.bucket_bytes
    offload_optimizer, offload_params = o.offload_optimizer, o.offload_params
    param_bytes, grad_bytes = o.param_bytes, o.grad_bytes
    n = world_size
    full_grads = math.ceil(params * grad_bytes)
    weights, gradients, optimizer = estimate.weights, estimate.gradients, estimate.optimizer
    workspace, overhead = estimate.workspace, estimate.overhead
    at_step = estimate.peak_at == "optimizer step"

    if kind in {Strategy.DDP, Strategy.ZERO1}:
        # DDP's Reducer allocates one flat buffer per bucket at construction
        # (c10d/reducer.cpp, Reducer::initialize_buckets); with the default
        # gradient_as_bucket_view=False, .grad is a separate tensor copied in and out, so
        # the buckets are a second copy of all gradients (torch/nn/parallel/distributed.py,
        # DistributedDataParallel docstring: the view option saves "the total gradients
        # size"). The buffers exist at every moment of the step.
        gradients += full_grads
    if kind in {Strategy.ZERO1, Strategy.ZERO2, Strategy.ZERO3}:
        # Optimizer state of this rank's 1/N of the parameters
        # (torch/distributed/optim/zero_redundancy_optimizer.py, ZeroRedundancyOptimizer:
        # each rank steps only its partition; DeepSpeed stage_1_and_2.py likewise).
        optimizer = 0 if offload_optimizer else math.ceil(optimizer / n)
        if at_step and offload_optimizer:
            workspace = 0  # the step runs on the CPU (DeepSpeedCPUAdam, CPUOffloadPolicy)
        elif at_step and estimate.device == "cuda":
            # CUDA's foreach step makes temporaries the size of the whole (sharded) list
            # (torch/optim/adamw.py _multi_tensor_adamw); the CPU default steps one tensor
            # at a time, so its temporaries do not shrink (measured with gloo, 2 ranks).
            workspace = math.ceil(workspace / n)
    if kind is Strategy.ZERO2:
        # Gradients are reduce-scattered: each rank keeps its 1/N partition plus the
        # reduction bucket in flight (DeepSpeed stage_1_and_2.py reduce_bucket_size).
        # With offload, the partition goes to the CPU as it is reduced.
        shard = 0 if offload_optimizer else math.ceil(gradients / n)
        gradients = shard + min(bucket_bytes, full_grads)
    if kind is Strategy.ZERO3:
        weights, gradients, workspace = _fully_sharded(estimate, o, workspace, at_step=at_step)
        if param_bytes < 4:
            # Gathered 16-bit parameters: autocast has nothing to cast, no copies kept.
            overhead -= min(o.autocast_copies, overhead)

    note = (
        f"{_describe(kind)}, N={n}"
        + ("; optimizer offloaded to CPU" if offload_optimizer else "")
        + ("; parameters offloaded to CPU" if offload_params else "")
    )
    return estimate.replace(
        weights=weights,
        gradients=gradients,
        optimizer=optimizer,
        workspace=workspace,
        overhead=overhead,
        reserved=None,
        notes=(*estimate.notes, note),
    )


def _fully_sharded(
    estimate: MemoryEstimate, o: _Options, workspace: int, *, at_step: bool
) -> tuple[int, int, int]:
    """Weights, gradients and workspace of one FSDP2 / ZeRO-3 rank at one moment.

    Parameters, gradients and optimizer state are dim-0 shards (1/N each). The unit (a
    ``fully_shard`` module, e.g. a block) is the granularity of every collective
    (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py):

    - in forward and backward, two units are gathered: the one computing and the next,
      prefetched (implicit prefetch; the same 4 x largest layer as DeepSpeed's stage3.py
      estimate with 16-bit parameters). ``reshard_after_forward=False`` keeps every unit
      gathered from its forward to its backward: at the start of backward, all of them
      (each reshards after its own backward, so at the end of backward two again);
    - in backward, two units of gradients are in flight: the unsharded gradients autograd
      is producing for the current unit, and the previous unit's reduce-scatter input,
      which ``post_backward`` keeps (``reduce_scatter_states``, at most
      ``reduce_scatter_max_input_buffers=1``) until the next unit's reduce starts;
    - at the optimizer step, nothing is gathered or in flight: each unit reshards in its
      post-backward and the root's final callback waits for the last reduce-scatter. The
      step runs over the shards, so its per-tensor temporaries (CPU) shrink by N too.

    Measured on CPU with gloo, 2 and 4 ranks (tests/memory/sharding/test_sharding_fsdp_ranks.py).
    """
    n = o.world_size
    shard_w = 0 if o.offload_params else math.ceil(estimate.weights / n)
    offloaded = o.offload_optimizer or o.offload_params
    shard_g = 0 if offloaded else math.ceil(estimate.gradients / n)
    if at_step:
        if not o.offload_optimizer and estimate.device == "cpu":
            workspace = math.ceil(workspace / n)  # CUDA's foreach share: see _shard_one
        return shard_w, shard_g, workspace
    unit_params = math.ceil(o.largest_layer_params * o.param_bytes)
    gathered = 2 * unit_params
    if not o.reshard_after_forward and estimate.peak_at != "end of backward":
        gathered = max(gathered, math.ceil(o.params * o.param_bytes))
    in_flight = 2 * math.ceil(o.largest_layer_params * o.grad_bytes)
    return shard_w + gathered, shard_g + in_flight, workspace


def _describe(kind: Strategy) -> str:
    return {
        Strategy.NONE: "single GPU (no data parallelism)",
        Strategy.DDP: "DDP: full replica + gradient buckets",
        Strategy.ZERO1: "ZeRO-1: optimizer state sharded",
        Strategy.ZERO2: "ZeRO-2: optimizer state and gradients sharded",
        Strategy.ZERO3: "ZeRO-3/FSDP: parameters, gradients and optimizer state sharded",
        Strategy.HSDP: "HSDP: FSDP within a node, replicated across nodes",
    }[kind]


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
    _check_world_size(world_size)
    _check_count("params", params)
    _check_count("largest_layer_params", largest_layer_params)
    if stage not in (1, 2, 3):
        raise ValueError(f"stage must be 1, 2 or 3; got {stage!r}")
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
        )
        if rank.device_total <= gpu_memory_bytes:
            return n
    return None
