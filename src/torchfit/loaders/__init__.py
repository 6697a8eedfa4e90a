"""DataLoaders tuned by measurement, and a diagnosis of input-bound training.

`tuned_loader` returns a plain ``torch.utils.data.DataLoader`` whose ``num_workers``,
``prefetch_factor``, ``pin_memory`` and ``persistent_workers`` were chosen by timing
the real dataset and collate function for a few seconds. `tuned_loader_and_report`
returns the same loader with a `LoaderReport` of what was tried and why the winner won. The probe
respects the machine (CPU affinity, cgroup quota, ranks per node, ``/dev/shm``), and
leaves nothing behind: no worker process, and the RNGs, sampler generators and dataset
as it found them.

`diagnose` runs a few real training steps and says how much of each step waits for
data.
"""

from torchfit.loaders.machine import MachineBudget
from torchfit.loaders.report import Bound, Diagnosis, LoaderConfig, LoaderReport, LoaderTrial
from torchfit.loaders.tuning import (
    LoaderWarning,
    check_shm,
    diagnose,
    tuned_loader,
    tuned_loader_and_report,
)

__all__ = [
    # tuning
    "LoaderConfig",
    "LoaderReport",
    "LoaderTrial",
    "LoaderWarning",
    "MachineBudget",
    "check_shm",
    "tuned_loader",
    "tuned_loader_and_report",
    # diagnosis
    "Bound",
    "Diagnosis",
    "diagnose",
]
