"""Per-rank peaks of real FSDP2 training (``fully_shard`` on CPU) against `shard_estimate`.

torch 2.13 runs FSDP2 on CPU: ``fully_shard`` over a CPU device mesh shards parameters,
all-gathers each unit for forward and backward and reduce-scatters gradients with the
same ``FSDPParamGroup`` code as on CUDA (only collectives and streams differ). Each rank
builds four 512x512 blocks (one unit each), wraps them and the root, and runs three
steps (forward, backward, AdamW step, ``zero_grad``), all inside `measure_peak`; then it
drops the model and optimizer, so the bytes left at the end should be zero. For 2 and 4
ranks, ``reshard_after_forward`` True and False, two ways:

- real ranks: 2 and 4 spawned processes, gloo over loopback. Measured (torch 2.13): the
  profiler misses some frees, those of buffers whose last reference gloo's worker
  threads drop (a collective's ``Work`` holds its tensors), so the replayed peak drifts
  up by a few units between runs (N=2, True: 12.3 to 16.5 MB in five runs) and the
  same run ends with that drift still "allocated". The true peak lies in
  ``[peak - end, peak]``; the estimate must be within 10% of that interval;
- in this process, rank 0 of N under torch's ``fake`` process group (collectives that
  move no data, on the calling thread): FSDP2 allocates the same buffers and the
  profiler sees every allocation of the step (a unit or two of FSDP's buffers can
  outlive the run until a later collection, so ``end`` is not checked here). The
  estimate must be within 5% of this peak.

Why the peak is where the estimate puts it (measured in the profiler): with
``reshard_after_forward=True`` at the end of backward (all gradient shards, two units
gathered, the current unit's gradients and the previous unit's reduce-scatter input);
with ``False`` at the start of backward (every unit still gathered).

The mapping to ZeRO stages: ``reshard_after_forward=True`` is ZeRO-3; ``False`` keeps
every unit gathered from its forward to its backward, so its backward peak is ZeRO-2's
(full parameters, sharded gradients and optimizer state) while at rest and at the
optimizer step parameters are sharded (FSDP1 called it ``SHARD_GRAD_OP``). torch has no
CPU implementation of DeepSpeed's ZeRO-2 itself (parameters always replicated):
`deepspeed_zero_bytes` checks it analytically (tests/memory/sharding/test_sharding.py), and it is
marked for a GPU check.
"""

import gc

import pytest
import torch
import torch.distributed as dist
from torch import nn

from gloo_ranks import free_port, init_gloo, read_ranks, save_and_leave, start_ranks
from torchfit.memory import activation_bytes, estimate, measure_peak
from torchfit.memory.sharding import shard_estimate

BATCH = 64
WIDTH = 512
BLOCKS = 4
UNIT = WIDTH * WIDTH + WIDTH  # parameters of one fully_shard unit (a block)
WORLDS = (2, 4)
RESHARD = (True, False)
GLOO_TOLERANCE = 0.10  # the analytic estimator's own tolerance (issue 3)
FAKE_TOLERANCE = 0.05  # nothing missed: a tighter bound (measured errors in the docstring)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(
        *(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU()) for _ in range(BLOCKS))
    )


def _local(tensors):
    """The local shard of each DTensor (FSDP2 parameters and their optimizer state)."""
    from torch.distributed.tensor import DTensor

    return [t.to_local() if isinstance(t, DTensor) else t for t in tensors]


def _lifetime(reshard, x, y):
    """Build, wrap, three steps, drop: all inside `measure_peak` (every block is seen)."""
    from torch.distributed.fsdp import fully_shard

    found = {}

    def run():
        model = _model()
        for block in model:
            fully_shard(block, reshard_after_forward=reshard)
        fully_shard(model, reshard_after_forward=reshard)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for _ in range(3):
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
        found["shard_params"] = sum(t.numel() for t in _local(model.parameters()))
        found["state_elements"] = sum(t.numel() for t in _local(state))
        del model, opt, state
        gc.collect()

    measured = measure_peak(run, track=(x, y), device="cpu")
    return {**found, "peak": measured.peak, "end": measured.end}


def _batch(rank):
    torch.manual_seed(rank)
    return torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH)


def _worker(rank, world, port, out_dir):
    init_gloo(rank, world, port)
    try:
        x, y = _batch(rank)
        peaks = {str(reshard): _lifetime(reshard, x, y) for reshard in RESHARD}
    finally:
        dist.destroy_process_group()
    save_and_leave(out_dir, rank, peaks)


@pytest.fixture(scope="module")
def gloo_peaks(tmp_path_factory):
    """{world: [per rank: {"True": {...}, "False": {...}}]} from real gloo ranks."""
    found = {}
    for world in WORLDS:
        out_dir = tmp_path_factory.mktemp(f"fsdp{world}")
        start_ranks(_worker, (world, free_port(), out_dir), world)
        found[world] = read_ranks(out_dir, world)
    return found


@pytest.fixture(scope="module")
def fake_peaks():
    """{world: {"True": {...}, "False": {...}}}: rank 0 of N under the fake process group."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    found = {}
    for world in WORLDS:
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
        try:
            x, y = _batch(0)
            found[world] = {str(reshard): _lifetime(reshard, x, y) for reshard in RESHARD}
        finally:
            dist.destroy_process_group()
    return found


def _predicted(world, reshard):
    model = _model()
    params = sum(p.numel() for p in model.parameters())
    single = estimate(model, batch_size=BATCH, input_shape=(WIDTH,), dtype="fp32", device="cpu")
    # The start of backward: every saved activation, no gradients, no step temporaries.
    saved = activation_bytes(model, torch.empty(BATCH, WIDTH, device="meta"), device="cpu")
    start = single.replace(activations=saved.total, gradients=0, workspace=0)
    return shard_estimate(
        single,
        strategy="fsdp",
        backward_start=start,
        world_size=world,
        params=params,
        largest_layer_params=UNIT,
        reshard_after_forward=reshard,
    )


@pytest.mark.parametrize("reshard", RESHARD)
@pytest.mark.parametrize("world", WORLDS)
def test_fake_group_peak_within_tolerance(fake_peaks, world, reshard):
    got = fake_peaks[world][str(reshard)]
    rank = _predicted(world, reshard)
    error = (rank.total - got["peak"]) / got["peak"]
    assert abs(error) <= FAKE_TOLERANCE, (
        f"N={world} reshard={reshard}: {error:+.1%} ({rank.total} vs {got['peak']})"
    )


@pytest.mark.parametrize("reshard", RESHARD)
@pytest.mark.parametrize("world", WORLDS)
def test_gloo_rank_peak_within_tolerance(gloo_peaks, world, reshard):
    rank = _predicted(world, reshard)
    for r, peaks in enumerate(gloo_peaks[world]):
        got = peaks[str(reshard)]
        # missed frees only ever add: the true peak is in [peak - end, peak]
        low, high = got["peak"] - max(got["end"], 0), got["peak"]
        assert low * (1 - GLOO_TOLERANCE) <= rank.total <= high * (1 + GLOO_TOLERANCE), (
            f"N={world} reshard={reshard} rank {r}: {rank.total} vs [{low}, {high}]"
        )


def test_peak_moments():
    # resharding after forward: the end of backward; keeping units: the start of backward
    assert _predicted(2, True).peak_at == "end of backward"
    assert _predicted(2, False).peak_at == "start of backward"


@pytest.mark.parametrize("world", WORLDS)
def test_parameters_and_adam_state_are_one_nth(gloo_peaks, fake_peaks, world):
    params = BLOCKS * UNIT
    for got in [p["True"] for p in gloo_peaks[world]] + [fake_peaks[world]["True"]]:
        assert got["shard_params"] == params // world
        # AdamW: m and v of the shard, plus one 0-d step counter per parameter tensor
        assert got["state_elements"] == 2 * params // world + 2 * BLOCKS


def test_more_ranks_less_memory_and_resharding_saves(fake_peaks):
    for peaks in fake_peaks.values():
        # keeping units gathered from forward to backward costs memory (ZeRO-2-like)
        assert peaks["True"]["peak"] < peaks["False"]["peak"]
    assert fake_peaks[4]["True"]["peak"] < fake_peaks[2]["True"]["peak"]
    # the estimate agrees on both directions
    assert _predicted(4, True).total < _predicted(2, True).total
    assert _predicted(2, True).total < _predicted(2, False).total
