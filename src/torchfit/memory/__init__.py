"""Memory estimation: predict, measure, and decide.

Estimators return a `MemoryEstimate`; `measure_peak` is the real-allocation truth they
are tested against.
"""

from torchfit.memory.catalog import (
    ModelEntry,
    ModelTask,
    build_model,
    count_parameters,
    list_models,
    model_config,
    model_entry,
)
from torchfit.memory.estimate import CATEGORIES, AffineEstimate, LayerMemory, MemoryEstimate
from torchfit.memory.gpus import GPU, current_gpu, gpu, list_gpus
from torchfit.memory.measure import Measurement, live_bytes, measure_peak, measure_step

__all__ = [
    "CATEGORIES",
    "GPU",
    "AffineEstimate",
    "LayerMemory",
    "Measurement",
    "MemoryEstimate",
    "ModelEntry",
    "ModelTask",
    "build_model",
    "count_parameters",
    "current_gpu",
    "gpu",
    "list_gpus",
    "list_models",
    "live_bytes",
    "measure_peak",
    "measure_step",
    "model_config",
    "model_entry",
]
