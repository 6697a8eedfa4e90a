"""Size rules of PyTorch's CUDA caching allocator, and what a simulation of it reports.

Read from ``c10/cuda/CUDACachingAllocator.cpp`` (``round_size``, ``get_allocation_size``;
the size rules moved to ``c10/core/CachingDeviceAllocator.h`` in recent releases,
unchanged). The state machine that uses them is in `torchfit.memory.allocator.simulator`.
"""

from __future__ import annotations

import dataclasses
import itertools

from torchfit._core.ledger import CUDA_BLOCK
from torchfit._core.units import format_bytes

__all__ = [
    "K_LARGE_BUFFER",
    "K_MIN_BLOCK_SIZE",
    "K_MIN_LARGE_ALLOC",
    "K_ROUND_LARGE",
    "K_SMALL_BUFFER",
    "K_SMALL_SIZE",
    "AllocatorStats",
    "SegmentInfo",
    "allocation_size",
    "check_divisions",
    "check_max_split_size",
    "check_nbytes",
    "oom_message",
    "round_request",
    "segment_size",
]

# Constants of c10/cuda/CUDACachingAllocator.cpp (kMinBlockSize -> K_MIN_BLOCK_SIZE, ...).
K_MIN_BLOCK_SIZE = CUDA_BLOCK  # kMinBlockSize: every block is a multiple of 512 bytes
K_SMALL_SIZE = 1_048_576  # kSmallSize: the largest "small" request, 1 MiB
K_SMALL_BUFFER = 2_097_152  # kSmallBuffer: small requests are packed into 2 MiB segments
K_MIN_LARGE_ALLOC = 10_485_760  # kMinLargeAlloc: requests in (1, 10) MiB share 20 MiB segments
K_LARGE_BUFFER = 20_971_520  # kLargeBuffer: that shared 20 MiB segment
K_ROUND_LARGE = 2_097_152  # kRoundLarge: requests >= 10 MiB get a segment rounded to 2 MiB


def check_nbytes(nbytes: int, what: str = "nbytes") -> int:
    """``nbytes`` when it is an int >= 0; else TypeError/ValueError naming ``what``."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int):
        raise TypeError(f"{what} must be an int number of bytes; got {nbytes!r}")
    if nbytes < 0:
        raise ValueError(f"{what} must be >= 0 bytes; got {nbytes}")
    return nbytes


def check_max_split_size(max_split_size: int) -> int:
    """``max_split_size`` when it is a byte count of at least 20 MiB; else an error."""
    check_nbytes(max_split_size, "max_split_size")
    # AcceleratorAllocatorConfig::parseMaxSplitSize rejects values below kLargeBuffer.
    if max_split_size < K_LARGE_BUFFER:
        raise ValueError(
            f"max_split_size must be at least 20 MiB ({K_LARGE_BUFFER} bytes), as "
            f"PyTorch's max_split_size_mb requires; got {max_split_size}; "
            "use None for the default (unlimited)"
        )
    return max_split_size


def check_divisions(divisions: int) -> int:
    """``divisions`` when it is 0, 1 or a power of two; else ValueError."""
    # CUDAAllocatorConfig::parseRoundUpPower2Divisions accepts 0/1 (off) or a power of two.
    if isinstance(divisions, bool) or not isinstance(divisions, int) or divisions < 0:
        raise ValueError(
            f"roundup_power2_divisions must be 0 (off) or a power of two; got {divisions!r}"
        )
    if divisions > 1 and divisions & (divisions - 1):
        raise ValueError(
            f"roundup_power2_divisions must be a power of two (as PyTorch requires); "
            f"got {divisions}; use e.g. 4 or 8"
        )
    return divisions


def _roundup_power2_next_division(size: int, divisions: int) -> int:
    # DeviceCachingAllocator::roundup_power2_next_division: split [2^k, 2^(k+1)) into
    # `divisions` equal steps and round up to the next step (1200 with 4 -> 1280).
    if size & (size - 1) == 0:
        return size
    power2_floor = 1 << (size.bit_length() - 1)
    step = power2_floor >> (divisions.bit_length() - 1)
    if step == 0:
        return power2_floor << 1
    floor = size & ~(step - 1)
    return size if floor == size else floor + step


def round_request(nbytes: int, *, roundup_power2_divisions: int = 0) -> int:
    """The block size the caching allocator hands out for a request of ``nbytes``.

    Mirrors ``round_size``: below 512 bytes a request takes 512 (``kMinBlockSize``);
    above, it rounds up to a multiple of 512. A 0-byte request takes nothing at all:
    ``NativeCachingAllocator::allocate`` returns a null pointer without calling
    ``malloc`` for size 0, so no block exists (``round_size(0)`` itself would say 512).
    With ``roundup_power2_divisions`` (``PYTORCH_CUDA_ALLOC_CONF``) set to a power of
    two ``d``, requests above ``512 * d`` round up to the next of ``d`` equal steps
    between powers of two (``roundup_power2_next_division``); a per-size-range list of
    divisions is not modelled, one value applies to every size.

    Args:
        nbytes: Bytes requested (a tensor's storage size).
        roundup_power2_divisions: 0 (the default: plain 512-byte rounding) or a power of
            two.

    Returns:
        The rounded size in bytes; this is what ``torch.cuda.memory_allocated`` counts.

    Example:
        >>> round_request(1), round_request(512), round_request(513), round_request(0)
        (512, 512, 1024, 0)
        >>> round_request(1200, roundup_power2_divisions=2)
        1536
    """
    check_nbytes(nbytes)
    divisions = check_divisions(roundup_power2_divisions)
    if nbytes == 0:
        return 0
    if nbytes < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    if divisions > 1 and nbytes > K_MIN_BLOCK_SIZE * divisions:
        return _roundup_power2_next_division(nbytes, divisions)
    return -(-nbytes // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE


def allocation_size(size: int) -> int:
    """The ``cudaMalloc`` size for a rounded request that no cached block fits."""
    # get_allocation_size: the cudaMalloc size for a rounded request with no cached fit.
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE


def segment_size(nbytes: int) -> int:
    """The segment ``cudaMalloc`` reserves when a request of ``nbytes`` finds no cached block.

    Mirrors ``get_allocation_size`` applied to the rounded request: up to 1 MiB
    (``kSmallSize``) a 2 MiB small-pool segment that later small requests share; in
    (1 MiB, 10 MiB) a 20 MiB segment (``kLargeBuffer``) that later mid-size requests
    share; from 10 MiB (``kMinLargeAlloc``) up, the request rounded up to 2 MiB
    (``kRoundLarge``). A 0-byte request reserves nothing. The 512-byte rounding comes
    first, so a request of 10 MiB - 1 byte already counts as 10 MiB.

    Example:
        >>> MiB = 2**20
        >>> [segment_size(n) // MiB for n in (1, MiB, MiB + 1, 10 * MiB - 512, 10 * MiB - 1)]
        [2, 2, 20, 20, 10]
        >>> segment_size(10 * MiB + 1) // MiB
        12
    """
    size = round_request(nbytes)
    return 0 if size == 0 else allocation_size(size)


@dataclasses.dataclass(frozen=True)
class SegmentInfo:
    """One ``cudaMalloc``'d segment, as ``torch.cuda.memory_snapshot()`` lists it.

    Attributes:
        address: Simulated base address.
        size: Bytes reserved by the segment.
        is_large: True for the large pool (requests > 1 MiB), False for the small pool.
        blocks: ``(size, allocated)`` per block, in address order: multiples of 512 bytes
            that add up to ``size``, no two free blocks side by side (``free_block``
            merges them).

    Raises:
        ValueError: The blocks do not tile the segment as the allocator makes them.
    """

    address: int
    size: int
    is_large: bool
    blocks: tuple[tuple[int, bool], ...]

    def __post_init__(self) -> None:
        """Check that the blocks tile the segment."""
        sizes = [size for size, _ in self.blocks]
        frees = [not used for _, used in self.blocks]
        if (
            sum(sizes) != self.size
            or any(size <= 0 or size % K_MIN_BLOCK_SIZE for size in sizes)
            or any(a and b for a, b in itertools.pairwise(frees))
        ):
            raise ValueError(
                f"the segment at {self.address} of {self.size} bytes has blocks "
                f"{self.blocks}; expected positive multiples of {K_MIN_BLOCK_SIZE} bytes "
                "adding up to the segment, with no two free blocks side by side"
            )

    @property
    def allocated(self) -> int:
        """Bytes of the segment's blocks in use."""
        return sum(size for size, used in self.blocks if used)


@dataclasses.dataclass(frozen=True)
class AllocatorStats:
    """Counters of a simulated caching allocator (cf. ``torch.cuda.memory_stats``).

    Attributes:
        allocated: Bytes in blocks handed out now (``memory_allocated``).
        reserved: Bytes in segments held now (``memory_reserved``).
        peak_allocated: Highest ``allocated`` (``max_memory_allocated``).
        peak_reserved: Highest ``reserved`` (``max_memory_reserved``).
        num_segments: Segments held now.
        num_device_allocs: ``cudaMalloc`` calls made.
        num_device_frees: ``cudaFree`` calls made (``empty_cache``, OOM retries).
        num_alloc_retries: Times a ``cudaMalloc`` failed and cached blocks were released.
    """

    allocated: int
    reserved: int
    peak_allocated: int
    peak_reserved: int
    num_segments: int
    num_device_allocs: int
    num_device_frees: int
    num_alloc_retries: int

    def to_dict(self) -> dict[str, int]:
        """Every field as a plain ``int``."""
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        """A small table in binary units."""
        rows = [
            ("allocated", format_bytes(self.allocated)),
            ("reserved", format_bytes(self.reserved)),
            ("peak allocated", format_bytes(self.peak_allocated)),
            ("peak reserved", format_bytes(self.peak_reserved)),
            ("segments", str(self.num_segments)),
            ("cudaMalloc calls", str(self.num_device_allocs)),
            ("cudaFree calls", str(self.num_device_frees)),
            ("alloc retries", str(self.num_alloc_retries)),
        ]
        return "\n".join(
            ["AllocatorStats (simulated CUDA caching allocator)"]
            + [f"  {name:<16}  {value:>12}" for name, value in rows]
        )


def oom_message(alloc_size: int, capacity: int, allocated: int, reserved: int) -> str:
    """The simulated ``torch.OutOfMemoryError`` text: what was asked, what is held."""
    return (
        f"CUDA out of memory (simulated). Tried to allocate {format_bytes(alloc_size)}; "
        f"capacity {format_bytes(capacity)}, of which {format_bytes(allocated)} is "
        f"allocated and {format_bytes(reserved - allocated)} is reserved but unallocated "
        "(held by partly used segments). Lower the batch size, or model "
        "expandable_segments / max_split_size to reduce fragmentation."
    )
