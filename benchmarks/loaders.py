"""tuned_loader against the default DataLoader, common heuristics and an exhaustive grid.

Two datasets, both defined at module level (picklable under fork and spawn):

- ``decode``: CPU-bound. Each sample is a zlib-compressed 3x96x96 image, decompressed
  and augmented (resize, random crop, flip, 3x3 blur, normalize): milliseconds of CPU.
- ``io``: I/O-like. Each sample waits 4 ms (a network or disk read; ``time.sleep``
  releases the CPU) and then decodes a small buffer. More workers than CPUs pay off.

Every configuration is measured the same way, by this script's own timer (not the
tuner's): steady-state samples/s after the batches in flight at start-up, ``--seconds``
long; the median of ``--repeats`` rounds, each round measuring every configuration once
in a shuffled order (background load drifts over all of them alike). The grid is
num_workers x prefetch_factor.
The script runs with one torch thread (see ``main``). ``tuned`` runs `tuned_loader_and_report`
``--tune-runs`` times with its default 10 s budget and measures each chosen
configuration like the others.

Run:  python benchmarks/loaders.py --output loaders.md  (then paste into docs/benchmarks.md)
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
import warnings
import zlib
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional
from torch.utils.data import DataLoader, Dataset

from torchfit.loaders import tuned_loader_and_report
from torchfit.loaders.machine import machine_budget

GRID_WORKERS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
GRID_PREFETCH = (2, 4)
BATCH_SIZE = 16


class DecodeAugment(Dataset):
    """CPU-bound: decompress a 3x96x96 image, resize, crop, flip, blur, normalize."""

    def __init__(self, n: int = 1_000_000, side: int = 96) -> None:
        self.n, self.side = n, side
        rng = np.random.default_rng(0)
        smooth = np.cumsum(rng.integers(0, 3, (3, side, side), dtype=np.uint8), axis=2)
        self.blob = zlib.compress(smooth.astype(np.uint8).tobytes(), level=6)
        self.kernel = torch.full((3, 1, 3, 3), 1 / 9)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        raw = np.frombuffer(zlib.decompress(self.blob), dtype=np.uint8)
        image = torch.from_numpy(raw.reshape(3, self.side, self.side).copy()).float()[None]
        gen = torch.Generator().manual_seed(i)
        for _ in range(4):  # several augmentation passes: ~ms of CPU per sample
            big = functional.interpolate(image, size=(self.side + 32,) * 2, mode="bilinear")
            top, left = torch.randint(0, 33, (2,), generator=gen).tolist()
            image = big[..., top : top + self.side, left : left + self.side]
            if torch.rand((), generator=gen) < 0.5:
                image = image.flip(-1)
            image = functional.conv2d(image, self.kernel, padding=1, groups=3)
        image = (image - image.mean()) / (image.std() + 1e-6)
        return image[0], i % 10


class RemoteRecords(Dataset):
    """I/O-like: wait ``latency`` seconds per sample (a read), then decode 4 KiB."""

    def __init__(self, n: int = 1_000_000, latency: float = 0.004) -> None:
        self.n, self.latency = n, latency
        self.record = np.arange(1024, dtype=np.float32).tobytes()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.latency)
        values = np.frombuffer(self.record, dtype=np.float32) + i
        return torch.from_numpy(values.copy()), i % 10


def measure_once(loader: DataLoader, seconds: float) -> float:
    """Steady-state samples/s: skip the batches in flight at start, then time ``seconds``.

    Workers start one after another and prefetch meanwhile, so the first
    ``workers x (prefetch + 1)`` batches arrive in a burst; they are not timed.
    """
    it = iter(loader)
    for _ in range(max(1, loader.num_workers) * ((loader.prefetch_factor or 0) + 1)):
        next(it)
    samples, start = 0, time.perf_counter()
    while (now := time.perf_counter()) - start < seconds:
        samples += len(next(it)[1])
    rate = samples / (now - start)
    del it  # the iterator's __del__ shuts its workers down
    return rate


def make_loader(dataset: Dataset, workers: int, prefetch: int | None) -> DataLoader:
    return DataLoader(
        dataset,
        batch_size=BATCH_SIZE,
        shuffle=True,
        num_workers=workers,
        prefetch_factor=prefetch if workers else None,
    )


def measure_all(
    dataset: Dataset, configs: list[tuple[int, int | None]], args: argparse.Namespace, rounds: int
) -> dict[tuple[int, int | None], list[float]]:
    """Rounds that each measure every configuration once, in a shuffled order.

    Background load then drifts over all configurations alike.
    """
    runs: dict[tuple[int, int | None], list[float]] = {cfg: [] for cfg in configs}
    order = random.Random(0)
    for round_index in range(rounds):
        shuffled = list(configs)
        order.shuffle(shuffled)
        for workers, prefetch in shuffled:
            rate = measure_once(make_loader(dataset, workers, prefetch), args.seconds)
            runs[workers, prefetch].append(rate)
        print(f"  round {round_index + 1}/{rounds} of {len(configs)} configurations done")
    return runs


def per_sample_ms(dataset: Dataset) -> tuple[float, float]:
    """Wall and CPU milliseconds per sample, in this process."""
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(50):
        dataset[i]
    return (time.perf_counter() - wall) * 20, (time.process_time() - cpu) * 20


def tune(
    dataset: Dataset, args: argparse.Namespace
) -> list[tuple[tuple[int, int | None], float, int]]:
    tuned = []
    for run_index in range(args.tune_runs):
        start = time.perf_counter()
        _, report = tuned_loader_and_report(dataset, batch_size=BATCH_SIZE, shuffle=True)
        cost = time.perf_counter() - start
        key = (report.chosen.num_workers, report.chosen.prefetch_factor)
        tuned.append((key, cost, len(report.trials)))
        print(f"  tuned run {run_index + 1}: {key}, tuning {cost:.1f} s")
        if args.verbose:
            print(report)
    return tuned


def run(name: str, dataset: Dataset, args: argparse.Namespace) -> list[str]:
    load_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    wall_ms, cpu_ms = per_sample_ms(dataset)
    print(f"\n## {name}: {wall_ms:.2f} ms/sample wall, {cpu_ms:.2f} ms CPU")
    tuned = tune(dataset, args)
    cpus = os.cpu_count() or 1
    grid = [(w, p) for w in GRID_WORKERS for p in (GRID_PREFETCH if w else (None,))]
    configs = list(dict.fromkeys([*grid, (cpus, 2), *(key for key, _, _ in tuned)]))
    runs = measure_all(dataset, configs, args, args.repeats)
    grid_rate = {cfg: statistics.median(values) for cfg, values in runs.items()}
    best_key = max(grid, key=lambda k: grid_rate[k])
    # The best of many noisy medians is biased upwards (the winner's curse): the table
    # compares fresh, interleaved measurements of the configurations it names.
    named = list(dict.fromkeys([(0, None), (4, 2), (cpus, 2), best_key, *(k for k, _, _ in tuned)]))
    runs = measure_all(dataset, named, args, args.confirm)
    rate = {cfg: statistics.median(values) for cfg, values in runs.items()}
    default, best = rate[0, None], rate[best_key]
    rows = [
        ("default `DataLoader(num_workers=0)`", (0, None), "-"),
        ("heuristic `num_workers=4`", (4, 2), "-"),
        (f"heuristic `num_workers=os.cpu_count()` ({cpus})", (cpus, 2), "-"),
        (f"best of the grid ({len(grid)} configurations)", best_key, "-"),
    ]
    rows += [
        (f"`tuned_loader`, run {i + 1} ({n} trials)", key, f"{cost:.1f} s")
        for i, (key, cost, n) in enumerate(tuned)
    ]
    lines = [
        f"### `{name}`: {wall_ms:.2f} ms/sample wall, {cpu_ms:.2f} ms CPU; batch {BATCH_SIZE}",
        "",
        (
            "| loader | workers | prefetch | samples/s (median) | runs min-max | vs default "
            "| vs grid best | tuning time |"
        ),
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, (workers, prefetch), cost in rows:
        r, spread = rate[workers, prefetch], runs[workers, prefetch]
        lines.append(
            f"| {label} | {workers} | {prefetch or '-'} | {r:,.0f} | "
            f"{min(spread):,.0f}-{max(spread):,.0f} | {r / default:.2f}x | {r / best:.0%} "
            f"| {cost} |"
        )
    lines += [
        "",
        (
            f"Grid ({args.repeats} interleaved rounds; median samples/s; rows: num_workers, "
            "columns: prefetch_factor). The table above re-measures the configurations it "
            f"names in {args.confirm} fresh interleaved rounds."
        ),
        "",
    ]
    lines += ["| workers | " + " | ".join(f"prefetch {p}" for p in GRID_PREFETCH) + " |"]
    lines += ["| ---: | " + " | ".join("---:" for _ in GRID_PREFETCH) + " |"]
    lines.append(
        f"| 0 | {grid_rate[0, None]:,.0f} (no workers) |" + " |" * (len(GRID_PREFETCH) - 1)
    )
    lines += [
        f"| {w} | " + " | ".join(f"{grid_rate[w, p]:,.0f}" for p in GRID_PREFETCH) + " |"
        for w in GRID_WORKERS
        if w
    ]
    load_end = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines.insert(1, f"\nLoad average {load_start:.1f} at the start, {load_end:.1f} at the end.")
    ratios = [rate[key] / best for key, _, _ in tuned]
    if ratios:
        lines += [
            "",
            (
                f"Tuned runs reach {', '.join(f'{r:.0%}' for r in ratios)} of the grid's best "
                f"(target: >= 95%); tuning took {max(c for _, c, _ in tuned):.1f} s at most."
            ),
        ]
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.5, help="timed seconds per run")
    parser.add_argument("--repeats", type=int, default=3, help="runs per configuration (median)")
    parser.add_argument("--confirm", type=int, default=5, help="re-measuring rounds")
    parser.add_argument(
        "--tune-runs", type=int, default=3, help="tuned_loader_and_report runs per dataset"
    )
    parser.add_argument("--only", choices=("decode", "io"), help="one dataset only")
    parser.add_argument("--output", type=Path, help="write the markdown fragment here")
    parser.add_argument("--verbose", action="store_true", help="print each tuning report")
    args = parser.parse_args()
    # torch warns when num_workers exceeds its CPU count; the grid does that on purpose.
    warnings.filterwarnings("ignore", message=r"This DataLoader will create \d+ worker")
    # One intra-op thread in this process too, as in a DataLoader worker: on a shared,
    # oversubscribed machine two OpenMP threads spin-waiting on each other made the
    # main-process default 10x slower than one thread. This favours the default.
    torch.set_num_threads(1)
    budget = machine_budget()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    header = [
        "## DataLoader tuning (`torchfit.loaders`)",
        "",
        (
            f"Machine: {budget.describe()}; torch {torch.__version__}; load average at start "
            f"{load:.1f} (other jobs shared these CPUs). Measured: steady-state samples/s, "
            f"{args.seconds:g} s per run, median of interleaved rounds."
        ),
        "",
        "Regenerate: `python benchmarks/loaders.py --output loaders.md`, then paste the",
        "file into docs/benchmarks.md.",
        "",
    ]
    sets = {"decode": DecodeAugment(), "io": RemoteRecords()}
    lines = list(header)
    for name, dataset in sets.items():
        if args.only in (None, name):
            lines += run(name, dataset, args)
    text = "\n".join(lines)
    print("\n" + text)
    if args.output:
        args.output.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
