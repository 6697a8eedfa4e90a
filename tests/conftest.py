"""Test-wide settings: deterministic property tests under CI, and a frozen old heap.

Locally, hypothesis explores new examples on every run. Under CI (``CI`` set) it uses a
derandomized profile, so a green run is reproducible and CI never fails on an example
nobody has seen; the examples it runs are still the generated ones, not a fixed list.

torchfit runs ``gc.collect()`` after every out-of-memory trial of a batch-size search
(``torchfit/memory/batch/search.py``) and around every measurement. A full collection
walks every tracked object, and once collection has imported torch, transformers and
every test module that is about a million objects: 0.1-0.4 s a call, seconds per search
test. ``gc.freeze()`` moves the objects alive now into a permanent generation that
collections skip (https://docs.python.org/3/library/gc.html#gc.freeze); whatever a test
creates is still collected exactly as before. The heap is frozen once collection is done
and again before each test module (after the previous module's fixtures are gone).

Under pytest-xdist (``-n auto --dist worksteal`` in pyproject's addopts; ``-n0`` runs one
process), torch gives each process one thread per core by default, so two workers on two
cores would run four OpenMP threads that spin waiting for each other (a set of real
training steps took 96 s that way and 21 s with one thread a worker): each worker gets its
share of the cores.
"""

import gc
import os
from pathlib import Path

import pytest
import torch
from hypothesis import settings

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


def freeze_the_heap() -> None:
    """Collect what is garbage now, then keep every survivor out of later collections."""
    gc.collect()
    gc.freeze()


def pytest_configure(config: pytest.Config) -> None:
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:  # this process is one of pytest-xdist's workers
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        share = max(1, (cores or 1) // int(workers))
        torch.set_num_threads(share)


def pytest_collection_finish(session: pytest.Session) -> None:
    freeze_the_heap()


_last_module: list[Path] = []


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if _last_module != [item.path]:
        _last_module[:] = [item.path]
        freeze_the_heap()
