"""A byte-exact model of PyTorch's CUDA caching allocator (native backend, one stream).

Every rule below is read from ``c10/cuda/CUDACachingAllocator.cpp`` (the size rules
moved to ``c10/core/CachingDeviceAllocator.h`` in recent releases, unchanged); the
comment on each rule names the C++ function it mirrors. What is *not* modelled:
several streams (blocks are never shared across streams; one stream is assumed),
CUDA-graph private pools, ``garbage_collection_threshold``, ``expandable_segments``
(a different segment layout: one growing mapping per pool) and the cudaMallocAsync
backend. Where ``cudaMalloc`` places a segment is the caller's (``placement``; by default
above every segment held): it matters when two free blocks of the same size tie in the
best-fit search, which takes the lowest address.

The public face is `torchfit.memory.allocator`; this module holds the state machine,
`torchfit.memory.allocator.blocks` its blocks and free pools, and
`torchfit.memory.allocator.simulator` the replay of an event list.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from torchfit._core import checks
from torchfit.memory.allocator.blocks import Block, FreePool, link
from torchfit.memory.allocator.rules import (
    K_LARGE_BUFFER,
    K_MIN_BLOCK_SIZE,
    K_SMALL_SIZE,
    AllocatorStats,
    SegmentInfo,
    allocation_size,
    check_divisions,
    check_max_split_size,
    check_nbytes,
    oom_message,
    round_request,
)

__all__ = ["CachingAllocator"]


class CachingAllocator:
    """A simulated CUDA caching allocator: feed it mallocs and frees, read its stats.

    The rules are those of PyTorch's native ``DeviceCachingAllocator`` for a single
    stream: requests are rounded (`round_request`); a request <= 1 MiB goes to the small
    pool, a larger one to the large pool; the smallest cached free block that fits is
    taken (ties: lowest address); if it is bigger than needed it is split (small pool:
    when >= 512 bytes remain; large pool: when more than 1 MiB remains and the request
    is below ``max_split_size``); with no fit a new segment of `segment_size` is
    reserved; freeing coalesces a block with free neighbours of the same segment;
    `empty_cache` releases every wholly free segment. With a ``capacity``, a segment
    that does not fit triggers the same recovery as ``cudaMalloc`` failing: release
    oversize cached blocks (only with ``max_split_size``), then every wholly free
    segment, then raise ``torch.OutOfMemoryError``.

    Args:
        capacity: Bytes the allocator may reserve in all (the memory ``cudaMalloc`` can
            give, or ``set_per_process_memory_fraction``'s limit); None for unlimited.
        max_split_size: ``max_split_size_mb`` in bytes (at least 20 MiB, as PyTorch
            requires); None for PyTorch's default, unlimited.
        roundup_power2_divisions: See `round_request`.
        placement: Where ``cudaMalloc`` puts a new segment: called with its size, it
            returns the base address (it must not overlap a segment held), or None for
            the default, just above every segment so far. A replay of a recorded run
            passes the real addresses (`torchfit.memory.allocator.snapshot`).

    Example:
        >>> a = CachingAllocator()
        >>> x = a.malloc(1000)  # small pool: one 2 MiB segment, a 1024-byte block
        >>> y = a.malloc(5 * 2**20)  # a 20 MiB segment, split
        >>> a.allocated, a.reserved, a.num_segments
        (5243904, 23068672, 2)
        >>> a.free(y)
        >>> a.empty_cache()  # the 20 MiB segment is wholly free again: released
        >>> a.reserved, a.peak_reserved
        (2097152, 23068672)
    """

    @checks.arguments(capacity=checks.whole(at_least=1))
    def __init__(
        self,
        *,
        capacity: int | None = None,
        max_split_size: int | None = None,
        roundup_power2_divisions: int = 0,
        placement: Callable[[int], int | None] | None = None,
    ) -> None:
        """Set up an empty allocator of ``capacity`` bytes (unlimited when ``None``)."""
        if capacity is not None:
            check_nbytes(capacity, "capacity")
        if max_split_size is not None:
            check_max_split_size(max_split_size)
        self._capacity = capacity
        self._max_split = max_split_size
        self._divisions = check_divisions(roundup_power2_divisions)
        self._placement = placement
        self._small = FreePool()
        self._large = FreePool()
        self._blocks: dict[int, Block] = {}  # every block, free or not, by address
        self._segments: dict[int, int] = {}  # segment base address -> size
        self._live: dict[int, Block | None] = {}  # handle -> block (None: 0 bytes)
        self._next_handle = 0
        self._next_addr = 0
        self._allocated = self._reserved = 0
        self._peak_allocated = self._peak_reserved = 0
        self._device_allocs = self._device_frees = self._retries = 0

    # --- public state -------------------------------------------------------------

    @property
    def allocated(self) -> int:
        """Bytes in blocks handed out now (``torch.cuda.memory_allocated``)."""
        return self._allocated

    @property
    def reserved(self) -> int:
        """Bytes in segments held now (``torch.cuda.memory_reserved``)."""
        return self._reserved

    @property
    def peak_allocated(self) -> int:
        """Highest `allocated` so far (``torch.cuda.max_memory_allocated``)."""
        return self._peak_allocated

    @property
    def peak_reserved(self) -> int:
        """Highest `reserved` so far (``torch.cuda.max_memory_reserved``)."""
        return self._peak_reserved

    @property
    def num_segments(self) -> int:
        """Segments held now."""
        return len(self._segments)

    def stats(self) -> AllocatorStats:
        """A snapshot of the counters."""
        return AllocatorStats(
            allocated=self._allocated,
            reserved=self._reserved,
            peak_allocated=self._peak_allocated,
            peak_reserved=self._peak_reserved,
            num_segments=len(self._segments),
            num_device_allocs=self._device_allocs,
            num_device_frees=self._device_frees,
            num_alloc_retries=self._retries,
        )

    def segments(self) -> tuple[SegmentInfo, ...]:
        """Every segment with its blocks, by address (``torch.cuda.memory_snapshot``)."""
        return tuple(
            SegmentInfo(
                address=base,
                size=self._segments[base],
                is_large=not self._blocks[base].small,
                blocks=tuple((block.size, block.allocated) for block in self._blocks[base].run()),
            )
            for base in sorted(self._segments)
        )

    @checks.arguments()
    def adopt_segment(self, segment: SegmentInfo) -> tuple[int, ...]:
        """Take over a segment reserved before the model started, its blocks as they are.

        Replays use it to start from a real allocator's state (``torch.cuda.memory_snapshot()``).
        The segment counts as reserved (peaks too), not as a ``cudaMalloc`` of this model.

        Returns:
            A handle for `free` per allocated block of ``segment``, in address order.

        Raises:
            ValueError: The segment overlaps one held.

        Example:
            >>> a = CachingAllocator()
            >>> seg = SegmentInfo(address=0, size=2 * 2**20, is_large=False,
            ...                   blocks=((512, True), (2 * 2**20 - 512, False)))
            >>> (handle,) = a.adopt_segment(seg)
            >>> a.allocated, a.reserved, a.segments() == (seg,)
            (512, 2097152, True)
        """
        self._place(segment.size, segment.address)
        pool = self._large if segment.is_large else self._small
        sizes = [size for size, _ in segment.blocks]
        handles: list[int] = []
        for block, (_, used) in zip(
            link(segment.address, sizes, small=not segment.is_large), segment.blocks, strict=True
        ):
            self._blocks[block.addr] = block
            if used:
                block.allocated = True
                self._allocated += block.size
                self._live[self._next_handle] = block
                handles.append(self._next_handle)
                self._next_handle += 1
            else:
                pool.insert(block)
        self._peak_allocated = max(self._peak_allocated, self._allocated)
        return tuple(handles)

    def address(self, handle: int) -> int | None:
        """The simulated address of a live allocation (None for a 0-byte one)."""
        block = self._live[self._check_live(handle)]
        return None if block is None else block.addr

    def _check_live(self, handle: int) -> int:
        if isinstance(handle, bool) or not isinstance(handle, int):  # per event: kept cheap
            raise TypeError(f"handle must be an int returned by malloc; got {handle!r}")
        if handle not in self._live:
            raise ValueError(
                f"handle {handle!r} is not a live allocation of this allocator (never "
                "returned by malloc, or already freed)"
            )
        return handle

    def reset_peak_stats(self) -> None:
        """Peaks restart from the current values (``torch.cuda.reset_peak_memory_stats``)."""
        self._peak_allocated = self._allocated
        self._peak_reserved = self._reserved

    # --- malloc / free --------------------------------------------------------------

    def malloc(self, nbytes: int) -> int:
        """Allocate ``nbytes`` and return a handle for `free`.

        Mirrors ``DeviceCachingAllocator::malloc``: round, pick the pool, best-fit search
        (``get_free_block``), else a new segment (``alloc_block``) with the OOM recovery
        (``release_available_cached_blocks``, then ``release_cached_blocks``), then the
        split decision (``should_split``, ``alloc_found_block``).

        Raises:
            torch.OutOfMemoryError: A ``capacity`` was given and the segment does not
                fit even after releasing every cached segment.
        """
        if type(nbytes) is not int or nbytes < 0:  # the common case kept cheap
            check_nbytes(nbytes)
        handle = self._next_handle
        self._next_handle += 1
        if nbytes == 0:  # NativeCachingAllocator::allocate: no malloc for 0 bytes
            self._live[handle] = None
            return handle
        if self._divisions <= 1:  # round_request's plain 512-byte rounding, inlined
            size = -(-nbytes // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE
        else:
            size = round_request(nbytes, roundup_power2_divisions=self._divisions)
        small = size <= K_SMALL_SIZE  # get_pool
        pool = self._small if small else self._large
        block = self._get_free_block(pool, size)
        if block is None:
            alloc_size = allocation_size(size)
            block = self._alloc_block(alloc_size, small=small)
            if block is None and self._release_available_cached_blocks(pool, size):
                block = self._alloc_block(alloc_size, small=small)
            if block is None:
                self._retries += 1
                self.empty_cache()  # release_cached_blocks, then alloc_block(isRetry=true)
                block = self._alloc_block(alloc_size, small=small)
            if block is None:
                raise torch.OutOfMemoryError(
                    oom_message(alloc_size, self._capacity or 0, self._allocated, self._reserved)
                )
        if self._should_split(block, size):
            block = self._split(block, size, pool)
        block.allocated = True
        self._allocated += block.size  # allocated_bytes counts the whole block
        self._peak_allocated = max(self._peak_allocated, self._allocated)
        self._live[handle] = block
        return handle

    def free(self, handle: int) -> None:
        """Give back the block of ``handle``; it is cached, never returned to CUDA here.

        Mirrors ``free_block``: merge with free neighbours (``try_merge_blocks``), then
        back into the pool's free set.
        """
        block = self._live.pop(self._check_live(handle))
        if block is None:
            return
        block.allocated = False
        self._allocated -= block.size
        pool = self._small if block.small else self._large
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.allocated:
                self._merge(block, neighbour, pool)
        pool.insert(block)

    def empty_cache(self) -> None:
        """Release every wholly free segment (``release_cached_blocks``/``release_blocks``)."""
        for pool in (self._large, self._small):
            for block in [b for b in pool.blocks.values() if not b.is_split]:
                self._release_block(block, pool)

    # --- the rules ------------------------------------------------------------------

    def _get_free_block(self, pool: FreePool, size: int) -> Block | None:
        # get_free_block: lower_bound in (size, address) order; with max_split_size, an
        # oversize block (>= max_split_size) serves only requests >= max_split_size, and
        # only if it wastes less than kLargeBuffer (max_non_split_rounding_size default).
        block = pool.lower_bound(size)
        if block is None:
            return None
        limit = self._max_split
        if limit is not None:
            if size < limit <= block.size:
                return None
            if size >= limit and block.size >= size + K_LARGE_BUFFER:
                return None
        pool.remove(block)
        return block

    def _should_split(self, block: Block, size: int) -> bool:
        # should_split: small pool when >= kMinBlockSize remains; large pool when more than
        # kSmallSize remains and the request is below max_split_size.
        remaining = block.size - size
        if block.small:
            return remaining >= K_MIN_BLOCK_SIZE
        below_limit = self._max_split is None or size < self._max_split
        return below_limit and remaining > K_SMALL_SIZE

    def _split(self, block: Block, size: int, pool: FreePool) -> Block:
        # alloc_found_block: the front `size` bytes become the allocation; the rest stays
        # free in the pool, linked after it.
        front = Block(addr=block.addr, size=size, small=block.small, prev=block.prev, next=block)
        if front.prev is not None:
            front.prev.next = front
        block.prev = front
        block.addr += size
        block.size -= size
        self._blocks[front.addr] = front
        self._blocks[block.addr] = block
        pool.insert(block)
        return front

    def _alloc_block(self, alloc_size: int, *, small: bool) -> Block | None:
        # alloc_block: cudaMalloc(alloc_size); fails when the capacity would be exceeded
        # (the set_fraction check `total_allocated_memory + size > allowed_memory_maximum`).
        if self._capacity is not None and self._reserved + alloc_size > self._capacity:
            return None
        addr = None if self._placement is None else self._placement(alloc_size)
        block = Block(addr=self._place(alloc_size, addr), size=alloc_size, small=small)
        self._blocks[block.addr] = block
        self._device_allocs += 1
        return block

    def _place(self, size: int, addr: int | None) -> int:
        # A new segment at `addr` (default: above all): overlapping one held is an error.
        if addr is None:
            addr = self._next_addr
        elif any(
            addr < base + held and base < addr + size for base, held in self._segments.items()
        ):
            raise ValueError(
                f"a segment of {size} bytes at address {addr} overlaps a segment held; "
                "placement must return a free address range (or None for the default)"
            )
        self._next_addr = max(self._next_addr, addr + size)
        self._segments[addr] = size
        self._reserved += size
        self._peak_reserved = max(self._peak_reserved, self._reserved)
        return addr

    def _release_block(self, block: Block, pool: FreePool) -> None:
        # release_block: cudaFree a wholly free segment.
        pool.remove(block)
        del self._blocks[block.addr]
        del self._segments[block.addr]
        self._reserved -= block.size
        self._device_frees += 1

    def _release_available_cached_blocks(self, pool: FreePool, size: int) -> bool:
        # release_available_cached_blocks: only with max_split_size. Free the smallest
        # oversize cached block of at least max(size, max_split_size); if none is that big,
        # free oversize blocks from the largest down until that many bytes are released.
        limit = self._max_split
        if limit is None:
            return False
        target = max(size, limit)
        block = pool.lower_bound(target)
        if block is not None:
            self._release_whole(block, pool)
            return True
        released = 0
        while released < target and pool.keys and pool.keys[-1][0] >= limit:
            block = pool.blocks[pool.keys[-1][1]]
            released += block.size
            self._release_whole(block, pool)
        return released >= target

    def _release_whole(self, block: Block, pool: FreePool) -> None:
        if block.is_split:  # an oversize block is never split (should_split refuses)
            raise RuntimeError("internal error: an oversize cached block is split")
        self._release_block(block, pool)

    def _merge(self, dst: Block, src: Block, pool: FreePool) -> None:
        # try_merge_blocks: dst absorbs its free neighbour src.
        pool.remove(src)
        del self._blocks[src.addr]
        if dst.prev is src:
            del self._blocks[dst.addr]
            dst.addr = src.addr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
            self._blocks[dst.addr] = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
