import itertools
import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchfit.memory import allocator as al
from torchfit.memory.allocator import (
    CachingAllocator,
    approximate_reserved,
    cublas_workspace_bytes,
    cuda_context_bytes,
    matmul_threads,
    replay,
    round_request,
    segment_size,
    to_device,
)
from torchfit.memory.allocator.rules import _roundup_power2_next_division
from torchfit.memory.gpus import GPU
from torchfit.memory.result import MemoryEstimate

KiB = 2**10
MiB = 2**20


# --- a straightforward reference: segments as lists of blocks, linear best-fit ---------


def ref_round(n):
    if n == 0:
        return 0
    return max(512, -(-n // 512) * 512)


def ref_segment(size):
    if size <= MiB:
        return 2 * MiB
    if size < 10 * MiB:
        return 20 * MiB
    return -(-size // (2 * MiB)) * 2 * MiB


class RefAllocator:
    """Each segment: {"addr", "size", "small", "blocks": [[offset, size, owner]]}."""

    def __init__(self, capacity=None, max_split_size=None):
        self.capacity = capacity
        self.mss = max_split_size
        self.segments = []
        self.next_addr = 0
        self.next_handle = 0
        self.where = {}  # live handle -> segment (None for 0-byte requests)
        self.allocated = self.reserved = self.peak_allocated = self.peak_reserved = 0

    def free_blocks(self, small):
        return [
            (block[1], seg["addr"] + block[0], seg, block)
            for seg in self.segments
            if seg["small"] == small
            for block in seg["blocks"]
            if block[2] is None
        ]

    def cuda_malloc(self, size, small):
        if self.capacity is not None and self.reserved + size > self.capacity:
            return None
        seg = {"addr": self.next_addr, "size": size, "small": small, "blocks": [[0, size, None]]}
        self.next_addr += size
        self.segments.append(seg)
        self.reserved += size
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return seg, seg["blocks"][0]

    def release(self, seg):
        self.segments.remove(seg)
        self.reserved -= seg["size"]

    def release_oversize(self, small, size):
        if self.mss is None:
            return False
        target = max(size, self.mss)
        fits = [c for c in self.free_blocks(small) if c[0] >= target]
        if fits:
            self.release(min(fits, key=lambda c: c[:2])[2])
            return True
        released = 0
        for block_size, _, seg, _ in sorted(self.free_blocks(small), key=lambda c: c[:2])[::-1]:
            if released >= target or block_size < self.mss:
                break
            assert len(seg["blocks"]) == 1
            released += block_size
            self.release(seg)
        return released >= target

    def empty_cache(self):
        for seg in list(self.segments):
            if len(seg["blocks"]) == 1 and seg["blocks"][0][2] is None:
                self.release(seg)

    def malloc(self, nbytes):
        handle = self.next_handle
        self.next_handle += 1
        if nbytes == 0:
            self.where[handle] = None
            return handle
        size = ref_round(nbytes)
        small = size <= MiB
        fits = [c for c in self.free_blocks(small) if c[0] >= size]
        found = min(fits, key=lambda c: c[:2]) if fits else None
        if (
            found is not None
            and self.mss is not None
            and (size < self.mss <= found[0] or (size >= self.mss and found[0] >= size + 20 * MiB))
        ):
            found = None
        if found is not None:
            seg, block = found[2], found[3]
        else:
            got = self.cuda_malloc(ref_segment(size), small)
            if got is None and self.release_oversize(small, size):
                got = self.cuda_malloc(ref_segment(size), small)
            if got is None:
                self.empty_cache()
                got = self.cuda_malloc(ref_segment(size), small)
            if got is None:
                raise torch.OutOfMemoryError("reference OOM")
            seg, block = got
        rest = block[1] - size
        split = rest >= 512 if small else rest > MiB and (self.mss is None or size < self.mss)
        if split:
            i = seg["blocks"].index(block)
            seg["blocks"][i : i + 1] = [[block[0], size, handle], [block[0] + size, rest, None]]
            self.allocated += size
        else:
            block[2] = handle
            self.allocated += block[1]
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.where[handle] = seg
        return handle

    def free(self, handle):
        seg = self.where.pop(handle)
        if seg is None:
            return
        for block in seg["blocks"]:
            if block[2] == handle:
                block[2] = None
                self.allocated -= block[1]
        merged = []
        for block in seg["blocks"]:
            if merged and merged[-1][2] is None and block[2] is None:
                merged[-1][1] += block[1]
            else:
                merged.append(block)
        seg["blocks"] = merged

    def layout(self):
        return [
            (
                s["addr"],
                s["size"],
                not s["small"],
                tuple((b[1], b[2] is not None) for b in s["blocks"]),
            )
            for s in sorted(self.segments, key=lambda s: s["addr"])
        ]


def layout(a):
    return [(s.address, s.size, s.is_large, s.blocks) for s in a.segments()]


# --- random operation sequences, biased to small sizes --------------------------------

boundaries = [0, 1, 511, 512, 513, MiB - 512, MiB, MiB + 1, 10 * MiB - 512, 10 * MiB]
boundaries += [k * MiB for k in (12, 19, 20, 32, 40, 52, 60, 64)]
sizes = st.one_of(
    st.integers(0, 4 * KiB),
    st.integers(1, MiB + 4 * KiB),
    st.sampled_from(boundaries),
    st.integers(1, 80).map(lambda k: k * 512 * KiB),  # round sizes: ties, exact remainders
    st.integers(1, 100 * MiB),
)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("malloc"), sizes),
        st.tuples(st.just("free"), st.integers(0, 2**16)),
        st.tuples(st.just("malloc"), sizes),
        st.tuples(st.just("free"), st.integers(0, 2**16)),
        st.tuples(st.just("empty_cache"), st.just(0)),
    ),
    max_size=60,
)
configs = st.fixed_dictionaries(
    {
        "capacity": st.one_of(st.none(), st.integers(20 * MiB, 200 * MiB)),
        "max_split_size": st.one_of(st.none(), st.sampled_from([20 * MiB, 32 * MiB, 64 * MiB])),
    }
)


def run_both(sim, ref, op, arg, live):
    """Apply one op to both; True when both raised OutOfMemoryError."""
    if op == "malloc":
        outcomes = []
        for a in (sim, ref):
            try:
                outcomes.append(a.malloc(arg))
            except torch.OutOfMemoryError:
                outcomes.append(None)
        assert (outcomes[0] is None) == (outcomes[1] is None)
        if outcomes[0] is not None:
            live.append(tuple(outcomes))
        return outcomes[0] is None
    if op == "free" and live:
        h_sim, h_ref = live.pop(arg % len(live))
        sim.free(h_sim)
        ref.free(h_ref)
    elif op == "empty_cache":
        sim.empty_cache()
        ref.empty_cache()
    return False


@given(ops, configs)
@settings(max_examples=400, deadline=None)
def test_simulator_matches_the_reference_after_every_event(sequence, config):
    sim, ref, live = CachingAllocator(**config), RefAllocator(**config), []
    for op, arg in sequence:
        run_both(sim, ref, op, arg, live)
        assert sim.allocated == ref.allocated
        assert sim.reserved == ref.reserved
        assert sim.peak_allocated == ref.peak_allocated
        assert sim.peak_reserved == ref.peak_reserved
        assert sim.num_segments == len(ref.segments)
        assert layout(sim) == ref.layout()


@given(ops, configs)
@settings(max_examples=100, deadline=None)
def test_invariants_hold_after_every_event(sequence, config):
    sim, ref, live = CachingAllocator(**config), RefAllocator(**config), []
    for op, arg in sequence:
        run_both(sim, ref, op, arg, live)
        segments = sim.segments()
        assert sim.allocated <= sim.reserved
        assert sim.reserved == sum(s.size for s in segments)
        assert sim.allocated == sum(s.allocated for s in segments)
        if config["capacity"] is not None:
            assert sim.peak_reserved <= config["capacity"]
        for s in segments:
            assert sum(size for size, _ in s.blocks) == s.size
            assert all(size % 512 == 0 for size, _ in s.blocks)
            free_flags = [not used for _, used in s.blocks]
            assert not any(a and b for a, b in itertools.pairwise(free_flags))
    sim.empty_cache()
    after = sim.segments()
    assert sim.reserved == sum(s.size for s in after if s.allocated)
    assert all(s.allocated or len(s.blocks) > 1 for s in after)


@given(ops)
@settings(max_examples=60, deadline=None)
def test_replay_matches_the_reference(sequence):
    ref, events, live, key = RefAllocator(), [], [], 0
    for op, arg in sequence:
        if op == "malloc":
            ref.malloc(arg)
            events.append((key, arg))
            live.append(key)
            key += 1
        elif op == "free" and live:
            freed = live.pop(arg % len(live))
            ref.free(freed)  # reference handles are the keys: both count from 0
            events.append((freed,))
    stats = replay(events)
    assert (stats.peak_allocated, stats.peak_reserved) == (ref.peak_allocated, ref.peak_reserved)
    assert (stats.allocated, stats.reserved) == (ref.allocated, ref.reserved)


# --- the pure size rules, on examples from the source ----------------------------------


@pytest.mark.parametrize(
    ("nbytes", "expected"),
    [(0, 0), (1, 512), (511, 512), (512, 512), (513, 1024), (MiB, MiB), (MiB + 1, MiB + 512)],
)
def test_round_request(nbytes, expected):
    assert round_request(nbytes) == expected


@given(st.integers(1, 2**40))
@settings(max_examples=200, deadline=None)
def test_round_request_is_the_least_multiple_of_512_that_holds_the_request(n):
    r = round_request(n)
    assert r % 512 == 0
    assert r >= n > r - 512


def test_power2_divisions_example_of_the_source_comment():
    # The worked example in the comment above roundup_power2_next_division (1200, 4 -> 1280).
    assert _roundup_power2_next_division(1200, 4) == 1280
    assert _roundup_power2_next_division(4096, 4) == 4096


@pytest.mark.parametrize(
    ("nbytes", "divisions", "expected"),
    [
        (1200, 4, 1536),  # 1200 <= 512 * 4: plain 512 rounding applies
        (3000, 4, 3072),  # [2048, 4096) in steps of 512
        (5 * MiB + 1, 4, 6 * MiB),  # [4, 8) MiB in steps of 1 MiB
        (5 * MiB + 1, 1, 5 * MiB + 512),  # 1 means off
        (5 * MiB + 1, 0, 5 * MiB + 512),
    ],
)
def test_round_request_with_power2_divisions(nbytes, divisions, expected):
    assert round_request(nbytes, roundup_power2_divisions=divisions) == expected


@given(st.integers(1, 2**36), st.sampled_from([2, 4, 8, 16]))
@settings(max_examples=200, deadline=None)
def test_power2_divisions_round_up_to_a_multiple_of_512(n, divisions):
    r = round_request(n, roundup_power2_divisions=divisions)
    assert r >= n
    assert r % 512 == 0
    assert r >= round_request(n)


@pytest.mark.parametrize(
    ("nbytes", "expected"),
    [
        (0, 0),
        (1, 2 * MiB),
        (MiB, 2 * MiB),  # kSmallSize is still small
        (MiB + 1, 20 * MiB),
        (10 * MiB - 512, 20 * MiB),
        (10 * MiB - 1, 10 * MiB),  # rounds to 10 MiB first: kMinLargeAlloc
        (10 * MiB + 1, 12 * MiB),
        (100 * MiB + 1, 102 * MiB),
    ],
)
def test_segment_size(nbytes, expected):
    assert segment_size(nbytes) == expected


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda: round_request(-1), ValueError),
        (lambda: round_request(True), TypeError),
        (lambda: round_request(1.5), TypeError),
        (lambda: round_request(10, roundup_power2_divisions=3), ValueError),
        (lambda: CachingAllocator(max_split_size=10 * MiB), ValueError),
        (lambda: CachingAllocator(capacity=-1), ValueError),
    ],
)
def test_bad_arguments_fail_at_the_door(call, error):
    with pytest.raises(error):
        call()


# --- the simulator on hand-worked cases -----------------------------------------------


def test_a_remainder_of_at_most_1_mib_is_not_split_off_in_the_large_pool():
    a = CachingAllocator()
    a.malloc(19 * MiB)  # a 20 MiB segment; 1 MiB would remain: not > kSmallSize
    assert (a.allocated, a.reserved) == (20 * MiB, 20 * MiB)
    assert layout(a) == [(0, 20 * MiB, True, ((20 * MiB, True),))]


def test_small_requests_share_2_mib_segments():
    a = CachingAllocator()
    a.malloc(MiB)
    a.malloc(MiB)
    assert (a.allocated, a.reserved, a.num_segments) == (2 * MiB, 2 * MiB, 1)
    a.malloc(1)
    assert (a.allocated, a.reserved, a.num_segments) == (2 * MiB + 512, 4 * MiB, 2)


def test_best_fit_takes_the_smallest_free_block_that_fits():
    a = CachingAllocator()
    x, y = a.malloc(14 * MiB), a.malloc(12 * MiB)
    a.free(x)
    a.free(y)
    a.malloc(11 * MiB)  # fits both; the 12 MiB block is the smaller one
    assert [s.blocks for s in a.segments()] == [((14 * MiB, False),), ((12 * MiB, True),)]
    assert a.allocated == 12 * MiB


def test_freed_neighbours_coalesce_within_a_segment():
    a = CachingAllocator()
    x, y, _ = a.malloc(5 * MiB), a.malloc(5 * MiB), a.malloc(5 * MiB)
    a.free(x)
    a.free(y)  # one free 10 MiB block at the front of the 20 MiB segment
    a.malloc(9 * MiB)  # fits only because the two 5 MiB blocks merged
    assert a.num_segments == 1
    assert a.segments()[0].blocks == ((10 * MiB, True), (5 * MiB, True), (5 * MiB, False))


def test_empty_cache_releases_only_wholly_free_segments():
    a = CachingAllocator()
    x, y = a.malloc(3 * MiB), a.malloc(3 * MiB)
    z = a.malloc(50 * MiB)
    a.free(x)
    a.free(z)
    a.empty_cache()
    assert (a.reserved, a.num_segments, a.peak_reserved) == (20 * MiB, 1, 70 * MiB)
    a.free(y)
    a.empty_cache()
    assert (a.reserved, a.num_segments) == (0, 0)


def test_zero_byte_requests_allocate_nothing():
    a = CachingAllocator()
    h = a.malloc(0)
    assert (a.allocated, a.reserved) == (0, 0)
    a.free(h)
    with pytest.raises(ValueError, match="not a live allocation"):
        a.free(h)


def test_out_of_memory_releases_cached_segments_then_retries():
    a = CachingAllocator(capacity=30 * MiB)
    x = a.malloc(5 * MiB)  # 20 MiB segment
    a.malloc(1)  # 2 MiB small segment
    a.free(x)
    a.malloc(25 * MiB)  # 26 MiB does not fit beside 22 MiB: the free 20 MiB goes first
    s = a.stats()
    assert (s.reserved, s.num_segments, s.num_device_frees, s.num_alloc_retries) == (
        28 * MiB,
        2,
        1,
        1,
    )


def test_a_segment_may_fill_the_capacity_exactly():
    a = CachingAllocator(capacity=22 * MiB)
    a.malloc(20 * MiB)
    a.malloc(1)  # 20 + 2 == 22 MiB: fits
    assert a.reserved == 22 * MiB
    with pytest.raises(torch.OutOfMemoryError):
        a.malloc(MiB + 512)  # a 20 MiB large segment would need 42 MiB


def test_out_of_memory_raises_a_real_torch_out_of_memory_error():
    a = CachingAllocator(capacity=30 * MiB)
    a.malloc(20 * MiB)
    with pytest.raises(torch.OutOfMemoryError, match=r"Tried to allocate 12\.00 MiB") as info:
        a.malloc(12 * MiB)
    assert type(info.value) is torch.OutOfMemoryError
    assert isinstance(info.value, RuntimeError)
    assert (a.allocated, a.reserved) == (20 * MiB, 20 * MiB)  # state intact


def test_max_split_size_keeps_oversize_blocks_whole_and_for_large_requests():
    a = CachingAllocator(max_split_size=32 * MiB)
    x = a.malloc(40 * MiB)
    a.free(x)
    a.malloc(5 * MiB)  # may not take the oversize 40 MiB block: new 20 MiB segment
    assert a.num_segments == 2
    a.malloc(34 * MiB)  # oversize request: takes the 40 MiB block whole (within 20 MiB)
    assert a.allocated == 5 * MiB + 40 * MiB
    assert a.segments()[0].blocks == ((40 * MiB, True),)


def test_max_split_size_releases_the_smallest_oversize_block_that_is_enough():
    a = CachingAllocator(capacity=70 * MiB, max_split_size=32 * MiB)
    x = a.malloc(40 * MiB)
    a.malloc(19 * MiB)  # a whole 20 MiB segment
    a.free(x)
    a.malloc(12 * MiB)  # may not use the oversize block; 72 MiB > 70: release it first
    assert [s.size for s in a.segments()] == [20 * MiB, 12 * MiB]
    assert a.stats().num_alloc_retries == 0


def test_max_split_size_releases_oversize_blocks_from_the_largest_down():
    a = CachingAllocator(capacity=150 * MiB, max_split_size=32 * MiB)
    x, w, y = a.malloc(40 * MiB), a.malloc(36 * MiB), a.malloc(3 * MiB)
    for h in (x, w, y):
        a.free(h)
    a.malloc(70 * MiB)  # 96 + 70 > 150: release 40, then 36 (>= 70 released), not the 20
    assert [s.size for s in a.segments()] == [20 * MiB, 70 * MiB]
    assert a.stats().num_alloc_retries == 0


def test_equal_size_blocks_tie_on_the_lowest_address():
    a = CachingAllocator()
    x, y = a.malloc(10 * MiB), a.malloc(10 * MiB)
    a.free(y)
    a.free(x)  # both 10 MiB segments free; freed in the opposite order of their addresses
    a.malloc(5 * MiB)
    assert [s.blocks for s in a.segments()] == [
        ((5 * MiB, True), (5 * MiB, False)),
        ((10 * MiB, False),),
    ]


@pytest.mark.parametrize(
    ("cached", "request_", "reused"),
    [
        (32 * MiB, 12 * MiB, False),  # an oversize block (== max_split_size) is refused
        (30 * MiB, 12 * MiB, True),  # below max_split_size: reused and split
        (60 * MiB, 40 * MiB, False),  # would waste 20 MiB: refused
        (58 * MiB, 40 * MiB, True),  # wastes 18 MiB: reused whole
    ],
)
def test_max_split_size_rules_at_their_boundaries(cached, request_, reused):
    a = CachingAllocator(max_split_size=32 * MiB)
    a.free(a.malloc(cached))
    a.malloc(request_)
    assert (a.num_segments == 1) == reused
    if reused and request_ >= 32 * MiB:
        assert a.allocated == cached  # an oversize request never splits its block


def test_max_split_size_release_counts_a_block_of_exactly_max_split_size():
    a = CachingAllocator(capacity=100 * MiB, max_split_size=32 * MiB)
    x, w = a.malloc(32 * MiB), a.malloc(40 * MiB)
    a.free(x)
    a.free(w)
    a.malloc(60 * MiB)  # 72 + 60 > 100: release 40 then 32 (both oversize), no full flush
    assert [s.size for s in a.segments()] == [60 * MiB]
    assert a.stats().num_alloc_retries == 0


def test_reset_peak_stats_and_the_stats_table():
    a = CachingAllocator()
    a.free(a.malloc(30 * MiB))
    a.empty_cache()
    a.reset_peak_stats()
    s = a.stats()
    assert (s.peak_reserved, s.num_device_allocs, s.num_device_frees) == (0, 1, 1)
    assert "peak reserved" in str(s)
    assert s.to_dict()["num_device_allocs"] == 1


@pytest.mark.parametrize(
    ("events", "error", "match"),
    [
        ([("a", 10), ("a", 20)], ValueError, "still allocated"),
        ([("a",)], ValueError, "not allocated"),
        ([("a", 1, 2)], ValueError, "expected"),
        (["ab"], ValueError, "expected"),
        ([("a", 1.5)], TypeError, r"events\[0\] nbytes must be a whole number"),
    ],
)
def test_replay_rejects_malformed_traces(events, error, match):
    with pytest.raises(error, match=match):
        replay(events)


def test_replay_accepts_none_as_a_free_and_reuses_freed_keys():
    stats = replay([("a", 100), ("a", None), ("a", 3 * MiB), ("a",)])
    assert (stats.allocated, stats.peak_allocated, stats.reserved) == (0, 3 * MiB, 22 * MiB)


# --- context, workspace, to_device ----------------------------------------------------


def test_cuda_context_defaults_and_overrides(monkeypatch):
    monkeypatch.delenv(al.CONTEXT_ENV_VAR, raising=False)
    assert cuda_context_bytes() == al.DEFAULT_CUDA_CONTEXT_BYTES
    assert cuda_context_bytes(lazy_loading=False) > cuda_context_bytes()
    card = GPU.custom("lab", memory="24GiB", compute_capability=(8, 6), sm_count=84)
    monkeypatch.setenv(al.CONTEXT_ENV_VAR, "512MiB")
    assert cuda_context_bytes(card) == 512 * MiB
    monkeypatch.setenv(al.CONTEXT_ENV_VAR, "lots")
    with pytest.raises(ValueError, match="TORCHFIT_CUDA_CONTEXT_BYTES"):
        cuda_context_bytes()


@pytest.mark.parametrize(
    ("capability", "expected"),
    [
        ((7, 5), 8_519_680),
        ((8, 0), 8_519_680),
        ("8.6", 8_519_680),
        ("sm_89", 8_519_680),
        ((9, 0), 32 * MiB),
        ("sm90", 32 * MiB),
        (9.0, 32 * MiB),
        (100, 32 * MiB),
        ("12.0", 32 * MiB),
        (None, 32 * MiB),  # unknown GPU: the larger default
    ],
)
def test_cublas_workspace_defaults(monkeypatch, capability, expected):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    assert cublas_workspace_bytes(capability) == expected


@pytest.mark.parametrize(
    ("config", "expected"),
    [(":4096:8", 32 * MiB), (":4096:2:16:8", 8_519_680), (":16:8", 128 * KiB)],
)
def test_cublas_workspace_config_is_honoured(monkeypatch, config, expected):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", config)
    assert cublas_workspace_bytes((8, 6)) == expected


def test_unreadable_cublas_workspace_config_warns_and_keeps_the_default(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "4096x8")
    with pytest.warns(UserWarning, match="no ':SIZE:COUNT' pair"):
        assert cublas_workspace_bytes((8, 6)) == 8_519_680


def test_unreadable_compute_capability_fails():
    with pytest.raises(ValueError, match="compute capability"):
        cublas_workspace_bytes("ampere")


def test_to_device_refuses_a_cpu_estimate():
    with pytest.raises(ValueError, match="device='cuda'"):
        to_device(MemoryEstimate(weights=10, device="cpu"))


def test_to_device_without_events_approximates(monkeypatch):
    monkeypatch.delenv(al.CONTEXT_ENV_VAR, raising=False)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    gpu = GPU.custom("lab", memory="24GiB", compute_capability=(8, 6))
    e = MemoryEstimate(weights=100 * MiB, activations=300 * MiB, workspace=MiB)
    out = to_device(e, gpu=gpu)
    assert out.workspace == MiB + 8_519_680
    assert out.reserved == approximate_reserved(e.total + 8_519_680)
    assert out.context == al.DEFAULT_CUDA_CONTEXT_BYTES  # no SM count: an unknown card's
    assert out.device_total == out.reserved + out.context
    assert e.reserved is None  # the input is untouched
    assert any("approximated" in note for note in out.notes)


@pytest.mark.parametrize(("name", "expected"), [("RTX 3060", 8_519_680), ("H100", 32 * MiB)])
def test_to_device_reads_the_compute_capability_from_the_catalog(monkeypatch, name, expected):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    out = to_device(MemoryEstimate(weights=MiB), gpu=name, context_bytes=0)
    assert out.workspace == expected


def test_to_device_with_events_replays_them(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    events = [("w", 30 * MiB), ("a", 3 * MiB), ("b", 700 * KiB), ("a",), ("c", 12 * MiB)]
    e = MemoryEstimate(weights=30 * MiB, activations=12 * MiB + 700 * KiB)  # the events' peak
    plain = to_device(e, events=events, workspace=False, context_bytes=0)
    assert plain.reserved == replay(events).peak_reserved == 52 * MiB
    assert not any("events cover" in note for note in plain.notes)
    assert (plain.workspace, plain.context) == (0, 0)
    gpu = GPU.custom("lab", memory="80GiB", compute_capability=(8, 0))
    with_ws = to_device(e, gpu=gpu, events=events, context_bytes="1GB")
    assert with_ws.reserved == replay([("ws", 8_519_680), *events]).peak_reserved
    assert with_ws.context == 10**9


def test_to_device_approximates_what_the_events_miss(monkeypatch):
    events = [("a", 4 * MiB)]
    e = MemoryEstimate(weights=100 * MiB)
    out = to_device(e, events=events, workspace=False, context_bytes=0)
    assert out.reserved == 20 * MiB + approximate_reserved(100 * MiB - 4 * MiB)
    assert any("events cover" in note for note in out.notes)


@given(st.integers(0, 2**40), st.floats(0, 1))
@settings(max_examples=100, deadline=None)
def test_approximate_reserved_holds_the_allocated_bytes_in_2_mib_multiples(n, fragmentation):
    r = approximate_reserved(n, fragmentation=fragmentation)
    assert r % (2 * MiB) == 0
    assert r >= n * (1 + fragmentation) or n == 0


def test_approximate_reserved_rejects_a_negative_fragmentation():
    with pytest.raises(ValueError, match="fragmentation"):
        approximate_reserved(10, fragmentation=-0.1)


def test_a_training_step_holds_a_cublas_workspace_per_thread(monkeypatch):
    # autograd runs the backward's matmuls on its own thread, with its own cuBLAS handle
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    card = GPU.custom("lab", memory="80GiB", compute_capability=(8, 0))
    forward = MemoryEstimate(weights=64 * MiB, activations=16 * MiB)
    training = forward.replace(gradients=64 * MiB)
    assert to_device(forward, gpu=card, context_bytes=0).workspace == 8_519_680
    assert to_device(training, gpu=card, context_bytes=0).workspace == 2 * 8_519_680
    told = to_device(forward, gpu=card, context_bytes=0, training=True)
    assert told.workspace == 2 * 8_519_680
    assert any("x 2 (forward and backward threads)" in note for note in told.notes)


def test_replayed_workspaces_are_allocated_before_the_step():
    card = GPU.custom("lab", memory="80GiB", compute_capability=(9, 0))  # 32 MiB each
    step = [("a", 100 * MiB), ("a",)]
    e = MemoryEstimate(activations=100 * MiB)
    one = to_device(e, gpu=card, events=step, context_bytes=0, training=False)
    two = to_device(e, gpu=card, events=step, context_bytes=0, training=True)
    assert two.reserved - one.reserved == 32 * MiB
    assert two.total - one.total == 32 * MiB


def _h200_record(case):
    runs = Path(__file__).parents[3] / "benchmarks" / "gpu_runs" / "h200-a.jsonl"
    return next(r for r in map(json.loads, runs.read_text().splitlines()) if r["case"] == case)


@pytest.mark.parametrize(
    ("case", "itemsize", "trained_before"),
    [("T01_gpt2_fp32_b8_s1024", 4, False), ("T03_llama1b_bf16true_b4_s2048", 2, True)],
)
def test_the_h200_held_a_cublas_workspace_per_thread_that_had_run_matmuls(
    monkeypatch, case, itemsize, trained_before
):
    # Allocated bytes beyond the weights and token ids before each case's first step, in
    # one process on an H200: before the first training step of the process only the
    # forward thread had run a matmul (32.8 MiB); after one, autograd's thread had too.
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    record = _h200_record(case)
    extra = record["before_step1"]["alloc"] - record["params"] * itemsize
    extra -= record["batch"] * record["seq"] * 8  # the token ids (labels are the same tensor)
    workspaces = matmul_threads(training=trained_before) * cublas_workspace_bytes((9, 0))
    assert 0 <= extra - workspaces <= 2 * MiB, extra


@pytest.mark.parametrize("bad", ["yes", 1, None, float("nan")])
def test_matmul_threads_refuses_a_training_flag_that_is_not_a_bool(bad):
    with pytest.raises(TypeError, match="training must be True or False"):
        matmul_threads(training=bad)
