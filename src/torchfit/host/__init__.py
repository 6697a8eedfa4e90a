"""The rest of the machine: host RAM, CPU cores and disk speed for a run.

(Work in progress.)
"""

from torchfit.host.checkpoint import (
    Checkpoint,
    CheckpointFormat,
    StoredTensor,
    imagine_checkpoint,
    read_checkpoint,
)
from torchfit.host.load import load_memory
from torchfit.host.measure import LoadMeasurement, measure_load
from torchfit.host.result import LoadMemory
from torchfit.host.rss import RssMeasurement, RssSample, measure_rss, read_rss
from torchfit.host.spec import LoadMethod, LoadSpec

__all__ = [
    "Checkpoint",
    "CheckpointFormat",
    "StoredTensor",
    "imagine_checkpoint",
    "read_checkpoint",
    "load_memory",
    "LoadMeasurement",
    "measure_load",
    "LoadMemory",
    "RssMeasurement",
    "RssSample",
    "measure_rss",
    "read_rss",
    "LoadMethod",
    "LoadSpec",
]
from torchfit.host.workers import WorkerMeasurement, WorkerMemory, measure_workers, worker_memory
