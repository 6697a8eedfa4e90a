"""The rest of the machine: host RAM, CPU cores and disk speed for a run.

`host_fits` gives one answer for a machine: the RAM a model needs while it loads and
while it runs, against the machine's RAM, and (given a step time) the cores and disk
speed that keep the card fed. Its parts stand alone:

* loading: `load_memory` predicts the peak RSS of a load path (``from_pretrained`` with
  memory maps or not, casts, shards, bitsandbytes on load, a device map; ``torch.load``
  with or without ``mmap``; ``load_state_dict`` into a built model or with
  ``assign=True``), by kind: anonymous pages that must fit, file-backed pages the kernel
  can drop. `measure_load` measures the same path in a fresh process.
* running: `worker_memory` / `measure_workers` for DataLoader workers (copy-on-write of
  the dataset's Python objects, batches in ``/dev/shm``, pinned buffers);
  `optimizer_offload_bytes` and `kv_offload_bytes` for state kept on the host.
* feeding: `feed_needs` turns the loader's per-sample cost and a step time into workers,
  cores and read speed, against the machine (`measure_disk` reads the disk with the page
  cache kept out; `measure_transfer` what handing a batch from a worker costs), and says
  whether the GPU, the CPU or the disk bounds the run.

Example:
    >>> plan = host_fits("llama-3.1-8b", "workstation-a100", bits=4)
    >>> plan.verdict.value, plan.load.must_fit < 2**30
    ('fits', True)
"""

from torchfit.host.checkpoint import (
    Checkpoint,
    CheckpointFormat,
    StoredTensor,
    imagine_checkpoint,
    read_checkpoint,
)
from torchfit.host.disk import DiskSpeed, measure_disk
from torchfit.host.feed import Feed, FeedBound, SampleCost, feed_needs, read_bytes_per_sample
from torchfit.host.load import load_memory
from torchfit.host.machines import EXAMPLE_MACHINES, Machine, machine, this_machine
from torchfit.host.measure import LoadMeasurement, measure_load
from torchfit.host.offload import kv_offload_bytes, optimizer_offload_bytes
from torchfit.host.plan import HostPlan, HostVerdict, host_fits
from torchfit.host.result import LoadMemory
from torchfit.host.rss import RssMeasurement, RssSample, measure_rss, read_rss
from torchfit.host.spec import LoadMethod, LoadSpec
from torchfit.host.transfer import TYPICAL_TRANSFER, TransferCost, measure_transfer
from torchfit.host.workers import WorkerMeasurement, WorkerMemory, measure_workers, worker_memory

__all__ = [
    # one answer for a machine
    "EXAMPLE_MACHINES",
    "HostPlan",
    "HostVerdict",
    "Machine",
    "host_fits",
    "machine",
    "this_machine",
    # loading a model
    "Checkpoint",
    "CheckpointFormat",
    "LoadMemory",
    "LoadMethod",
    "LoadSpec",
    "StoredTensor",
    "imagine_checkpoint",
    "load_memory",
    "read_checkpoint",
    # running: DataLoader workers, offloaded state
    "WorkerMemory",
    "kv_offload_bytes",
    "optimizer_offload_bytes",
    "worker_memory",
    # feeding the card: cores and disk
    "DiskSpeed",
    "Feed",
    "FeedBound",
    "SampleCost",
    "TYPICAL_TRANSFER",
    "TransferCost",
    "feed_needs",
    "measure_disk",
    "measure_transfer",
    "read_bytes_per_sample",
    # measuring: the truth
    "LoadMeasurement",
    "RssMeasurement",
    "RssSample",
    "WorkerMeasurement",
    "measure_load",
    "measure_rss",
    "measure_workers",
    "read_rss",
]
