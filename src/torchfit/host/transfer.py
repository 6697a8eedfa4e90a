"""What moving a batch from a DataLoader worker to the main process costs, in CPU time.

With ``num_workers=0`` the main process stacks its samples into ordinary heap memory. A
worker stacks them into shared memory it allocates for every batch (``default_collate``:
``elem._typed_storage()._new_shared(numel)`` when ``get_worker_info()`` is set,
torch/utils/data/_utils/collate.py, torch 2.13), so each batch's pages are created and
faulted in anew; the batch then travels as a file descriptor (``reduce_storage``, the
``file_descriptor`` strategy, torch/multiprocessing/reductions.py), and the main process
unpickles it, receives the descriptor, maps it (``rebuild_storage_fd``) and, when it drops
the batch, unmaps it and frees the pages. Both sides pay a fixed cost per batch and a cost
per byte.

`measure_transfer` measures the four numbers on the running machine with a real one-worker
``DataLoader`` over samples already in memory, small ones and large ones in alternating
blocks of batches. Each sample carries ``time.process_time()`` of the process that made it
(every thread of it), so the worker's CPU over a block is the difference of two stamps; the
main process's is its main thread's ``thread_time`` around ``next()``. The same batches loaded with
``num_workers=0`` give what the main process spends without workers, which
`torchfit.host.SampleCost` already holds; the worker's surplus over it is the transfer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import statistics
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

__all__ = ["TYPICAL_TRANSFER", "TransferCost", "measure_transfer"]


@dataclasses.dataclass(frozen=True)
class TransferCost:
    """CPU seconds a batch costs to move from a worker to the main process.

    Attributes:
        worker_per_byte: Worker CPU per byte of a batch, beyond the main process's own
            collate (fresh shared memory: page faults, the copy into it, freeing it).
        worker_per_batch: Worker CPU per batch beyond it (creating the shared memory,
            pickling, sending).
        main_per_byte: Main-process CPU per byte to receive a batch and free it.
        main_per_batch: Main-process CPU per batch to receive it (unpickling, receiving
            the descriptors, mapping them).
        method: ``"measured"`` (`measure_transfer`) or where the numbers come from.
        spread: How far the probe's large batches disagreed on their CPU time:
            ``(max - min) / median``, the worse of the two sides.

    Example:
        >>> cost = TransferCost(6e-10, 1e-4, 1e-10, 5e-4, method="example")
        >>> round(cost.worker_seconds(2**20, batch_size=16) * 1e3, 3)  # ms per sample
        0.635
        >>> round(cost.main_seconds(2**20, batch_size=16) * 1e3, 3)
        0.136
    """

    worker_per_byte: float
    worker_per_batch: float
    main_per_byte: float
    main_per_batch: float
    method: str = "measured"
    spread: float = 0.0

    def __post_init__(self) -> None:
        """Refuse negative or non-finite costs."""
        for name in ("worker_per_byte", "worker_per_batch", "main_per_byte", "main_per_batch"):
            value = getattr(self, name)
            if not 0 <= value < float("inf"):
                raise ValueError(
                    f"TransferCost.{name} must be a finite number >= 0 seconds; got {value!r}"
                )

    def worker_seconds(self, out_bytes: float, *, batch_size: int) -> float:
        """A worker's extra CPU per sample of ``out_bytes`` in batches of ``batch_size``."""
        if out_bytes <= 0:
            return 0.0
        return self.worker_per_byte * out_bytes + self.worker_per_batch / max(batch_size, 1)

    def main_seconds(self, out_bytes: float, *, batch_size: int) -> float:
        """The main process's CPU per sample to receive it (1 / this caps samples/s)."""
        if out_bytes <= 0:
            return 0.0
        return self.main_per_byte * out_bytes + self.main_per_batch / max(batch_size, 1)

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain Python values."""
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        """Per MiB and per batch, on each side."""
        mib = 2**20
        return (
            f"transfer ({self.method}): worker {self.worker_per_byte * mib * 1e3:.3f} ms/MiB "
            f"+ {self.worker_per_batch * 1e3:.3f} ms/batch; main "
            f"{self.main_per_byte * mib * 1e3:.3f} ms/MiB + {self.main_per_batch * 1e3:.3f} "
            "ms/batch"
        )


#: `measure_transfer` on a 2-core virtual machine shared with other jobs (torch 2.13 CPU,
#: Linux, batches of 16 samples of 1 MiB against 64 bytes, five rounds: the worker
#: 0.54-0.57 ms/MiB, one round 0.30; the main process 0.13-0.14 ms/MiB; docs/host.md,
#: "Cores and disk", gives the rounds). Used when no measurement is given.
TYPICAL_TRANSFER = TransferCost(
    worker_per_byte=0.55e-3 / 2**20,
    worker_per_batch=0.37e-3,
    main_per_byte=0.135e-3 / 2**20,
    main_per_batch=0.31e-3,
    method="typical (2-core VM, torch 2.13)",
)


class _Stamped(Dataset[tuple[torch.Tensor, float]]):
    """``plan[i // batch]`` picks each sample: the small tensor or the large one."""

    def __init__(
        self, small: torch.Tensor, large: torch.Tensor, plan: list[bool], batch: int
    ) -> None:
        self.small, self.large, self.plan, self.batch = small, large, plan, batch

    def __len__(self) -> int:
        return len(self.plan) * self.batch

    def __getitem__(self, index: int) -> tuple[torch.Tensor, float]:
        tensor = self.large if self.plan[index // self.batch] else self.small
        return tensor, time.process_time()


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """One intra-op thread, as in a worker (``_worker_loop`` sets it), restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _run(dataset: _Stamped, workers: int) -> tuple[list[float], list[float]]:
    """Per batch: the loading process's CPU stamp at its first sample; main CPU in next().

    The main process's CPU is its main thread's (``thread_time``): idle OpenMP threads
    spinning after an earlier parallel operation would otherwise count.
    """
    loader = DataLoader(
        dataset,
        batch_size=dataset.batch,
        num_workers=workers,
        generator=torch.Generator(),  # the base seed is drawn from it, not the global RNG
        multiprocessing_context="fork" if workers else None,
    )
    stamps, main = [], []
    iterator = iter(loader)
    try:
        for _ in range(len(dataset.plan)):
            begin = time.thread_time()
            _, stamp = next(iterator)
            first = float(stamp[0])
            del stamp, _  # the batch is freed here, inside the timed span
            main.append(time.thread_time() - begin)
            stamps.append(first)
    finally:
        del iterator
    return stamps, main


def _per_batch(values: list[float], plan: list[bool], *, large: bool, warm: int) -> list[float]:
    # the worker's values end one batch early: the last stamp only closes the last block
    return [v for v, big in zip(values[warm:], plan[warm:], strict=False) if big is large]


def _spread(values: list[float]) -> float:
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle > 0 else 0.0


def measure_transfer(
    *,
    sample_bytes: int = 2**20,
    batch_size: int = 16,
    batches: int = 6,
    rounds: int = 2,
) -> TransferCost:
    """Measure `TransferCost` here: a one-worker DataLoader, small and large samples.

    The worker's and the main process's CPU per batch of ``sample_bytes`` samples, less
    the same per batch of 64-byte samples, over the bytes between them gives the per-byte
    costs; what remains of the 64-byte batch, the per-batch ones. The worker's side is
    taken less what the main process spends on the same batches with ``num_workers=0``.
    Blocks of ``batches`` batches alternate, ``rounds`` of each size, and the medians
    count. Uses ``fork`` workers (quick to start); the RNGs are left as they were.

    Args:
        sample_bytes: Bytes of a large sample.
        batch_size: Samples per batch.
        batches: Batches in a block of one size.
        rounds: Blocks of each size.

    Returns:
        The `TransferCost` measured (``method="measured"``).

    Raises:
        ValueError: A size, batch or count below its minimum.

    Example:
        >>> cost = measure_transfer(sample_bytes=2**18, batches=2, rounds=1)
        >>> cost.method, cost.worker_per_byte >= 0
        ('measured', True)
    """
    if sample_bytes < 4096 or batch_size < 1 or batches < 2 or rounds < 1:
        raise ValueError(
            f"sample_bytes must be >= 4096, batch_size >= 1, batches >= 2 and rounds >= 1; "
            f"got {sample_bytes}, {batch_size}, {batches}, {rounds}"
        )
    plan = [False, True, True, False]  # warm-up: the worker's start, the first heap pages
    warm = len(plan)
    for _ in range(rounds):
        plan += [False] * batches + [True] * batches
    plan.append(False)  # its stamp closes the last block
    small, large = torch.ones(64, dtype=torch.uint8), torch.ones(sample_bytes, dtype=torch.uint8)
    dataset = _Stamped(small, large, plan, batch_size)
    stamps, main = _run(dataset, 1)
    worker = [later - earlier for earlier, later in itertools.pairwise(stamps)]
    with _one_thread():
        _, alone = _run(dataset, 0)
    costs = {}
    for side, values in (("worker", worker), ("main", main), ("alone", alone)):
        for big in (False, True):
            costs[side, big] = statistics.median(_per_batch(values, plan, large=big, warm=warm))
    extra = {big: costs["worker", big] - costs["alone", big] for big in (False, True)}
    moved = batch_size * (sample_bytes - 64)
    worker_byte = max(extra[True] - extra[False], 0.0) / moved
    main_byte = max(costs["main", True] - costs["main", False], 0.0) / moved
    large_worker = _per_batch(worker, plan, large=True, warm=warm)
    large_main = _per_batch(main, plan, large=True, warm=warm)
    return TransferCost(
        worker_per_byte=worker_byte,
        worker_per_batch=max(extra[False] - worker_byte * batch_size * 64, 0.0),
        main_per_byte=main_byte,
        main_per_batch=max(costs["main", False] - main_byte * batch_size * 64, 0.0),
        method="measured",
        spread=max(_spread(large_worker), _spread(large_main)),
    )
