"""torchfit: will it fit, what is the biggest batch, and how to make it smaller and faster.

Importing torchfit loads only torch and numpy; transformers, accelerate, bitsandbytes
and matplotlib load when a function that needs them is called.
"""

from torchfit import host, loaders, memory, precision, quantize, speed
from torchfit._core.units import DType, format_bytes, parse_bytes, parse_dtype
from torchfit.host import host_fits
from torchfit.loaders import diagnose, tuned_loader, tuned_loader_and_report
from torchfit.memory import (
    GPU,
    MemoryEstimate,
    estimate,
    find_batch_size,
    gpu,
    measure_peak,
    simulate_gpu,
)
from torchfit.memory.plan import Plan
from torchfit.memory.step import Step
from torchfit.precision import MixedPrecision, find_nonfinite
from torchfit.speed import compare_gpus, step_time
from torchfit.whole import fits

__version__ = "0.1.0"

# Units and dtypes are defined in the private bottom layer; their public home is here.
for _name in ("DType", "format_bytes", "parse_bytes", "parse_dtype"):
    globals()[_name].__module__ = __name__
del _name

__all__ = [
    "GPU",
    "DType",
    "MemoryEstimate",
    "MixedPrecision",
    "Plan",
    "Step",
    "__version__",
    "compare_gpus",
    "diagnose",
    "estimate",
    "find_batch_size",
    "find_nonfinite",
    "fits",
    "format_bytes",
    "gpu",
    "host",
    "host_fits",
    "loaders",
    "measure_peak",
    "memory",
    "parse_bytes",
    "parse_dtype",
    "precision",
    "quantize",
    "simulate_gpu",
    "speed",
    "step_time",
    "tuned_loader",
    "tuned_loader_and_report",
]
