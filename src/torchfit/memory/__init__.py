"""Memory estimation: predict, measure, and decide.

Estimators return a `MemoryEstimate`; `measure_peak` is the real-allocation truth they
are tested against.
"""

from torchfit.memory.estimate import CATEGORIES, AffineEstimate, LayerMemory, MemoryEstimate
from torchfit.memory.gpus import GPU, gpu, list_gpus
from torchfit.memory.measure import Measurement, live_bytes, measure_peak, measure_step

__all__ = [
    "CATEGORIES",
    "GPU",
    "AffineEstimate",
    "LayerMemory",
    "Measurement",
    "MemoryEstimate",
    "gpu",
    "list_gpus",
    "live_bytes",
    "measure_peak",
    "measure_step",
]
