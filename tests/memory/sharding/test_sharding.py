"""Per-rank estimates under DDP / ZeRO / FSDP: the rules, DeepSpeed's formulas, a worked case."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torchfit.memory.result import MemoryEstimate
from torchfit.memory.sharding import (
    Strategy,
    deepspeed_zero_bytes,
    min_gpus,
    parse_strategy,
    shard_estimate,
)

PARAMS = st.integers(min_value=1, max_value=10**12)
WORLD = st.integers(min_value=1, max_value=4096)


def _mixed_adam(p, *, at_step=True, activations=0):
    """DeepSpeed's layout: 16-bit weights 2P, 16-bit grads 2P, fp32 master + m + v 12P."""
    return MemoryEstimate(
        weights=2 * p,
        gradients=2 * p if at_step else 0,
        optimizer=12 * p,
        activations=activations,
        peak_at="optimizer step" if at_step else "start of backward",
    )


def _shard(e, strategy, n, p, **kw):
    kw.setdefault("largest_layer_params", 0)
    return shard_estimate(e, strategy=strategy, world_size=n, params=p, **kw)


# ---- DeepSpeed's published formulas, written out independently -----------------------


@settings(max_examples=200, deadline=None)
@given(p=PARAMS, n=WORLD, layer=st.integers(min_value=0, max_value=10**10))
def test_deepspeed_formulas(p, n, layer):
    # ZeRO paper Fig. 1 (stage 1); DeepSpeed stage_1_and_2.py / stage3.py estimators.
    assert deepspeed_zero_bytes(p, n, 1) == 4 * p + int(12 * p / n)
    assert deepspeed_zero_bytes(p, n, 2) == 2 * p + int(18 * p / n)
    assert deepspeed_zero_bytes(p, n, 2, offload_optimizer=True) == 2 * p
    assert deepspeed_zero_bytes(p, n, 3, largest_layer_params=layer) == 4 * layer + int(18 * p / n)
    z3_off = deepspeed_zero_bytes(p, n, 3, largest_layer_params=layer, offload_optimizer=True)
    assert z3_off == 4 * layer + int(2 * p / n)
    z3_all = deepspeed_zero_bytes(
        p, n, 3, largest_layer_params=layer, offload_optimizer=True, offload_params=True
    )
    assert z3_all == 4 * layer


@settings(max_examples=200, deadline=None)
@given(p=PARAMS, n=WORLD, layer=st.integers(min_value=0, max_value=10**10))
def test_shard_estimate_matches_deepspeed_model_states(p, n, layer):
    """Mixed-precision Adam, 16P single-GPU: the sharded model states against DeepSpeed.

    The differences are exactly the buffers each side counts and the other does not:
    stage 1 here is torch's ZeroRedundancyOptimizer under DDP (+ DDP's flat gradient
    buckets, 2P); DeepSpeed stage 2/3 also hold an fp32 gradient partition (4P/N) and
    stage 3 a 16-bit parameter partition beside the fp32 master (so +2P/N net). Stage 3
    here peaks at the end of backward with FSDP2's two units of gradients in flight (the
    current unit's and the previous reduce-scatter input, 2 x 2 x layer bytes), which
    DeepSpeed's estimator leaves out; both count two gathered units (4 x layer).
    """
    e = _mixed_adam(p)
    kw = dict(bucket_bytes=0, param_bytes=2, grad_bytes=2, largest_layer_params=layer)
    z1 = _shard(e, "zero1", n, p, **kw).model_states
    z2 = _shard(e, "zero2", n, p, **kw).model_states
    z3 = _shard(e, "zero3", n, p, **kw).model_states
    assert abs(z1 - 2 * p - deepspeed_zero_bytes(p, n, 1)) < 2
    assert abs(z2 + 4 * p / n - deepspeed_zero_bytes(p, n, 2)) < 3
    in_flight = 2 * 2 * layer
    ds3 = deepspeed_zero_bytes(p, n, 3, largest_layer_params=layer)
    assert abs(z3 + 2 * p / n - in_flight - ds3) < 4


# ---- the rules ------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(p=PARAMS, n=WORLD, act=st.integers(min_value=0, max_value=10**12))
def test_ordering_and_activations(p, n, act):
    e = _mixed_adam(p, activations=act)
    one_node = {Strategy.HSDP: {"gpus_per_node": n}}  # HSDP on one node is FSDP
    ranks = {s: _shard(e, s, n, p, **one_node.get(s, {})) for s in Strategy}
    totals = {s: rank.total for s, rank in ranks.items()}
    assert totals[Strategy.DDP] >= totals[Strategy.NONE]
    assert totals[Strategy.DDP] >= totals[Strategy.ZERO1] >= totals[Strategy.ZERO2]
    assert totals[Strategy.ZERO2] >= totals[Strategy.ZERO3] == totals[Strategy.HSDP]
    # Activations are per rank: no strategy shards them.
    assert all(rank.activations == act for rank in ranks.values())


@pytest.mark.parametrize("p", [10**6, 7 * 10**9])
def test_ddp_adds_a_full_gradient_copy(p):
    e = _mixed_adam(p)
    ddp = _shard(e, "ddp", 8, p, grad_bytes=2)
    single = _shard(e, "single", 8, p)
    assert ddp.gradients - single.gradients == 2 * p
    assert single.model_states == e.model_states


@pytest.mark.parametrize("strategy", ["zero3", "fsdp", "fsdp2", "fully_shard"])
def test_zero3_model_states_fall_as_one_over_n(strategy):
    p = 10**9
    e = _mixed_adam(p)
    for n in (1, 2, 4, 8, 64):
        states = _shard(e, strategy, n, p, bucket_bytes=0).model_states
        assert states == math.ceil(2 * p / n) + math.ceil(2 * p / n) + math.ceil(12 * p / n)


def test_zero3_gathers_two_layers_or_everything():
    p, layer, n = 10**9, 10**7, 8
    e = _mixed_adam(p, at_step=False)
    resharded = _shard(e, "fsdp", n, p, largest_layer_params=layer, param_bytes=2)
    kept = _shard(
        e, "fsdp", n, p, largest_layer_params=layer, param_bytes=2, reshard_after_forward=False
    )
    assert resharded.weights == math.ceil(2 * p / n) + 2 * 2 * layer
    assert kept.weights == math.ceil(2 * p / n) + 2 * p


@pytest.mark.parametrize("strategy", ["zero1", "zero2", "fsdp"])
def test_offload_zeroes_optimizer(strategy):
    p = 10**8
    e = _mixed_adam(p)
    on = _shard(e, strategy, 4, p, offload_optimizer=True)
    assert on.optimizer == 0
    assert _shard(e, strategy, 4, p).optimizer > 0


def test_offload_params_leaves_only_gathered_layers():
    p, layer = 10**9, 10**7
    e = _mixed_adam(p)
    rank = _shard(
        e,
        "fsdp",
        8,
        p,
        largest_layer_params=layer,
        param_bytes=2,
        offload_params=True,
        offload_optimizer=True,
        bucket_bytes=0,
    )
    # the end of backward: two gathered 16-bit units, as DeepSpeed counts, and two fp32
    # units of gradients in flight on their way to the CPU
    assert rank.peak_at == "end of backward"
    assert (
        rank.weights
        == 4 * layer
        == deepspeed_zero_bytes(
            p, 8, 3, largest_layer_params=layer, offload_optimizer=True, offload_params=True
        )
    )
    assert rank.gradients == 2 * 4 * layer
    assert rank.optimizer == 0


def test_note_names_strategy_and_n():
    rank = _shard(_mixed_adam(1000), "zero2", 16, 1000)
    assert any("ZeRO-2" in note and "N=16" in note for note in rank.notes)
    assert rank.reserved is None


def test_backward_start_moment_wins_when_larger():
    p = 10**9
    step = _mixed_adam(p)  # gradients, no activations
    start = MemoryEstimate(activations=5 * 10**9, peak_at="start of backward")
    rank = _shard(step, "fsdp", 64, p, backward_start=start, largest_layer_params=10**7)
    assert rank.activations == 5 * 10**9
    assert rank.gradients == 2 * 4 * 10**7  # one unit computing, one reduce-scattering
    assert rank.peak_at == "start of backward"


# ---- bad input ------------------------------------------------------------------------


def test_bad_strategy_lists_choices():
    with pytest.raises(ValueError, match=r"unknown sharding strategy 'zero4'.*'ddp'.*'fsdp'"):
        parse_strategy("zero4")
    with pytest.raises(ValueError, match="expected one of"):
        _shard(_mixed_adam(10), "tensor-parallel", 2, 10)


@pytest.mark.parametrize("n", [0, -1, True, 2.0])
def test_bad_world_size(n):
    with pytest.raises((ValueError, TypeError), match=r"world_size must be a .*use world_size=1"):
        _shard(_mixed_adam(10), "ddp", n, 10)
    with pytest.raises((ValueError, TypeError), match="world_size"):
        deepspeed_zero_bytes(10, n, 2)


def test_offload_needs_a_zero_strategy():
    with pytest.raises(ValueError, match=r"offload_optimizer needs a ZeRO strategy.*'ddp'"):
        _shard(_mixed_adam(10), "ddp", 2, 10, offload_optimizer=True)
    with pytest.raises(ValueError, match=r"offload_params needs fully sharded.*strategy='fsdp'"):
        _shard(_mixed_adam(10), "zero2", 2, 10, offload_params=True)
    with pytest.raises(ValueError, match="stage must be a whole number from 1 to 3; got 4"):
        deepspeed_zero_bytes(10, 2, 4)


# ---- min_gpus and the worked example --------------------------------------------------


def test_min_gpus_is_the_smallest_power_of_two_that_fits():
    p = 10**9
    e = _mixed_adam(p).replace(context=300 * 2**20)
    budget = 40 * 2**30
    n = min_gpus(e, budget, strategy="fsdp", params=p, bucket_bytes=0)
    assert n is not None
    fits = _shard(e, "fsdp", n, p, bucket_bytes=0).device_total <= budget
    assert fits
    if n > 1:
        assert _shard(e, "fsdp", n // 2, p, bucket_bytes=0).device_total > budget
    assert min_gpus(e, 2**20, strategy="fsdp", params=p) is None


def test_llama2_7b_on_a100_40gb():
    """Llama-2-7B full fine-tune, bf16 autocast AdamW, seq 4096, batch 1, checkpointing.

    Printed (run with -s): ZeRO-2 in DeepSpeed's layout, ZeRO-3/FSDP2 with bf16
    MixedPrecisionPolicy, and FSDP2 with the optimizer on the CPU.
    """
    from torchfit.memory import estimate, gpu
    from torchfit.memory.analytic import spec_from_config
    from torchfit.memory.analytic.model_states import model_state_bytes
    from torchfit.memory.catalog import model_config

    config = model_config("llama-2-7b")
    spec = spec_from_config(config)
    p = spec.num_params
    common = dict(
        batch_size=1, seq_len=4096, dtype="bf16", optimizer="adamw", gradient_checkpointing=True
    )
    step = estimate(config, **common)
    start = estimate(config, **common, trainable_params=1, frozen_base=False)  # no gradients
    copies = model_state_bytes(
        params=p, dtype="bf16", mixed_precision=True, autocast_params=spec.linear_params
    ).autocast_copies
    # DeepSpeed's bf16 layout for ZeRO-1/2 and DDP: 16-bit weights and gradients,
    # fp32 master + m + v in the optimizer (12 B/param), no autocast copies.
    ds_step = step.replace(weights=2 * p, gradients=2 * p, optimizer=12 * p)
    ds_start = start.replace(overhead=start.overhead - copies)
    block = 4 * spec.hidden**2 + 3 * spec.hidden * spec.intermediate
    layer = max(block, spec.vocab * spec.hidden)
    memory = gpu("A100 40GB").memory
    kw = dict(params=p, largest_layer_params=layer, param_bytes=2)
    answers = {
        "DDP": min_gpus(ds_step, memory, strategy="ddp", backward_start=ds_start, **kw),
        "ZeRO-2": min_gpus(ds_step, memory, strategy="zero2", backward_start=ds_start, **kw),
        "ZeRO-3": min_gpus(ds_step, memory, strategy="zero3", backward_start=ds_start, **kw),
        "FSDP2": min_gpus(
            step, memory, strategy="fsdp", backward_start=start, autocast_copies=copies, **kw
        ),
        "FSDP2 + optimizer offload": min_gpus(
            step,
            memory,
            strategy="fsdp",
            backward_start=start,
            autocast_copies=copies,
            offload_optimizer=True,
            **kw,
        ),
    }
    for name, n in answers.items():
        print(f"Llama-2-7B on A100 40GB, {name}: {n} GPU(s)")  # noqa: T201 - read with -s
    rank = {k: math.inf if v is None else v for k, v in answers.items()}
    assert rank["ZeRO-3"] <= rank["ZeRO-2"] <= rank["DDP"]
    assert rank["FSDP2 + optimizer offload"] <= rank["FSDP2"]
    assert answers["ZeRO-3"] is not None  # 7B states sharded over <= 1024 GPUs must fit
    assert answers["DDP"] is None  # a 16 B/param replica of 7B (~100 GiB) cannot fit 40 GiB


# ---- FSDP2's moments (measured on CPU ranks: tests/memory/sharding/test_sharding_fsdp_ranks.py) --


def test_fsdp_peaks_at_end_of_backward_with_units_in_flight():
    p, layer, n = 10**9, 10**7, 8
    kw = dict(largest_layer_params=layer, param_bytes=2, grad_bytes=2)
    rank = _shard(_mixed_adam(p), "fsdp", n, p, **kw)
    # all gradient shards, two gathered units, two units of gradients in flight
    assert rank.peak_at == "end of backward"
    assert rank.weights == math.ceil(2 * p / n) + 2 * 2 * layer
    assert rank.gradients == math.ceil(2 * p / n) + 2 * 2 * layer
    # units kept gathered after forward have each resharded after their own backward
    kept = _shard(_mixed_adam(p), "fsdp", n, p, reshard_after_forward=False, **kw)
    assert kept.weights == rank.weights
    # at the optimizer step nothing is gathered or in flight
    step = _shard(_mixed_adam(p).replace(workspace=10**12), "fsdp", n, p, **kw)
    assert step.peak_at == "optimizer step"
    assert step.weights == step.gradients == math.ceil(2 * p / n)


def test_cpu_step_temporaries_shrink_only_with_sharded_tensors():
    p, n = 10**6, 4
    e = _mixed_adam(p).replace(workspace=10**9, device="cpu")  # the step is the peak
    # ZeroRedundancyOptimizer hands out whole tensors: the largest one's temporaries stay
    assert _shard(e, "zero1", n, p).workspace == 10**9
    # FSDP2 steps dim-0 shards of every tensor: per-tensor temporaries are 1/N
    assert _shard(e, "fsdp", n, p).workspace == 10**9 // n
    # CUDA's foreach temporaries span the (sharded) list under every ZeRO stage
    assert _shard(e.replace(device="cuda"), "zero1", n, p).workspace == 10**9 // n


def _step(peak_at="optimizer step"):
    return MemoryEstimate(
        weights=4_000_000,
        gradients=4_000_000,
        optimizer=8_000_000,
        activations=2_000_000,
        workspace=500_000,
        peak_at=peak_at,
        device="cuda",
    )


def test_hsdp_shards_within_a_node_only():
    common = {"params": 1_000_000, "largest_layer_params": 100_000}
    hybrid = shard_estimate(_step(), strategy="hsdp", world_size=32, gpus_per_node=8, **common)
    node = shard_estimate(_step(), strategy="fsdp", world_size=8, **common)
    everywhere = shard_estimate(_step(), strategy="fsdp", world_size=32, **common)
    assert (hybrid.weights, hybrid.gradients, hybrid.optimizer) == (
        node.weights,
        node.gradients,
        node.optimizer,
    )
    assert everywhere.total < hybrid.total
    assert any("HSDP: sharded over the 8 GPUs" in n for n in hybrid.notes)


def test_offload_reports_host_memory_per_node():
    common = {"params": 1_000_000, "largest_layer_params": 100_000, "offload_optimizer": True}
    one_node = shard_estimate(_step(), strategy="fsdp", world_size=8, **common)
    two_nodes = shard_estimate(_step(), strategy="fsdp", world_size=16, gpus_per_node=8, **common)
    # each node holds its ranks' shards of the optimizer state: all of it on one node,
    # half of it on each of two
    assert "host memory for offloaded state: 7.63 MiB per node" in " ".join(one_node.notes)
    assert "host memory for offloaded state: 3.81 MiB per node" in " ".join(two_nodes.notes)
    plain = shard_estimate(
        _step(), strategy="fsdp", world_size=8, params=1_000_000, largest_layer_params=100_000
    )
    assert not any("host memory" in n for n in plain.notes)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"strategy": "hsdp", "world_size": 16}, r"pass gpus_per_node="),
        ({"strategy": "hsdp", "world_size": 12, "gpus_per_node": 8}, r"not a whole number"),
        (
            {"strategy": "fsdp", "world_size": 8, "gpus_per_node": 0},
            r"gpus_per_node must be a whole number >= 1",
        ),
    ],
)
def test_gpus_per_node_is_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        shard_estimate(_step(), params=1_000_000, largest_layer_params=100_000, **kwargs)


def test_min_gpus_weighs_the_root_as_shard_estimate_does():
    p = 10**9
    e = _mixed_adam(p).replace(context=300 * 2**20)
    budget = 8 * 2**30
    root = {"root_bytes": 4 * 10**9, "root_trainable_params": 10**9}
    plain = min_gpus(e, budget, strategy="fsdp", params=p, bucket_bytes=0)
    with_root = min_gpus(e, budget, strategy="fsdp", params=p, bucket_bytes=0, **root)
    assert plain is not None and with_root is not None and with_root > plain
    rank = shard_estimate(
        e, strategy="fsdp", world_size=with_root, params=p, largest_layer_params=0, **root
    )
    assert rank.device_total <= budget
