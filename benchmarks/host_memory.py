"""Host memory predicted vs measured: load paths, DataLoader workers, cores and disk.

    PYTHONPATH=src python benchmarks/host_memory.py [--root DIR] [--parts loads,workers,...]

* ``loads``: a 1.1B-parameter Llama (TinyLlama's shape) saved in bf16 (one file, and as
  ``pytorch_model.bin`` / ``sd.pt``) and fp32 (1 GB shards), about 9 GB on disk under
  ``--root`` (kept for the next run). Each load path runs in a fresh process
  (`torchfit.host.measure_load`): its peak RSS above the baseline of a process that
  imported torch and transformers, against `torchfit.host.load_memory`. Quantized loads
  run three times with glibc's defaults (the spread is the allocator's) and once with a
  fixed ``MALLOC_MMAP_THRESHOLD_``.
* ``sweep``: hypothesis draws state dicts (sizes, dtypes, counts) for ``torch.load`` with
  and without ``mmap``, each measured in a fresh process.
* ``workers``: DataLoaders over lists of Python objects; each worker's USS
  (`torchfit.host.measure_workers`) against `torchfit.host.worker_memory`.
* ``feed``: a CPU-bound and a disk-bound dataset; samples/s at each worker count against
  `torchfit.host.Feed.throughput` from the loader's measured per-sample cost; then
  ``transfer``.
* ``transfer``: CPU-bound samples of 1 and 4 MiB, predicted with and without the cost of
  handing batches from the workers to the main process (`torchfit.host.measure_transfer`).
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, Dataset

from torchfit.host import (
    LoadSpec,
    SampleCost,
    feed_needs,
    load_memory,
    measure_disk,
    measure_load,
    measure_transfer,
    measure_workers,
    read_bytes_per_sample,
    worker_memory,
)
from torchfit.loaders import tuned_loader_and_report
from torchfit.loaders.machine import affinity_cpus

MiB = 2**20
FIXED = {"MALLOC_MMAP_THRESHOLD_": "1048576"}


def _row(label: str, predicted: float, measured: float, extra: str = "", unit: float = MiB) -> str:
    ratio = predicted / measured if measured else float("nan")
    return (
        f"| {label} | {predicted / unit:,.0f} | {measured / unit:,.0f} | {ratio:.3f} | "
        f"{abs(ratio - 1):.1%} |{extra}"
    )


def make_checkpoints(root: Path) -> dict[str, Path]:
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415 - optional

    paths = {name: root / name for name in ("bf16", "fp32-sharded", "bf16-bin")}
    if all((path / "config.json").exists() for path in paths.values()):
        return paths
    config = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                         num_attention_heads=32, num_key_value_heads=4, vocab_size=32000,
                         tie_word_embeddings=False)  # fmt: skip
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to_empty(device="cpu")
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.02)
    model = model.to(torch.bfloat16)
    model.save_pretrained(paths["bf16"])
    paths["bf16-bin"].mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(paths["bf16-bin"])
    torch.save(model.state_dict(), paths["bf16-bin"] / "pytorch_model.bin")
    model.to(torch.float32).save_pretrained(paths["fp32-sharded"], max_shard_size="1GB")
    return paths


LOADS = [
    ("bf16", {}, "safetensors, same dtype: views of the map"),
    ("bf16", {"device_map": "cpu"}, "device_map='cpu'"),
    ("fp32-sharded", {"dtype": "bf16"}, "5 shards, fp32 -> bf16 cast"),
    ("bf16", {"dtype": "fp32"}, "an fp32 load (before a cast)"),
    ("bf16", {"mmap": False}, "disable_mmap, one 2.2 GB file"),
    ("fp32-sharded", {"mmap": False}, "disable_mmap, 5 shards"),
    ("bf16-bin", {"dtype": "fp32"}, "pickle .bin (torch.load mmap) -> fp32"),
    ("bf16-bin", {"method": "torch.load", "mmap": False}, "torch.load"),
    ("bf16-bin", {"method": "torch.load", "mmap": True}, "torch.load(mmap=True)"),
    ("bf16-bin", {"method": "load_state_dict", "mmap": False}, "model + state dict"),
    ("bf16-bin", {"method": "assign", "mmap": True}, "meta model, assign=True, mmap"),
]


def loads(root: Path) -> None:
    paths = make_checkpoints(root)
    print("\n| load path | predicted peak MiB | measured peak MiB | ratio | error | notes |")
    print("|---|---|---|---|---|---|")
    for name, options, what in LOADS:
        predicted = load_memory(paths[name], **options)
        measured = measure_load(paths[name], LoadSpec(**options))
        label = f"`{LoadSpec(**options).describe()}` {name}"
        after = f" after {predicted.after / MiB:,.0f}/{measured.after / MiB:,.0f}, in use "
        after += f"{predicted.in_use / MiB:,.0f}/{measured.in_use / MiB:,.0f}; {what} |"
        print(_row(label, predicted.peak, measured.peak, after), flush=True)
    for bits in (4, 8):
        options = {"bits": bits, "device_map": "cpu"}
        predicted = load_memory(paths["bf16"], **options)
        runs = [measure_load(paths["bf16"], LoadSpec(**options)).peak for _ in range(3)]
        fixed = measure_load(paths["bf16"], LoadSpec(**options), env=FIXED).peak
        label = f"`{LoadSpec(**options).describe()}` bf16"
        spread = f" glibc defaults: {', '.join(f'{r / MiB:,.0f}' for r in runs)} |"
        print(_row(label + " (fixed mmap threshold)", predicted.peak, fixed, spread), flush=True)
        print(_row(label + " (median of 3, defaults)", predicted.peak, statistics.median(runs),
                   " |"), flush=True)  # fmt: skip


def sweep() -> None:
    print("\n| torch.load of a drawn state dict | predicted MiB | measured MiB | ratio | error |")
    print("|---|---|---|---|---|")

    @settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        count=st.integers(1, 40),
        mib=st.integers(1, 96),
        dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.int8]),
        mmap=st.booleans(),
    )
    def one(count: int, mib: int, dtype: torch.dtype, mmap: bool) -> None:  # noqa: FBT001
        numel = mib * MiB // dtype.itemsize // count
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "sd.pt"
            torch.save({f"t{i}": torch.ones(numel, dtype=dtype) for i in range(count)}, path)
            options = {"method": "torch.load", "mmap": mmap}
            predicted = load_memory("gpt2", path, **options)
            measured = measure_load(path, LoadSpec(**options))
        what = f"{count} x {numel * dtype.itemsize / MiB:.1f} MiB {dtype}, mmap={mmap}"
        value = predicted.in_use if mmap else predicted.peak
        print(_row(what, value, measured.in_use if mmap else measured.peak), flush=True)

    one()


class Records(Dataset):
    """Python objects per item, every field read (paths, (path, label) pairs, dicts)."""

    def __init__(self, count: int, kind: str) -> None:
        if kind == "paths":
            self.items: list[object] = [f"data/train/{i:010d}/image.jpg" for i in range(count)]
        elif kind == "pairs":
            self.items = [(f"img/{i}.png", float(i)) for i in range(count)]
        else:
            self.items = [{"id": i + 1000, "path": f"img/{i}.png", "w": i * 0.5}
                          for i in range(count)]  # fmt: skip

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> torch.Tensor:
        item = self.items[index]
        if isinstance(item, dict):
            _ = list(item.values())
        elif isinstance(item, tuple):
            _ = list(item)
        return torch.zeros(4)


def workers() -> None:
    print("\n| dataset | workers | shuffle | predicted MiB | measured (sum of USS) MiB | ratio"
          " | error |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for kind, count in (("paths", 2_000_000), ("pairs", 2_000_000), ("dicts", 1_000_000)):
        dataset = Records(count, kind)
        for num, shuffle in ((1, False), (2, False), (2, True), (4, False), (4, True)):
            loader = DataLoader(dataset, batch_size=256, num_workers=num, shuffle=shuffle)
            predicted = worker_memory(dataset, num_workers=num, batch_size=256, shuffle=shuffle)
            measured = measure_workers(loader)
            label = f"{count:,} {kind} | {num} | {shuffle}"
            print(_row(label, predicted.copies, measured.copies), flush=True)


class Decode(Dataset):
    """CPU-bound: decompress a 3x64x64 image and filter it (milliseconds of CPU; 12 KB out)."""

    def __init__(self) -> None:
        rng = np.random.default_rng(0)
        self.blob = zlib.compress(rng.integers(0, 4, 3 * 64 * 64, dtype=np.uint8).tobytes())

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, index: int) -> torch.Tensor:
        raw = np.frombuffer(zlib.decompress(self.blob), dtype=np.uint8).astype(np.float32)
        for _ in range(200):
            raw = np.sqrt(raw * 1.0001 + 1.0)
        return torch.from_numpy(raw.astype(np.uint8))


class Blocks(Dataset):
    """Disk-bound: each sample reads its own 1 MiB block of a file with O_DIRECT (no cache).

    Each process opens the file once and reads into one page-aligned buffer of its own.
    """

    def __init__(self, path: Path, blocks: int) -> None:
        self.path, self.blocks, self.start = path, blocks, 0
        self._open: tuple[int, int, mmap.mmap] | None = None

    def __len__(self) -> int:
        return self.blocks

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_open": None}

    def __getitem__(self, index: int) -> torch.Tensor:
        if self._open is None or self._open[0] != os.getpid():
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
            self._open = (os.getpid(), fd, mmap.mmap(-1, MiB))
        _, fd, buffer = self._open
        os.preadv(fd, [buffer], ((index + self.start) % self.blocks) * MiB)
        return torch.frombuffer(bytearray(buffer[:64]), dtype=torch.uint8)


def loader_rate(dataset: Dataset, num: int, batches: int, batch_size: int = 16) -> float:
    """Samples/s of a plain DataLoader with ``num`` workers, after its start-up batches."""
    if isinstance(dataset, Blocks):  # blocks no run read lately (a VM host caches them)
        dataset.start += (max(num, 1) * 2 + batches) * batch_size * 3
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=num)
    it = iter(loader)
    for _ in range(max(num, 1) * 2):
        next(it)  # start-up: every worker's first batches
    begin = time.perf_counter()
    for _ in range(batches):
        next(it)
    rate = batches * batch_size / (time.perf_counter() - begin)
    del it
    return rate


def _spin(seconds: float) -> float:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
    return time.process_time()


def effective_cores(seconds: float = 1.0) -> float:
    """CPUs this process really gets now: ``affinity`` spinners' CPU time over wall time.

    On a machine shared with other jobs the affinity mask promises more than the
    scheduler gives; the loader's speed follows what it gives.
    """
    from concurrent.futures import ProcessPoolExecutor  # noqa: PLC0415

    count = affinity_cpus()
    with ProcessPoolExecutor(count) as pool:
        return sum(pool.map(_spin, [seconds] * count)) / seconds


FEED_ROUNDS = 5


def _feed_row(label: str, predicted: list[float], measured: list[float]) -> str:
    low, high = min(measured), max(measured)
    spread = f" {low:,.0f}-{high:,.0f} |"
    return _row(label, statistics.median(predicted), statistics.median(measured), spread, unit=1)


def _feed_table(title: str) -> None:
    print(f"\n{title}")
    print("| dataset | workers | predicted samples/s | measured samples/s | ratio | error "
          "| measured, every round |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")


def feed(root: Path) -> None:
    """Each round measures what the prediction needs (cores the scheduler gives, the disk
    with the loader's pattern) just before the loader runs at 0-4 workers; the medians
    over the rounds are compared, and the measured spread is shown.
    """
    cores = affinity_cpus()
    decode = Decode()
    _, report = tuned_loader_and_report(decode, batch_size=16, time_budget=5.0)
    # the benchmark's loop has no training step: every core may load (cores + 1)
    plan = feed_needs(report, batch_size=16, step_seconds=0.001, cores=cores + 1)
    predicted: dict[int, list[float]] = {num: [] for num in range(5)}
    measured: dict[int, list[float]] = {num: [] for num in range(5)}
    usable = []
    for _ in range(FEED_ROUNDS):
        usable.append(effective_cores(0.5))
        for num in range(5):
            limit = max(usable[-1], 1.0) / plan.cost.cpu_seconds
            predicted[num].append(min(plan.throughput(num), limit))
            measured[num].append(loader_rate(decode, num, 40))
    _feed_table(f"{cores} cores in the affinity mask; the scheduler gave "
                f"{', '.join(f'{u:.2f}' for u in usable)} in the rounds. {plan.cost}")  # fmt: skip
    for num in range(5):
        print(_feed_row(f"CPU-bound decode | {num}", predicted[num], measured[num]), flush=True)
    data = root / "blocks.bin"
    blocks = 6144
    if not data.exists() or data.stat().st_size != blocks * MiB:
        chunk = os.urandom(MiB)
        with data.open("wb") as handle:
            for _ in range(blocks):
                handle.write(chunk)
    dataset = Blocks(data, blocks)
    _, report = tuned_loader_and_report(dataset, batch_size=16, time_budget=5.0)
    cost = SampleCost.from_report(report, read_bytes=read_bytes_per_sample(dataset, samples=4))
    predicted = {num: [] for num in range(5)}
    measured = {num: [] for num in range(5)}
    probes = []
    for _ in range(FEED_ROUNDS):
        # the loader's own pattern: its data file, 1 MiB samples in file order, 16 a batch
        disk = measure_disk(file=data, block="1MiB", threads=4, order="sequential", batch=16,
                            seconds=0.4, rounds=1)  # fmt: skip
        probes.append(disk)
        plan = feed_needs(cost, batch_size=16, step_seconds=0.001, cores=cores + 1, disk=disk)
        # a run right after another read faster on this VM, whatever its worker count (the
        # host's read-ahead?): each round starts the worker counts at another one
        for num in (*range(len(probes) % 5, 5), *range(len(probes) % 5)):
            predicted[num].append(plan.throughput(num))
            measured[num].append(loader_rate(dataset, num, 40))
    curves = "; ".join(", ".join(f"{rate / 2**30:.2f}" for rate in probe.curve) for probe in probes)
    _feed_table(f"Disk probe, GiB/s at 1-4 readers, per round: {curves}. {cost}")
    for num in range(5):
        label = f"disk-bound 1 MiB blocks | {num}"
        print(_feed_row(label, predicted[num], measured[num]), flush=True)


class Blobs(Dataset):
    """CPU-bound, large out: about 1.5 ms of arithmetic on 4 KiB, then a ``size``-byte tensor."""

    def __init__(self, size: int) -> None:
        self.out = torch.ones(size, dtype=torch.uint8)
        self.work = np.ones(1024, dtype=np.float32)

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, index: int) -> torch.Tensor:
        raw = self.work
        for _ in range(300):
            raw = np.sqrt(raw * 1.0001 + 1.0)
        return self.out


def transfer() -> None:
    """Per round: the cores the scheduler gives, the transfer probe at the sample's size,
    then 0-4 workers (the first count moving round by round). Before: `Feed.throughput`
    with ``out_bytes=0``; after: with the sample's bytes and the measured transfer. All
    the loader's processes share the cores the scheduler gives, the main process's
    receiving included.
    """
    cores = affinity_cpus()
    for size in (MiB, 4 * MiB):
        dataset = Blobs(size)
        _, report = tuned_loader_and_report(dataset, batch_size=16, time_budget=5.0)
        out = SampleCost.from_report(report, batch_size=16).out_bytes
        kinds = ("before", "after", "measured")
        rows: dict[str, dict[int, list[float]]] = {k: {n: [] for n in range(5)} for k in kinds}
        usable, probes = [], []
        for round_ in range(FEED_ROUNDS):
            usable.append(effective_cores(0.5))
            probes.append(measure_transfer(sample_bytes=size, batch_size=16))
            # the main-process cost drifts 2x on this machine: measure it in the round
            alone = loader_rate(dataset, 0, 24)
            load = report.cpu_load or 1.0
            before_cost = SampleCost.from_rate(alone, cpu_load=load)
            after_cost = SampleCost.from_rate(alone, cpu_load=load, out_bytes=out)
            before = feed_needs(before_cost, batch_size=16, step_seconds=0.001, cores=cores + 1)
            after = feed_needs(after_cost, batch_size=16, step_seconds=0.001, cores=cores + 1,
                               transfer=probes[-1])  # fmt: skip
            for num in (*range(round_ % 4 + 1, 5), *range(1, round_ % 4 + 1)):
                extra, receive = after.handoff() if num else (0.0, 0.0)
                cpu = after.cost.cpu_seconds
                given = max(usable[-1], 1.0)
                rows["before"][num].append(min(before.throughput(num), given / cpu))
                rows["after"][num].append(
                    min(after.throughput(num), given / (cpu + extra + receive))
                )
                rows["measured"][num].append(loader_rate(dataset, num, 24))
            for kind in kinds:
                rows[kind][0].append(alone)
        print(f"\n{size // MiB} MiB samples, batch 16; cpu_load {report.cpu_load}; out "
              f"{after.cost.out_bytes / MiB:.2f} MiB a sample; cores given "
              f"{', '.join(f'{u:.2f}' for u in usable)}; transfer per round:")  # fmt: skip
        for probe in probes:
            print(f"  {probe} (spread {probe.spread:.2f})")
        print_against(("before", "after"), {n: {k: rows[k][n] for k in kinds} for n in range(5)})


def print_against(
    names: tuple[str, str], rows: dict[int, dict[str, list[float]]], *, digits: int = 0
) -> None:
    """Two predictions of samples/s against the measured, per worker count: medians of the
    rounds, and every round's measurement."""
    first, second = names
    print(f"| workers | {first} samples/s | {second} samples/s | measured samples/s | "
          f"{first} error | {second} error | measured, every round |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    form = f",.{digits}f"
    for num, row in rows.items():
        med = {key: statistics.median(values) for key, values in row.items()}
        low, high, measured = min(row["measured"]), max(row["measured"]), med["measured"]
        print(f"| {num} | {med[first]:{form}} | {med[second]:{form}} | {measured:{form}} "
              f"| {med[first] / measured - 1:+.1%} | {med[second] / measured - 1:+.1%} "
              f"| {low:{form}}-{high:{form}} |", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / "torchfit-host")
    parser.add_argument("--parts", default="loads,sweep,workers,feed")
    args = parser.parse_args()
    args.root.mkdir(parents=True, exist_ok=True)
    # one torch thread, as in a DataLoader worker: idle OpenMP threads spinning after a
    # collate would take the main process's CPU from its samples on a small machine
    torch.set_num_threads(1)
    parts = args.parts.split(",")
    if "loads" in parts:
        loads(args.root)
    if "sweep" in parts:
        sweep()
    if "workers" in parts:
        workers()
    if "feed" in parts:
        feed(args.root)
    if "feed" in parts or "transfer" in parts:
        transfer()


if __name__ == "__main__":
    main()
