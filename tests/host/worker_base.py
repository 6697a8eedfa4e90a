"""A worker's own pages under a fresh script that imported torch: `measure_workers`' USS
and dirty pages of its one worker, as JSON.

Run as ``python worker_base.py [numpy]``: with ``numpy``, the script imports
``numpy.random`` before the loader starts, as most training scripts do (transformers,
torchvision and pandas import it); without it, each worker imports it when it seeds
NumPy's generator. A fresh interpreter gives the parent a known heap: the pytest process
has imported and freed things that change what a forked worker copies.
"""

import json
import sys

import torch  # noqa: F401 - the state the constant describes: a script that imported torch
from torch.utils.data import DataLoader

from torchfit.host import measure_workers

if __name__ == "__main__":
    if sys.argv[1:] == ["numpy"]:
        import numpy.random  # noqa: F401
    measured = measure_workers(DataLoader(range(40_000), batch_size=128, num_workers=1))
    print(json.dumps({"uss": measured.uss[0], "dirty": measured.dirty[0]}))  # noqa: T201
