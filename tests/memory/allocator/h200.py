"""The H200 snapshot data in ``data/``: real steps, their recipes and measured peaks.

Two runs measured by this project on an NVIDIA H200 (torch 2.11.0+cu130, driver
580.159.04), written by ``data/make_h200_snapshots.py``: ``a`` (seven training steps) and
``b`` (eleven training steps and one forward, from ``benchmarks/gpu_check.py``).
"""

import functools
import gzip
import json
from pathlib import Path

DATA = Path(__file__).with_name("data")
FILES = {"a": DATA / "h200_snapshots.json.gz", "b": DATA / "h200_b_snapshots.json.gz"}


@functools.cache
def run(name):
    """The cases of run ``name``, by case name."""
    cases = json.loads(gzip.decompress(FILES[name].read_bytes()))["cases"]
    return {case["case"]: case for case in cases}


def case(name):
    """One case of either run, by its name."""
    for runs in FILES:
        if name in run(runs):
            return run(runs)[name]
    raise KeyError(name)
