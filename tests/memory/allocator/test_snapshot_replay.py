"""The caching-allocator model against real CUDA memory snapshots, and their reading.

``data/`` holds nineteen steps measured by this project on an NVIDIA H200 (torch
2.11.0+cu130, driver 580.159.04) in two runs (`memory.allocator.h200`): each step's
memory snapshot (stripped of stacks) and its measured ``max_memory_reserved`` /
``max_memory_allocated``. Replayed from the allocator's state when recording began, the
model must give those peaks, and place every block where the real allocator did.
"""

import pickle
from unittest import mock

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from memory.allocator import h200
from torchfit.memory.allocator import (
    CachingAllocator,
    SegmentInfo,
    SnapshotEvent,
    read_snapshot,
    replay_snapshot,
    round_request,
)
from torchfit.memory.allocator.blocks import FreePool

MiB = 2**20
CASES = sorted({**h200.run("a"), **h200.run("b")})


def test_the_data_holds_the_measured_steps():
    assert len(h200.run("a")) == 7
    assert len(h200.run("b")) == 12  # the generate case left out (make_h200_snapshots.py)
    assert sum(path.stat().st_size for path in h200.FILES.values()) < 1_000_000


@pytest.mark.parametrize("name", CASES)
def test_replay_gives_the_measured_peaks(name):
    case = h200.case(name)
    measured = case["measured"]
    replayed = replay_snapshot(case["snapshot"])
    reserved = replayed.stats.peak_reserved
    assert abs(reserved / measured["max_memory_reserved"] - 1) < 0.005, (name, reserved)
    allocated = replayed.stats.peak_allocated
    assert abs(allocated / measured["max_memory_allocated"] - 1) < 0.001, (name, allocated)


@pytest.mark.parametrize("name", CASES)
def test_replay_follows_the_real_allocator_block_for_block(name):
    replayed = replay_snapshot(h200.case(name)["snapshot"])
    assert replayed.allocations > 600
    assert replayed.same_address == replayed.allocations, replayed.first_divergence
    assert replayed.same_end_state
    assert replayed.stats.peak_reserved == replayed.recorded_peak_reserved
    assert replayed.stats.peak_allocated == h200.case(name)["measured"]["max_memory_allocated"]


@pytest.mark.parametrize("name", CASES)
def test_the_start_state_is_what_the_allocator_held_before_the_step(name):
    case = h200.case(name)
    trace = read_snapshot(case["snapshot"])
    assert trace.reserved == case["measured"]["memory_reserved_before"]
    assert trace.allocated == case["measured"]["memory_allocated_before"]
    assert trace.recorded_peak_reserved == case["measured"]["max_memory_reserved"]


def _highest_address_first(pool, size):
    fits = [key for key in pool.keys if key[0] >= size]
    if not fits:
        return None
    best = [key for key in fits if key[0] == fits[0][0]]
    return pool.blocks[best[-1][1]]


def _first_fit(pool, size):
    fits = [key for key in pool.keys if key[0] >= size]
    return pool.blocks[min(fits, key=lambda key: key[1])[1]] if fits else None


def test_the_data_tells_a_wrong_model_apart():
    # Best fit with ties to the highest address misplaces blocks; first fit by address
    # also reserves far more: the checks above can fail.
    snapshot = h200.case("T01_gpt2_fp32_b8_s1024")["snapshot"]
    measured = h200.case("T01_gpt2_fp32_b8_s1024")["measured"]["max_memory_reserved"]
    with mock.patch.object(FreePool, "lower_bound", _highest_address_first):
        ties = replay_snapshot(snapshot)
    assert ties.same_address < ties.allocations / 2
    with mock.patch.object(FreePool, "lower_bound", _first_fit):
        first = replay_snapshot(snapshot)
    assert first.stats.peak_reserved > measured * 1.1


# --- reading a snapshot: synthetic ones ------------------------------------------------


def segment(address, blocks, kind="large", stream=0):
    states = {True: "active_allocated", False: "inactive"}
    return {
        "address": address,
        "total_size": sum(size for size, _ in blocks),
        "segment_type": kind,
        "stream": stream,
        "blocks": [{"size": size, "state": states[used]} for size, used in blocks],
    }


def entry(action, addr, size, stream=0):
    return {"action": action, "addr": addr, "size": size, "stream": stream}


def free(addr, size):
    return [entry("free_requested", addr, size), entry("free_completed", addr, size)]


A, B, C = 1 << 30, 2 << 30, 3 << 30


def tiny_snapshot():
    # A (20 MiB): a 3 MiB block live throughout, then a block freed in the trace whose
    # request (16.5 MiB + 512) left 0.5 MiB - 512 unsplit behind it: 17 MiB at the start.
    # B (2 MiB, small pool): a 512-byte block live at the start is freed; another is
    # allocated and freed. C (18 MiB): reserved by the trace for an 18 MiB block.
    trace = [
        entry("alloc", B + 512, 1000),
        *free(B + 512, 1000),
        *free(B, 100),
        *free(A + 3 * MiB, 16 * MiB + MiB // 2 + 512),
        entry("segment_alloc", C, 18 * MiB),
        entry("alloc", C, 18 * MiB),
    ]
    segments = [
        segment(A, [(3 * MiB, True), (17 * MiB, False)]),
        segment(B, [(2 * MiB, False)], kind="small"),
        segment(C, [(18 * MiB, True)]),
    ]
    return {"segments": segments, "device_traces": [trace]}


def test_read_snapshot_walks_the_end_state_back_to_the_start():
    trace = read_snapshot(tiny_snapshot())
    assert trace.segments == (
        SegmentInfo(A, 20 * MiB, True, ((3 * MiB, True), (17 * MiB, True))),
        SegmentInfo(B, 2 * MiB, False, ((512, True), (2 * MiB - 512, False))),
    )
    assert (trace.reserved, trace.allocated) == (22 * MiB, 20 * MiB + 512)
    assert trace.recorded_peak_reserved == 40 * MiB
    assert trace.events[0] == SnapshotEvent("alloc", B + 512, 1000)
    assert trace.end_segments[2] == SegmentInfo(C, 18 * MiB, True, ((18 * MiB, True),))


@pytest.mark.parametrize(
    ("kind", "gap", "asked", "blocks"),
    [
        # large pool: 1 MiB behind a 2 MiB request stays in the block (should_split wants
        # more than kSmallSize); 2 MiB behind it is a free block of its own.
        ("large", 3 * MiB, 2 * MiB, ((3 * MiB, True),)),
        ("large", 4 * MiB, 2 * MiB, ((2 * MiB, True), (2 * MiB, False))),
        # small pool: every block is its rounded request.
        ("small", 1536, 100, ((512, True), (1024, False))),
    ],
)
def test_a_block_freed_in_the_trace_is_its_request_and_any_unsplit_remainder(
    kind, gap, asked, blocks
):
    size = 20 * MiB if kind == "large" else 2 * MiB
    snap = {
        "segments": [segment(A, [(gap, False), (size - gap, True)], kind=kind)],
        "device_traces": [free(A, asked)],
    }
    assert read_snapshot(snap).segments[0].blocks[:-1] == blocks


def test_replay_of_the_tiny_snapshot_follows_it():
    replayed = replay_snapshot(tiny_snapshot())
    assert (replayed.allocations, replayed.same_address) == (2, 2)
    assert replayed.same_end_state
    assert replayed.stats.peak_reserved == 40 * MiB
    assert replayed.stats.peak_allocated == 21 * MiB
    assert "same end state" in str(replayed)


def test_a_run_of_segment_frees_is_an_empty_cache():
    trace = [
        *free(A, 20 * MiB),
        entry("segment_free", A, 20 * MiB),
        entry("segment_alloc", B, 20 * MiB),
        entry("alloc", B, 20 * MiB),
    ]
    snap = {"segments": [segment(B, [(20 * MiB, True)])], "device_traces": [trace]}
    start = read_snapshot(snap)
    assert start.segments == (SegmentInfo(A, 20 * MiB, True, ((20 * MiB, True),)),)
    replayed = replay_snapshot(start)
    assert replayed.same_end_state and replayed.same_address == 1
    assert replayed.stats.peak_reserved == 20 * MiB == replayed.recorded_peak_reserved
    assert replayed.stats.num_device_frees == 1


def test_read_snapshot_reads_a_pickle(tmp_path):
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(tiny_snapshot()))
    assert read_snapshot(path) == read_snapshot(tiny_snapshot())
    (tmp_path / "other.pickle").write_bytes(pickle.dumps([1, 2]))
    with pytest.raises(ValueError, match="holds no memory snapshot"):
        read_snapshot(tmp_path / "other.pickle")


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda s: s["device_traces"][0].append(entry("alloc", C, 512, 7)), "2 streams"),
        (
            lambda s: s.update(allocator_settings={"expandable_segments": True}),
            "allocator settings",
        ),
        (
            lambda s: s.update(allocator_settings={"max_split_size": 100 * MiB}),
            "allocator settings",
        ),
        (
            lambda s: s.update(allocator_settings={"garbage_collection_threshold": 0.6}),
            "garbage_collection_threshold",
        ),
        (lambda s: s["device_traces"][0].append(entry("segment_map", A, MiB)), "segment_map"),
        (lambda s: s["device_traces"][0].insert(0, entry("alloc", A + MiB, 512)), "not live after"),
        (lambda s: s["segments"].pop(1), "in no segment"),
        (lambda s: s["device_traces"][0].extend(free(A + MiB, 512)), "overlap"),
        (lambda s: s["device_traces"][0].extend(free(A + 20 * MiB - 512, 2 * MiB)), "runs past"),
    ],
)
def test_read_snapshot_refuses_what_it_cannot_replay(change, match):
    snap = tiny_snapshot()
    change(snap)
    with pytest.raises(ValueError, match=match):
        read_snapshot(snap)


def test_read_snapshot_needs_the_device_trace():
    with pytest.raises(ValueError, match="none for device 1"):
        read_snapshot(tiny_snapshot(), device=1)


def test_adopted_segments_must_not_overlap():
    allocator = CachingAllocator()
    allocator.adopt_segment(SegmentInfo(A, 20 * MiB, True, ((20 * MiB, False),)))
    with pytest.raises(ValueError, match="overlaps"):
        allocator.adopt_segment(SegmentInfo(A + MiB, 2 * MiB, False, ((2 * MiB, False),)))
    with pytest.raises(ValueError, match="no two free blocks"):
        SegmentInfo(B, 2 * MiB, False, ((MiB, False), (MiB, False)))
    placed = CachingAllocator(placement=lambda size: A)
    placed.adopt_segment(SegmentInfo(A, 2 * MiB, False, ((2 * MiB, True),)))
    with pytest.raises(ValueError, match="overlaps"):
        placed.malloc(512)


# --- a round trip: record the model as torch records the real allocator ---------------

ops = st.lists(
    st.tuples(st.sampled_from(["alloc", "alloc", "free", "empty"]), st.integers(1, 30 * MiB)),
    max_size=50,
)


def record(allocator, steps, requested, live, trace):
    """Run ``steps`` on ``allocator``; append what torch would trace to ``trace``."""
    for action, n in steps:
        before = {s.address: s.size for s in allocator.segments()}
        if action == "alloc":
            handle = allocator.malloc(n)
            after = {s.address: s.size for s in allocator.segments()}
            trace += [entry("segment_alloc", a, after[a]) for a in after.keys() - before.keys()]
            trace.append(entry("alloc", allocator.address(handle), n))
            requested[handle] = n
            live.append(handle)
        elif action == "free" and live:
            handle = live.pop(n % len(live))
            trace += free(allocator.address(handle), requested[handle])
            allocator.free(handle)
        elif action == "empty":
            allocator.empty_cache()
            after = {s.address for s in allocator.segments()}
            trace += [entry("segment_free", a, before[a]) for a in before.keys() - after]


def ambiguous(start, trace, requested_by_addr):
    # A block freed in the trace that kept an unsplit remainder and has a free neighbour
    # behind it: the snapshot cannot tell remainder from neighbour.
    freed = {e["addr"] for e in trace if e["action"] == "free_requested"}
    for seg in start:
        addr = seg.address
        for (size, used), (_, next_used) in zip(
            seg.blocks, [*seg.blocks[1:], (0, True)], strict=True
        ):
            remainder = used and addr in freed and size != round_request(requested_by_addr[addr])
            if remainder and not next_used:
                return True
            addr += size
    return False


@settings(max_examples=150, deadline=None)
@given(ops, ops)
def test_read_snapshot_recovers_the_start_of_a_recorded_model(before, during):
    allocator = CachingAllocator()
    requested, live = {}, []
    record(allocator, before, requested, live, [])
    start = allocator.segments()
    at_start = {allocator.address(h): requested[h] for h in live}
    trace = []
    record(allocator, during, requested, live, trace)
    assume(not ambiguous(start, trace, at_start))
    states = {True: "active_allocated", False: "inactive"}
    snap = {
        "segments": [
            {
                "address": s.address,
                "total_size": s.size,
                "segment_type": "large" if s.is_large else "small",
                "stream": 0,
                "blocks": [{"size": size, "state": states[used]} for size, used in s.blocks],
            }
            for s in allocator.segments()
        ],
        "device_traces": [trace],
    }
    read = read_snapshot(snap)
    assert read.segments == start
    replayed = replay_snapshot(read)
    assert replayed.same_address == replayed.allocations
    assert replayed.same_end_state
    assert replayed.stats.peak_reserved == read.recorded_peak_reserved
