"""The biggest batch: predicted (`max_batch_size`), then verified (`find_batch_size`).

`simulate_gpu` gives CPU code a GPU-sized memory limit that raises real OOM errors.
"""

from torchfit.memory.batch.finder import find_batch_size
from torchfit.memory.batch.predict import Margin, max_batch_size, solve_batch_size
from torchfit.memory.batch.results import BatchSizeResult, BatchTrial, TrialOutcome, is_oom
from torchfit.memory.batch.search import DEFAULT_START, split_effective
from torchfit.memory.batch.simulate import SimulatedGPU, simulate_gpu

__all__ = [
    "DEFAULT_START",
    "BatchSizeResult",
    "BatchTrial",
    "Margin",
    "SimulatedGPU",
    "TrialOutcome",
    "find_batch_size",
    "is_oom",
    "max_batch_size",
    "simulate_gpu",
    "solve_batch_size",
    "split_effective",
]
