"""The caching-allocator model against real CUDA memory snapshots of training steps.

Nineteen steps measured by this project on an NVIDIA H200 (torch 2.11.0+cu130, driver
580.159.04) in two runs: a warm-up step, then the measured step under
``torch.cuda.memory._record_memory_history`` (run b's I1: one forward after a warm-up
forward); the snapshots, stripped of stacks, are in ``tests/memory/allocator/data/``
(``h200_snapshots.json.gz``, ``h200_b_snapshots.json.gz``). Each step's trace is replayed
through `CachingAllocator` two ways:

- ``replay``: from the allocator's real state when the step began (`replay_snapshot`);
- ``compact start``: the same events from an allocator that holds only the tensors live
  at the start, allocated one after another into empty segments. This is how a replay of
  one traced step from nothing starts (what `trace(..., device="cuda")` did before it
  replayed its own warm-up step first): it lacks the segments and the holes the warm-up
  step left.

Run: python benchmarks/allocator_snapshots.py
"""

import gzip
import itertools
import json
import pathlib

from torchfit.memory.allocator import CachingAllocator, read_snapshot, replay_snapshot

DATA = pathlib.Path(__file__).parents[1] / "tests/memory/allocator/data"
FILES = ("h200_snapshots.json.gz", "h200_b_snapshots.json.gz")
GiB = 2**30


def compact_start(trace):
    """Peak reserved of the trace's events from its live tensors packed into fresh segments."""
    allocator = CachingAllocator()
    handles = {}
    for segment in trace.segments:
        sizes = [size for size, _ in segment.blocks]
        starts = itertools.accumulate(sizes[:-1], initial=segment.address)
        for addr, (size, used) in zip(starts, segment.blocks, strict=True):
            if used:
                handles[addr] = allocator.malloc(size)
    for action, addr, size in trace.events:
        if action == "alloc":
            handles[addr] = allocator.malloc(size)
        elif action == "free_completed":
            allocator.free(handles.pop(addr))
    return allocator.peak_reserved


def main():
    cases = [
        case
        for name in FILES
        for case in json.loads(gzip.decompress((DATA / name).read_bytes()))["cases"]
    ]
    print(f"{'case':<51} {'measured':>9} {'replay':>9} {'err':>6} {'same addr':>11} "
          f"{'compact start':>13} {'err':>6}")  # fmt: skip
    print("-" * 111)
    for case in cases:
        measured = case["measured"]["max_memory_reserved"]
        trace = read_snapshot(case["snapshot"])
        replayed = replay_snapshot(trace)
        compact = compact_start(trace)
        same = f"{replayed.same_address}/{replayed.allocations}"
        print(
            f"{case['case']:<51} {measured / GiB:>9.2f} {replayed.stats.peak_reserved / GiB:>9.2f} "
            f"{100 * (replayed.stats.peak_reserved / measured - 1):>+5.1f}% {same:>11} "
            f"{compact / GiB:>13.2f} {100 * (compact / measured - 1):>+5.1f}%"
        )
    print("GiB of max_memory_reserved over the measured step")


if __name__ == "__main__":
    main()
