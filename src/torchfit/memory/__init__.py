"""Memory estimation: predict, measure, and decide.

Estimators return a `MemoryEstimate`; `measure_peak` is the real-allocation truth they
are tested against.
"""

from torchfit.memory.activations import ActivationReport, activation_bytes
from torchfit.memory.allocator import (
    DEFAULT_CUDA_CONTEXT_BYTES,
    AllocatorStats,
    CachingAllocator,
    cublas_workspace_bytes,
    cuda_context_bytes,
    replay,
    round_request,
    segment_size,
    to_device,
)
from torchfit.memory.analytic import estimate
from torchfit.memory.arch import TransformerSpec, describe
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
from torchfit.memory.estimate import CATEGORIES, AffineEstimate, LayerMemory, MemoryEstimate
from torchfit.memory.formulas import (
    attention_bytes,
    kv_cache_bytes,
    kv_cache_bytes_for,
    model_state_bytes,
    optimizer_state_bytes,
)
from torchfit.memory.gpus import GPU, current_gpu, gpu, list_gpus
from torchfit.memory.measure import Measurement, live_bytes, measure_peak, measure_step
from torchfit.memory.plan import Advice, Plan, fits
from torchfit.memory.sharding import (
    Strategy,
    deepspeed_zero_bytes,
    min_gpus,
    parse_strategy,
    shard_estimate,
)
from torchfit.memory.trace import Trace, trace, trace_events, trace_step

__all__ = [
    "CATEGORIES",
    "DEFAULT_CUDA_CONTEXT_BYTES",
    "GPU",
    "ActivationReport",
    "Advice",
    "AffineEstimate",
    "AllocatorStats",
    "BatchSizeResult",
    "BatchTrial",
    "CachingAllocator",
    "DeviceMap",
    "DeviceShare",
    "LayerMemory",
    "Margin",
    "Measurement",
    "MemoryEstimate",
    "ModelEntry",
    "ModelTask",
    "Plan",
    "SimulatedGPU",
    "Strategy",
    "Trace",
    "TransformerSpec",
    "TrialOutcome",
    "activation_bytes",
    "attention_bytes",
    "build_model",
    "count_parameters",
    "cublas_workspace_bytes",
    "cuda_context_bytes",
    "current_gpu",
    "deepspeed_zero_bytes",
    "describe",
    "estimate",
    "evaluate_device_map",
    "find_batch_size",
    "fits",
    "gpu",
    "is_oom",
    "kv_cache_bytes",
    "kv_cache_bytes_for",
    "list_gpus",
    "list_models",
    "live_bytes",
    "max_batch_size",
    "measure_peak",
    "measure_step",
    "min_gpus",
    "model_config",
    "model_entry",
    "model_state_bytes",
    "optimizer_state_bytes",
    "parse_strategy",
    "plan_device_map",
    "replay",
    "round_request",
    "segment_size",
    "shard_estimate",
    "simulate_gpu",
    "solve_batch_size",
    "to_device",
    "trace",
    "trace_events",
    "trace_step",
]
