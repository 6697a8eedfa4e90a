"""`shard_estimate`: what one rank of ``N`` holds, from a single-GPU `MemoryEstimate`.

The table of what each strategy replicates or shards is in `torchfit.memory.sharding`.
"""

from __future__ import annotations

import dataclasses
import math

from torchfit._core import checks
from torchfit._core.units import format_bytes
from torchfit.memory.result import MemoryEstimate
from torchfit.memory.sharding.strategies import (
    DEFAULT_BUCKET_BYTES,
    SIZE_RULES,
    Strategy,
    check_count,
    check_world_size,
    parse_strategy,
)

__all__ = ["shard_estimate"]


@checks.arguments(
    world_size=checks.whole(at_least=1, fix="use world_size=1 for a single GPU"),
    gpus_per_node=checks.whole(at_least=1),
    **SIZE_RULES,
)
def shard_estimate(
    estimate: MemoryEstimate,
    *,
    strategy: str | Strategy,
    backward_start: MemoryEstimate | None = None,
    world_size: int,
    params: int,
    largest_layer_params: int,
    unit_trainable_params: int | None = None,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    reshard_after_forward: bool = True,
    offload_optimizer: bool = False,
    offload_params: bool = False,
    param_bytes: float = 4,
    grad_bytes: float = 4,
    autocast_copies: int = 0,
    gpus_per_node: int | None = None,
    root_bytes: int = 0,
    root_trainable_params: int = 0,
    root_head_params: int | None = None,
    unit_bytes: int | None = None,
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
        unit_trainable_params: Of those, the ones that train (LoRA adapters on a frozen
            base): the unit's gradients in flight in backward. Default: all of them.
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
        root_bytes: FSDP: bytes of the root unit's own parameters as gathered (a
            transformer's embeddings, untied head and final norm when each block is
            wrapped apart, as accelerate's transformer-layer policy and
            ``fully_shard(block)`` then ``fully_shard(model)`` do). The root stays
            gathered from its forward through its backward (``fully_shard``'s
            ``reshard_after_forward=None`` is ``False`` for the root; FSDP1 likewise never
            frees the root after forward).
        root_trainable_params: Of the root's parameters, the ones that train: their
            unsharded gradients are in flight together until the root's post-backward.
        root_head_params: Of those, the output head's (a tied head's are the
            embedding's): the root's gradients that already exist at the start of
            backward. Default: all of ``root_trainable_params``.
        unit_bytes: Bytes of the largest other unit as gathered, where its parameters are
            not all ``param_bytes`` each (a 4-bit block beside fp32 norms and adapters);
            default ``largest_layer_params * param_bytes``.

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
        unit_trainable_params=(
            largest_layer_params if unit_trainable_params is None else unit_trainable_params
        ),
        bucket_bytes=bucket_bytes,
        reshard_after_forward=reshard_after_forward,
        offload_optimizer=offload_optimizer,
        offload_params=offload_params,
        param_bytes=param_bytes,
        grad_bytes=grad_bytes,
        autocast_copies=autocast_copies,
        root_bytes=root_bytes,
        root_trainable_params=root_trainable_params,
        root_head_params=(root_trainable_params if root_head_params is None else root_head_params),
        unit_bytes=(
            math.ceil(largest_layer_params * param_bytes) if unit_bytes is None else unit_bytes
        ),
    )
    moments = [_shard_one(estimate, options)]
    if kind is Strategy.ZERO3 and estimate.in_optimizer_step:
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
    unit_trainable_params: int
    bucket_bytes: int
    reshard_after_forward: bool
    offload_optimizer: bool
    offload_params: bool
    param_bytes: float
    grad_bytes: float
    autocast_copies: int
    root_bytes: int = 0
    root_trainable_params: int = 0
    root_head_params: int = 0
    unit_bytes: int = 0

    def __post_init__(self) -> None:
        """Reject bad sizes and offload options the strategy does not have."""
        check_world_size(self.world_size)
        check_count("params", self.params)
        check_count("largest_layer_params", self.largest_layer_params)
        check_count("unit_trainable_params", self.unit_trainable_params)
        check_count("bucket_bytes", self.bucket_bytes)
        check_count("autocast_copies", self.autocast_copies)
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
    at_step = estimate.in_optimizer_step

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
      estimate with 16-bit parameters), and the root's own parameters, which are not
      freed between its forward and its backward (``root_bytes``).
      ``reshard_after_forward=False`` keeps every unit gathered from its forward to its
      backward: at the start of backward, all of them
      (each reshards after its own backward, so at the end of backward two again);
    - in backward, two units of gradients are in flight: the unsharded gradients autograd
      is producing for the current unit, and the previous unit's reduce-scatter input,
      which ``post_backward`` keeps (``reduce_scatter_states``, at most
      ``reduce_scatter_max_input_buffers=1``) until the next unit's reduce starts; the
      root's gradients (an untied head's from the start of backward) wait whole, in place
      of their shard, for the root's post-backward at its end;
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
    gathered = o.root_bytes + 2 * o.unit_bytes
    if not o.reshard_after_forward and estimate.peak_at != "end of backward":
        gathered = max(gathered, math.ceil(o.params * o.param_bytes))
    in_flight = 2 * math.ceil(o.unit_trainable_params * o.grad_bytes)
    if estimate.peak_at == "start of backward":  # the head's gradients, whole already
        in_flight += math.ceil(o.root_head_params * o.grad_bytes)
    else:  # the root's gradients are whole until its post-backward, in place of a shard
        root_grads = math.ceil(o.root_trainable_params * o.grad_bytes)
        in_flight += root_grads - math.ceil(root_grads / n)
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
