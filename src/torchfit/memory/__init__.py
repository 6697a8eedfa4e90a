"""Memory estimation: predict, measure, and decide.

Estimators return a `MemoryEstimate`; `measure_peak` is the real-allocation truth they
are tested against. The stages live in subpackages, each importing only the ones below
it: `gpus` and `catalog` (what card, what model), `analytic` (closed forms), `modules`
(a meta-device pass of any module), `kernels` (scratch rules), `tracing` (the real step
on fake tensors), `allocator` (the CUDA caching allocator and context), `batch`,
`sharding` and `device_map`, and `plan` on top.
"""

from torchfit.memory.allocator import (
    DEFAULT_CUDA_CONTEXT_BYTES,
    AllocatorStats,
    CachingAllocator,
    cublas_workspace_bytes,
    cuda_context_bytes,
    measure_cuda_context,
    replay,
    round_request,
    segment_size,
    to_device,
)
from torchfit.memory.analytic import (
    TransformerSpec,
    attention_bytes,
    kv_cache_bytes,
    kv_cache_bytes_for,
    model_state_bytes,
    optimizer_state_bytes,
    spec_from_config,
)
from torchfit.memory.batch import (
    BatchSizeResult,
    BatchTrial,
    Margin,
    SimulatedGPU,
    TrialOutcome,
    find_batch_size,
    is_oom,
    max_batch_size,
    simulate_gpu,
    solve_batch_size,
)
from torchfit.memory.catalog import (
    ModelEntry,
    ModelTask,
    build_model,
    count_parameters,
    list_models,
    model_config,
    model_entry,
)
from torchfit.memory.device_map import (
    DeviceMap,
    DeviceShare,
    evaluate_device_map,
    plan_device_map,
)
from torchfit.memory.estimator import estimate
from torchfit.memory.gpus import GPU, current_gpu, gpu, list_gpus
from torchfit.memory.measure import Measurement, live_bytes, measure_peak, measure_step
from torchfit.memory.modules import ActivationReport, activation_bytes
from torchfit.memory.plan import Advice, Plan, fits
from torchfit.memory.result import CATEGORIES, AffineEstimate, LayerMemory, MemoryEstimate
from torchfit.memory.sharding import (
    Strategy,
    deepspeed_zero_bytes,
    min_gpus,
    parse_strategy,
    shard_estimate,
)
from torchfit.memory.step import Step
from torchfit.memory.tracing import Trace, trace, trace_events, trace_step

__all__ = [
    # plan - does it fit, and what to change
    "Advice",
    "Plan",
    "fits",
    # estimate - the analytic estimator and its currency
    "CATEGORIES",
    "ActivationReport",
    "AffineEstimate",
    "LayerMemory",
    "MemoryEstimate",
    "Step",
    "TransformerSpec",
    "activation_bytes",
    "attention_bytes",
    "spec_from_config",
    "estimate",
    "kv_cache_bytes",
    "kv_cache_bytes_for",
    "model_state_bytes",
    "optimizer_state_bytes",
    # trace - the real step on fake tensors
    "Trace",
    "trace",
    "trace_events",
    "trace_step",
    # measure - real allocations, the truth
    "Measurement",
    "live_bytes",
    "measure_peak",
    "measure_step",
    # batch size
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
    # catalog - models and cards
    "GPU",
    "ModelEntry",
    "ModelTask",
    "build_model",
    "count_parameters",
    "current_gpu",
    "gpu",
    "list_gpus",
    "list_models",
    "model_config",
    "model_entry",
    # allocator - what the device shows
    "DEFAULT_CUDA_CONTEXT_BYTES",
    "AllocatorStats",
    "CachingAllocator",
    "cublas_workspace_bytes",
    "cuda_context_bytes",
    "measure_cuda_context",
    "replay",
    "round_request",
    "segment_size",
    "to_device",
    # several GPUs
    "DeviceMap",
    "DeviceShare",
    "Strategy",
    "deepspeed_zero_bytes",
    "evaluate_device_map",
    "min_gpus",
    "parse_strategy",
    "plan_device_map",
    "shard_estimate",
]
