"""Memory estimation: predict, measure, and decide.

Estimators return a `MemoryEstimate`; `measure_peak` is the real-allocation truth they
are tested against. This package exports the names most runs need; every other public
name lives in the stage that defines it, each stage importing only the ones below it:
`gpus` and `catalog` (what card, what model), `analytic` (closed forms), `modules` (a
meta-device pass of any module), `kernels` (scratch rules), `tracing` (the real step on
fake tensors), `allocator` (the CUDA caching allocator and context), `batch`,
`sharding` and `device_map`, and `plan` on top; `result` holds the currency and
`measure` the real peaks. For example ``from torchfit.memory.batch import Margin``.
"""

from torchfit.memory.allocator import to_device
from torchfit.memory.batch import find_batch_size, max_batch_size, simulate_gpu
from torchfit.memory.catalog import list_models
from torchfit.memory.device_map import plan_device_map
from torchfit.memory.estimator import estimate
from torchfit.memory.gpus import GPU, gpu, list_gpus
from torchfit.memory.measure import measure_peak, measure_step
from torchfit.memory.modules import activation_bytes
from torchfit.memory.plan import Plan
from torchfit.memory.result import MemoryEstimate
from torchfit.memory.sharding import shard_estimate
from torchfit.memory.step import Step
from torchfit.memory.tracing import trace, trace_step

__all__ = [
    # plan - does it fit, and what to change
    "Plan",
    # estimate - the analytic estimator and its currency
    "MemoryEstimate",
    "Step",
    "activation_bytes",
    "estimate",
    # trace - the real step on fake tensors
    "trace",
    "trace_step",
    # measure - real allocations, the truth
    "measure_peak",
    "measure_step",
    # batch size
    "find_batch_size",
    "max_batch_size",
    "simulate_gpu",
    # catalog - models and cards
    "GPU",
    "gpu",
    "list_gpus",
    "list_models",
    # allocator - what the device shows
    "to_device",
    # several GPUs
    "plan_device_map",
    "shard_estimate",
]
