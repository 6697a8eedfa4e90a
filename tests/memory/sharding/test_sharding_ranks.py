"""Per-rank peaks of real 2-process training (gloo on CPU, loopback) against `shard_estimate`.

Each rank measures the whole life of a training run (wrapping, optimizer creation and
three steps) with `measure_peak`, for a plain replica, DDP, and DDP with
``ZeroRedundancyOptimizer`` (ZeRO-1). The single-GPU side is the analytic estimate of
one process (``device="cpu"``).

What is true on CPU with gloo (measured, torch 2.13): DDP's reducer adds one flat copy
of the gradients (4 bytes x params, to within gloo's few hundred bytes), as on
CUDA/NCCL (the Reducer is the same code; only the collective differs). ZeRO-1 halves
the Adam state, but CPU's per-tensor AdamW step keeps its temporaries, and the rank
peaks ~1.3 MB (about 6%) above the prediction on this 1.05M-parameter MLP, the same
without DDP (cause not identified; ZeroRedundancyOptimizer's parameter broadcast is a
suspect). Hence the 10% tolerance, the analytic estimator's own.
"""

import warnings

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gloo_ranks import free_port, init_gloo, read_ranks, save_and_leave, start_ranks
from torchfit.memory import estimate, measure_peak
from torchfit.memory.sharding import shard_estimate

with warnings.catch_warnings():
    # torch.distributed.optim uses torch.jit.script and jit.interface, which torch
    # 2.13 deprecates at import: torch's own code, not ours.
    warnings.filterwarnings(
        "ignore",
        message=".*torch.jit.(script|interface).* is deprecated",
        category=DeprecationWarning,
    )
    from torch.distributed.optim import ZeroRedundancyOptimizer

WORLD = 2
BATCH = 64
WIDTH = 512
TOLERANCE = 0.10  # stated above: the analytic estimator's tolerance (issue 3)
KINDS = ("single", "ddp", "zero1")
# gloo sometimes has a small allocation of its own alive at the DDP peak (192 bytes seen
# on one rank in some runs); the bucket copy itself is exact.
GLOO_SLACK = 1024


def _model():
    torch.manual_seed(0)
    layers = [nn.Linear(WIDTH, WIDTH) for _ in range(4)]
    return nn.Sequential(
        layers[0], nn.ReLU(), layers[1], nn.ReLU(), layers[2], nn.ReLU(), layers[3]
    )


def _lifetime_peak(kind, x, y):
    model = _model()

    def run():
        wrapped = model if kind == "single" else DistributedDataParallel(model)
        if kind == "zero1":
            opt = ZeroRedundancyOptimizer(
                wrapped.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3
            )
        else:
            opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-3)
        for _ in range(3):
            nn.functional.mse_loss(wrapped(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    measured = measure_peak(run, track=(model, x, y), device="cpu")
    return {"peak": measured.peak, "end": measured.end}


def _worker(rank, port, out_dir):
    init_gloo(rank, WORLD, port)
    try:
        torch.manual_seed(rank)
        x, y = torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH)
        peaks = {kind: _lifetime_peak(kind, x, y) for kind in KINDS}
    finally:
        dist.destroy_process_group()
    save_and_leave(out_dir, rank, peaks)


@pytest.fixture(scope="module")
def rank_peaks(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("ranks")
    start_ranks(_worker, (free_port(), out_dir), WORLD)
    return read_ranks(out_dir, WORLD)


@pytest.fixture(scope="module")
def predicted():
    model = _model()
    params = sum(p.numel() for p in model.parameters())
    single = estimate(model, batch_size=BATCH, input_shape=(WIDTH,), dtype="fp32", device="cpu")
    return {
        kind: shard_estimate(
            single, strategy=kind, world_size=WORLD, params=params, largest_layer_params=0
        ).total
        for kind in KINDS
    }


# The CPU profiler does not see frees made on gloo's own threads (found with FSDP2, see
# test_sharding_fsdp_ranks.py), so a rank's measured peak can drift up from run to run;
# every such missed free is still allocated at the end of the run, where nothing of the
# step should be. The real peak therefore lies in [peak - end, peak]. Seen in 2 runs of 6:
# a DDP or a ZeRO-1 rank 4,202,520 B high (the bucket buffer's free missed) with exactly
# that left at the end; peak - end was then the clean runs' peak to the byte.
def _interval(measured):
    return measured["peak"] - measured["end"], measured["peak"]


@pytest.mark.parametrize("rank", range(WORLD))
def test_ddp_adds_exactly_the_predicted_bucket_copy(rank_peaks, predicted, rank):
    ddp_low, ddp_high = _interval(rank_peaks[rank]["ddp"])
    single_low, single_high = _interval(rank_peaks[rank]["single"])
    expected = predicted["ddp"] - predicted["single"]  # 4 bytes x params, ~4.2 MB
    low, high = ddp_low - single_high, ddp_high - single_low
    assert low - GLOO_SLACK <= expected <= high + GLOO_SLACK, f"rank {rank}: {low}..{high}"


@pytest.mark.parametrize("rank", range(WORLD))
@pytest.mark.parametrize("kind", KINDS)
def test_rank_peak_within_tolerance(rank_peaks, predicted, rank, kind):
    low, high = _interval(rank_peaks[rank][kind])
    nearest = min(max(predicted[kind], low), high)
    error = (predicted[kind] - nearest) / nearest
    assert abs(error) <= TOLERANCE, (
        f"{kind} rank {rank}: {error:+.1%} ({predicted[kind]} vs {low}..{high})"
    )


def test_zero1_saves_memory_over_ddp(rank_peaks, predicted):
    assert predicted["zero1"] < predicted["ddp"]
    for peaks in rank_peaks:
        assert _interval(peaks["zero1"])[0] < _interval(peaks["ddp"])[1]
