"""oneDNN's scratchpad bookkeeping: what one booked entry and one reducer cost.

A oneDNN primitive asks for all its temporary buffers as one *scratchpad*, a single
allocation from PyTorch's CPU allocator (ideep passes ``attr-scratchpad:user``), freed
when the primitive returns. Its size is the sum of its entries, each booked by
``registry_t::book`` (``src/common/memory_tracking.hpp``, uxlfoundation/oneDNN v3.12, the
version torch 2.13.0+cpu ships): the entry's size plus its alignment, at least 128 B;
entries aligned to a 4 KiB page cost 4 KiB more. A barrier context
(``simple_barrier::ctx_t``, ``cpu_barrier.hpp``) is aligned to 4 KiB, so each one costs
8 KiB. A ``cpu_reducer_t`` (``cpu_reducer.cpp``) books a page-aligned buffer of partial
sums and one barrier per group; a ``cpu_reducer_2d_t`` one buffer per thread of a group.
"""

from __future__ import annotations

__all__ = [
    "ALIGN",
    "BARRIER",
    "F32",
    "PAGE",
    "entry",
    "reducer_2d_bytes",
    "reducer_bytes",
    "up",
]

F32 = 4
ALIGN = 128  # registry_t default alignment
PAGE = 4096  # P4K
BARRIER = 2 * PAGE  # sizeof(ctx_t) == alignof(ctx_t) == 4096, booked at that alignment


def up(value: int, block: int) -> int:
    """``value`` rounded up to a multiple of ``block``.

    Example:
        >>> up(17, 16)
        32
    """
    return -(-value // block) * block


def entry(nbytes: int, align: int = ALIGN) -> int:
    """Bytes one scratchpad entry costs (``registry_t::book``); 0 for an empty one.

    Example:
        >>> entry(1000), entry(1000, PAGE), entry(0)
        (1128, 5096, 0)
    """
    return 0 if nbytes <= 0 else nbytes + max(align, ALIGN)


def _balance(
    threads: int, job_size: int, njobs: int, reduction: int, max_buffer: int
) -> tuple[int, int, int]:
    """(groups, threads per group, jobs per group) of ``reduce_balancer_t::balance``."""
    min_per_group = max(1, njobs // threads)
    max_per_group = max(1, max_buffer // (threads * job_size))
    groups = min(njobs // min_per_group, threads)
    per_group = min(threads // groups, reduction)
    jobs_ub = -(-njobs // groups)
    cost = njobs * job_size * reduction
    for candidate in range(min_per_group, njobs):
        c_groups = min(njobs // candidate, threads)
        c_per_group = min(threads // c_groups, reduction)
        c_jobs_ub = -(-njobs // c_groups)
        if c_per_group > 1 and c_jobs_ub > max_per_group:
            continue
        c_cost = job_size * c_jobs_ub * (-(-reduction // c_per_group) + (c_per_group != 1))
        if c_cost < cost:
            groups, per_group, jobs_ub, cost = c_groups, c_per_group, c_jobs_ub, c_cost
    return groups, per_group, jobs_ub


def reducer_bytes(threads: int, job_size: int, njobs: int, reduction: int, max_buffer: int) -> int:
    """Scratchpad of one ``cpu_reducer_t`` (``reduce_balancer_t::balance``), in bytes.

    Example:
        >>> reducer_bytes(2, 16, 1, 2, 2 * 3 * 5 * 5 * 16 * 16)  # a bias of 16, batch 2
        12352
    """
    groups, per_group, jobs_ub = _balance(threads, job_size, njobs, reduction, max_buffer)
    if per_group == 1:
        return 0
    space = groups * (per_group - 1) * jobs_ub * job_size * F32
    return entry(space, PAGE) + entry(groups * PAGE, PAGE)


def reducer_2d_bytes(
    threads: int, job_size: int, njobs: int, reduction: int, max_buffer: int
) -> int:
    """Scratchpad of one ``cpu_reducer_2d_t``: every thread of a group gets a buffer.

    ``cpu_reducer_2d_t::conf_t::init_scratchpad`` (``cpu_reducer.cpp``, oneDNN v3.12)
    books ``ngroups * nthr_per_group * njobs_per_group_ub * job_size`` floats at the
    default alignment and one barrier per group; nothing when a group has one thread.

    Example:
        >>> reducer_2d_bytes(2, 2048, 1, 1024, 2 * 2048 * 8)  # 32x64 1x1 weights, 2 threads
        24704
    """
    groups, per_group, jobs_ub = _balance(threads, job_size, njobs, reduction, max_buffer)
    if per_group == 1:
        return 0
    return entry(groups * per_group * jobs_ub * job_size * F32) + entry(groups * PAGE, PAGE)
