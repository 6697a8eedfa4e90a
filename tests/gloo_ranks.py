"""Real CPU ranks for the distributed tests: start, join, save, leave.

Each test's worker is ``worker(rank, *args, port, out_dir)``-shaped code of its own; this
module holds what every one of them repeats: a free loopback port, the gloo process
group, and the way out of a rank once its results are on disk.
"""

import datetime as dt
import json
import multiprocessing
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

#: What the fork server imports once for every rank it forks: spawn imports torch and
#: torchfit in each rank (about 2 s each, 6 ranks a test file on a busy 2-core machine).
PRELOAD = ["torch", "torch.distributed", "torchfit.memory", "torchfit.loaders"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ranks(worker: Callable[..., None], args: tuple, nprocs: int) -> None:
    """Run ``worker(rank, *args)`` in ``nprocs`` processes forked from a fork server; join.

    The server is a fresh process (no OpenMP threads to inherit) that has imported
    `PRELOAD`; the first call in a test process starts it with that list, so every test
    that starts ranks goes through here.
    """
    multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
    threads = max(1, torch.get_num_threads() // nprocs)  # this pytest worker's share of cores
    mp.start_processes(
        _rank, args=(worker, threads, args), nprocs=nprocs, join=True, start_method="forkserver"
    )


def _rank(rank: int, worker: Callable[..., None], threads: int, args: tuple) -> None:
    """One rank: its share of the caller's threads (torch's default, a thread per core,
    would spin against the other ranks and pytest workers), then ``worker(rank, *args)``."""
    torch.set_num_threads(threads)
    worker(rank, *args)


def init_gloo(rank: int, world_size: int, port: int) -> None:
    """Join the gloo process group of ``world_size`` ranks on the loopback ``port``."""
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=dt.timedelta(seconds=60),
    )


def save_and_leave(out_dir: Path, rank: int, results: object) -> None:
    """Write this rank's results as JSON, then `leave`."""
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(results))
    leave()


def leave() -> None:
    """Leave a rank without interpreter teardown, once its results are saved.

    torch 2.13's gloo threads sometimes abort the process at interpreter exit ("terminate
    called without an active exception": 1 run in 12 seen, a barrier before teardown did
    not help); the results are on disk by then, so the rank exits directly with status 0.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def read_ranks(out_dir: Path, world_size: int) -> list[object]:
    """Every rank's saved results, in rank order."""
    return [json.loads((Path(out_dir) / f"rank{r}.json").read_text()) for r in range(world_size)]
