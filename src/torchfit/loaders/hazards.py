"""The worker hazards `torchfit.loaders` warns about.

Samples an ``IterableDataset`` repeats in every worker, Python objects every worker
copies, and batches in flight that would not fit in ``/dev/shm``.
"""

from __future__ import annotations

import hashlib
import itertools
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from torchfit._core.units import format_bytes
from torchfit.loaders.machine import SHM_FRACTION
from torchfit.loaders.probe import WorkerSeeder, close_iterator, leaves

__all__ = [
    "PY_OBJECTS_WARN_BYTES",
    "dataset_attributes",
    "duplicated_across_workers",
    "fingerprint",
    "python_object_warnings",
    "python_objects",
    "shm_message",
]

#: Python containers this large in a dataset get a copy-into-workers warning.
PY_OBJECTS_WARN_BYTES = 16 * 2**20


def fingerprint(obj: object) -> str:
    """A digest of a sample's content (tensors by dtype, shape and bytes)."""
    digest = hashlib.blake2b(digest_size=16)

    def feed(value: object) -> None:
        if isinstance(value, torch.Tensor):
            flat = value.detach().cpu().contiguous().reshape(-1)
            digest.update(f"T{value.dtype}{tuple(value.shape)}".encode())
            digest.update(flat.view(torch.uint8).numpy().tobytes())
        elif isinstance(value, np.ndarray):
            digest.update(f"A{value.dtype}{value.shape}".encode())
            digest.update(np.ascontiguousarray(value).tobytes())
        elif isinstance(value, Mapping):
            digest.update(b"{")
            for key in sorted(value, key=repr):
                digest.update(repr(key).encode())
                feed(value[key])
            digest.update(b"}")
        elif isinstance(value, list | tuple):
            digest.update(b"[")
            for item in value:
                feed(item)
            digest.update(b"]")
        else:
            digest.update(repr(value).encode())

    feed(obj)
    return digest.hexdigest()


def _keep(item: object) -> object:
    """Collate function that returns the sample untouched."""
    return item


class _TagWorker(IterableDataset[tuple[int, object]]):
    """Yields ``(worker id, sample)`` from the wrapped iterable dataset."""

    def __init__(self, dataset: Iterable[object]) -> None:
        self.dataset = dataset

    def __iter__(self) -> Iterator[tuple[int, object]]:
        info = get_worker_info()
        worker = 0 if info is None else info.id
        for item in self.dataset:
            yield worker, item


def duplicated_across_workers(
    dataset: Iterable[object], *, samples: int, timeout: float, context: Any = None
) -> bool:
    """True when two workers of an iterable dataset yield the same first samples.

    An ``IterableDataset`` that does not split itself by ``get_worker_info()`` runs whole
    in every worker, so N workers yield every sample N times.
    """
    loader = DataLoader(
        _TagWorker(dataset),
        batch_size=None,
        num_workers=2,
        collate_fn=_keep,
        timeout=max(timeout, 0.1),
        multiprocessing_context=context,
        worker_init_fn=WorkerSeeder(),
    )
    streams: dict[int, list[str]] = {0: [], 1: []}
    it = iter(loader)
    try:
        for worker, item in it:
            streams[worker].append(fingerprint(item))
            if min(len(stream) for stream in streams.values()) >= samples:
                break
    finally:
        close_iterator(it)
    common = min(len(streams[0]), len(streams[1]))
    return common > 0 and streams[0][:common] == streams[1][:common]


def _python_bytes(container: Any) -> int:
    """Rough bytes of a container of Python objects: itself plus a sample of its items.

    Sequences are sampled evenly; dicts and sets (no indexing) by their first items.
    """
    count = len(container)
    if isinstance(container, list | tuple | np.ndarray):
        sample = [container[i * count // 64] for i in range(min(count, 64))]
    else:
        sample = list(
            itertools.islice(container.items() if isinstance(container, dict) else container, 64)
        )
    each = sum(sys.getsizeof(x) for item in sample for x in leaves(item)) / max(len(sample), 1)
    return sys.getsizeof(container) + int(each * count)


def dataset_attributes(dataset: object) -> Iterator[tuple[str, Any]]:
    """Every attribute of a dataset and of the datasets it wraps: ``(path, value)``.

    Wrapped datasets (an attribute, or a list or tuple of them, such as ConcatDataset's)
    are walked into, not yielded; each object is visited once.

    Example:
        >>> ds = torch.utils.data.Subset(torch.utils.data.TensorDataset(torch.zeros(4)), [0])
        >>> [path for path, _ in dataset_attributes(ds)]
        ['dataset.indices', 'dataset.dataset.tensors']
    """
    queue: list[tuple[str, object]] = [("dataset", dataset)]
    seen: set[int] = set()
    while queue:
        path, obj = queue.pop()
        if id(obj) in seen or not hasattr(obj, "__dict__"):
            continue
        seen.add(id(obj))
        for name, value in vars(obj).items():
            where = f"{path}.{name}"
            if isinstance(value, Dataset):
                queue.append((where, value))
            elif isinstance(value, list | tuple) and value and isinstance(value[0], Dataset):
                queue += [(f"{where}[{i}]", item) for i, item in enumerate(value)]
            else:
                yield where, value


def python_objects(dataset: object, *, min_items: int = 1000) -> list[tuple[str, int, int]]:
    """Large containers of Python objects a dataset holds: ``(attribute, items, ~bytes)``.

    Reading such objects in a forked worker touches their reference counts, so the
    memory pages holding them are copied into every worker (pytorch #13246).
    """
    found: list[tuple[str, int, int]] = []
    for where, value in dataset_attributes(dataset):
        if isinstance(value, list | tuple | dict | set | frozenset) and len(value) >= min_items:
            found.append((where, len(value), _python_bytes(value)))
        elif isinstance(value, np.ndarray) and value.dtype == object and value.size:
            flat = value.reshape(-1)
            if flat.size >= min_items:
                found.append((where, flat.size, value.nbytes + _python_bytes(flat)))
    return found


def shm_message(workers: int, prefetch: int, batch: int, share: int, allowed: int) -> str:
    """The warning for batches in flight that would not fit in ``/dev/shm``.

    ``allowed`` is `torchfit.loaders.machine.shm_worker_limit` of the same figures.
    """
    need = workers * prefetch * batch
    fix = (
        f"torchfit allows at most {allowed} workers"
        if allowed
        else "no worker fits: loading stays in the main process"
    )
    return (
        f"/dev/shm is too small: {workers} workers x prefetch {prefetch} x "  # noqa: S108
        f"{format_bytes(batch)} per batch = {format_bytes(need)} in flight, against "
        f"{format_bytes(share)} free for this rank (keeping {1 - SHM_FRACTION:.0%} spare); "
        "workers crash "
        f"with a bus error when it fills (pytorch #5040). {fix}; give the container more "
        "shared memory (docker run --shm-size=8g) or use smaller batches"
    )


def python_object_warnings(dataset: object, workers: int) -> list[str]:
    """Warnings for large containers of Python objects the workers will copy."""
    return [
        f"{where} holds {items:,} Python objects (about {format_bytes(size)}); reading them "
        f"in a worker touches their reference counts, so every worker ({workers} here) "
        f"copies them (up to {format_bytes(workers * size)} in all, pytorch #13246); "
        "store them in a numpy array or a torch tensor instead"
        for where, items, size in python_objects(dataset)
        if size >= PY_OBJECTS_WARN_BYTES
    ]
