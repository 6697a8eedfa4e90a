"""The Python objects a dataset holds, sized as copy-on-write sees them.

A forked DataLoader worker shares its parent's memory until it writes to a page. Reading
a Python object writes its reference count, in the object's header, so every page that
holds an object the worker reads is copied into the worker (pytorch issue #13246). Small
objects (up to 512 bytes: strings, ints, tuples, dict and list headers) are packed into
4 KiB pools by pymalloc in 16-byte size classes, each pool keeping a 48-byte header
(CPython 3.11 ``Objects/obmalloc.c``: ``ALIGNMENT``, ``POOL_SIZE``, ``POOL_OVERHEAD``), so
reading them copies their whole pages. A large object's header page is copied, not the
rest. Reading an item of a dict or a list writes the dict or list object, not its table
of keys or pointers (a separate allocation). The buffer of a numpy array or a tensor is not
an object: reading it copies nothing. An item counts as read with everything inside it:
``__getitem__`` reads the fields it returns.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from torchfit.loaders.hazards import dataset_attributes

__all__ = ["PAGE_BYTES", "PythonObjects", "cow_bytes", "copied_objects"]

#: The page a write copies (x86-64 and most arm64 Linux kernels).
PAGE_BYTES = 4096
#: pymalloc: objects up to 512 bytes, in 16-byte classes, in pools with a 48-byte header.
_SMALL, _ALIGN, _POOL_HEADER = 512, 16, 48
#: The header a dict, list or set writes when read; its table is allocated apart.
_HEADERS: dict[type, int] = {
    dict: sys.getsizeof({}),
    list: sys.getsizeof([]),
    set: sys.getsizeof(set()),
    frozenset: sys.getsizeof(frozenset()),
}
#: Containers this small are left out (a few objects copy a few pages).
_MIN_ITEMS = 1000
#: Items sampled per container.
_SAMPLE = 64


def _shared(obj: object) -> bool:
    """One object for the whole process (small ints, None, bools): no page per item."""
    if obj is None or obj is Ellipsis or isinstance(obj, bool):
        return True
    return type(obj) is int and -5 <= obj <= 256  # CPython's cached small ints


def _blocks(obj: object, seen: set[int], depth: int = 0) -> Iterator[int]:
    """The allocation size of each object a reader of ``obj`` writes (0: a large one)."""
    if id(obj) in seen or depth > 8 or _shared(obj):
        return
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):  # the header; the buffer is never written
        yield sys.getsizeof(obj) - (obj.nbytes if obj.flags.owndata else 0)
        return
    if isinstance(obj, torch.Tensor):
        yield object.__sizeof__(obj)
        return
    yield _HEADERS.get(type(obj)) or sys.getsizeof(obj)
    children: Iterator[Any]
    if isinstance(obj, Mapping):
        children = iter(obj.values())  # keys are usually shared strings
    elif isinstance(obj, list | tuple | set | frozenset):
        children = iter(obj)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        children = iter(vars(obj).values())
    else:
        return
    for child in children:
        yield from _blocks(child, seen, depth + 1)


def _page_bytes(size: int) -> float:
    if size <= _SMALL:  # its pymalloc block and its share of the pool header
        return -(-size // _ALIGN) * _ALIGN * PAGE_BYTES / (PAGE_BYTES - _POOL_HEADER)
    return float(min(size, PAGE_BYTES))  # a large object: its header page


def cow_bytes(obj: object) -> float:
    """Bytes of pages a reader of ``obj`` and everything inside it copies on write.

    A small object counts its pymalloc block (and its share of the pool header), a large
    one its size up to one page; a container its items too (a dict its values: keys are
    usually shared strings); array and tensor buffers count nothing, nor do the objects
    every item shares (small ints, None, bools).

    Example:
        >>> cow_bytes("x" * 10_000)  # one object, its header page
        4096.0
        >>> cow_bytes(np.zeros(10**6)) < 200  # the header; the buffer is never written
        True
        >>> round(cow_bytes((1.5, "ab")))  # a 56-byte tuple, a 24-byte float, a 51-byte str
        162
    """
    return sum(_page_bytes(size) for size in _blocks(obj, set()))


def size_classes(obj: object) -> int:
    """How many pymalloc size classes the small objects inside ``obj`` fall in.

    Objects of one class are carved from the same pools, so items made one after the
    other lie in one contiguous run per class: a worker reading a run of items copies
    one page more per class, at the run's edge.

    Example:
        >>> size_classes(("img/0001.jpg", 3.5, 70000))  # tuple 56, str 61, float 24, int 28
        2
    """
    return len({-(-size // _ALIGN) for size in _blocks(obj, set()) if size <= _SMALL}) or 1


class PythonObjects:
    """The large containers of Python objects a dataset holds, and their copy-on-write bytes.

    Attributes:
        found: ``(attribute path, items, bytes)`` of each container of at least 1000
            items (bytes from a sample of 64 items, evenly spread).

    Example:
        >>> from torch.utils.data import Dataset
        >>> class Paths(Dataset):
        ...     def __init__(self):
        ...         self.paths = [f"img/{i:08d}.jpg" for i in range(10_000)]
        >>> objects = copied_objects(Paths())
        >>> objects.found  # 10,000 strings of 64 bytes, in 4 KiB pools with 48-byte headers
        [('dataset.paths', 10000, 809486)]
    """

    def __init__(self, found: list[tuple[str, int, int]], classes: int = 1) -> None:
        """Keep what was found; ``classes``: most size classes of one item (`size_classes`)."""
        self.found = found
        self.classes = classes

    @property
    def total(self) -> int:
        """Bytes of all the containers found."""
        return sum(size for _, _, size in self.found)

    @property
    def items(self) -> int:
        """Items of all the containers found."""
        return sum(count for _, count, _ in self.found)


def _sample(container: Any) -> list[Any]:
    count = len(container)
    if isinstance(container, list | tuple | np.ndarray):
        sample = [container[i * count // _SAMPLE] for i in range(min(count, _SAMPLE))]
    elif isinstance(container, Mapping):
        sample = list(itertools.islice(container.values(), _SAMPLE))
    else:
        sample = list(itertools.islice(container, _SAMPLE))
    return sample


def copied_objects(dataset: object) -> PythonObjects:
    """Find the containers of Python objects in a dataset (and datasets it wraps).

    Example:
        >>> copied_objects(torch.utils.data.TensorDataset(torch.zeros(10_000))).total
        0
    """
    found: list[tuple[str, int, int]] = []
    classes = 1
    for where, value in dataset_attributes(dataset):
        items = value.reshape(-1) if isinstance(value, np.ndarray) else value
        if not isinstance(value, list | tuple | dict | set | frozenset) and not (
            isinstance(value, np.ndarray) and value.dtype == object
        ):
            continue
        if len(items) < _MIN_ITEMS:
            continue
        sample = _sample(items)
        each = sum(cow_bytes(item) for item in sample) / max(len(sample), 1)
        # the container's own table of pointers is read, never written: not copied
        found.append((where, len(items), int(each * len(items))))
        classes = max(classes, *(size_classes(item) for item in sample))
    return PythonObjects(found, classes)
