"""The blocks of a simulated CUDA caching allocator and its best-fit pools of free blocks.

A segment (one ``cudaMalloc``) is a doubly linked run of `Block` objects; each pool keeps
its free blocks ordered by (size, address), as ``BlockComparatorSize`` in
``c10/cuda/CUDACachingAllocator.cpp`` orders them, so the best fit is a lower bound.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterator

__all__ = ["Block", "FreePool", "link"]


@dataclasses.dataclass(eq=False, slots=True)
class Block:
    """A run of bytes inside one segment; ``prev``/``next`` link the segment's blocks.

    Example:
        >>> head = Block(addr=0, size=2048, small=True)
        >>> head.is_split
        False
    """

    addr: int
    size: int
    small: bool
    allocated: bool = False
    prev: Block | None = None
    next: Block | None = None

    def run(self) -> Iterator[Block]:
        """This block and the ones after it in its segment, in address order."""
        block: Block | None = self
        while block is not None:
            yield block
            block = block.next

    @property
    def is_split(self) -> bool:
        """Whether the segment holds other blocks besides this one."""
        return self.prev is not None or self.next is not None


def link(addr: int, sizes: list[int], *, small: bool) -> list[Block]:
    """A segment's run of free blocks of ``sizes`` from ``addr``, linked in address order.

    Example:
        >>> first, second = link(0, [512, 1536], small=True)
        >>> second.addr, second.prev is first, first.next is second
        (512, True, True)
    """
    blocks: list[Block] = []
    for size in sizes:
        blocks.append(Block(addr=addr, size=size, small=small, prev=blocks[-1] if blocks else None))
        if len(blocks) > 1:
            blocks[-2].next = blocks[-1]
        addr += size
    return blocks


class FreePool:
    """Free blocks of one pool ordered by (size, address): ``BlockComparatorSize``.

    Example:
        >>> pool = FreePool()
        >>> for addr, size in ((0, 1024), (4096, 512), (8192, 1024)):
        ...     pool.insert(Block(addr=addr, size=size, small=True))
        >>> found = pool.lower_bound(600)
        >>> found.addr, found.size
        (0, 1024)
    """

    def __init__(self) -> None:
        """An empty pool."""
        self.keys: list[tuple[int, int]] = []
        self.blocks: dict[int, Block] = {}

    def insert(self, block: Block) -> None:
        """Add a free block."""
        bisect.insort(self.keys, (block.size, block.addr))
        self.blocks[block.addr] = block

    def remove(self, block: Block) -> None:
        """Take a block out (it is being used, merged or released)."""
        index = bisect.bisect_left(self.keys, (block.size, block.addr))
        del self.keys[index]
        del self.blocks[block.addr]

    def lower_bound(self, size: int) -> Block | None:
        """The smallest free block of at least ``size`` bytes, lowest address first."""
        index = bisect.bisect_left(self.keys, (size, -1))
        return self.blocks[self.keys[index][1]] if index < len(self.keys) else None
