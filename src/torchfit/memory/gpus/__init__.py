"""GPU catalog: memory, bandwidth and tensor-core peaks of common cards, and a forgiving lookup."""

from torchfit.memory.gpus.card import GPU
from torchfit.memory.gpus.lookup import current_gpu, gpu, list_gpus

__all__ = [
    "GPU",
    "current_gpu",
    "gpu",
    "list_gpus",
]
