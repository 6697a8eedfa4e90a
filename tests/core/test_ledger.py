"""The storage ledger: identity, rounding, registration, frees, resizes, peaks, events."""

from __future__ import annotations

import gc

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensorMode

from torchfit._core.ledger import (
    CUDA_BLOCK,
    Event,
    Ledger,
    cuda_block_bytes,
    round_up,
    storage_key,
    storage_of,
    view_key,
)

# -- rounding ------------------------------------------------------------------------------


@given(nbytes=st.integers(0, 10**9), block=st.integers(1, 4096))
def test_round_up_is_the_smallest_multiple_not_below(nbytes, block):
    rounded = round_up(nbytes, block)
    assert rounded % block == 0
    assert nbytes <= rounded < nbytes + block


def test_cuda_block_is_kminblocksize_and_the_allocator_rounds_with_it():
    from torchfit._bnb.layout import CUDA_BLOCK as LAYOUT_BLOCK
    from torchfit.memory.allocator import K_MIN_BLOCK_SIZE, round_request
    from torchfit.memory.kernels.cuda import CUDA_BLOCK as KERNELS_BLOCK

    assert CUDA_BLOCK == K_MIN_BLOCK_SIZE == LAYOUT_BLOCK == KERNELS_BLOCK == 512
    assert [cuda_block_bytes(n) for n in (0, 1, 512, 513, 4000)] == [0, 512, 512, 1024, 4096]
    assert all(cuda_block_bytes(n) == round_request(n) for n in range(0, 5000, 7))


def test_round_up_refuses_a_block_below_one_byte():
    with pytest.raises(ValueError, match="block must be a positive number of bytes; got 0"):
        round_up(10, 0)
    with pytest.raises(ValueError, match="got -512"):
        Ledger(block=-512)


# -- identity ------------------------------------------------------------------------------


def test_storage_key_is_shared_by_views_and_survives_growth_in_place():
    w = torch.zeros(4, 4)
    keys = {storage_key(t) for t in (w, w.t(), w[1:], w.detach(), w.view(-1), w.data)}
    assert len(keys) == 1
    assert storage_key(w.clone()) not in keys
    w.resize_(1000)  # the storage grows in place (its data may move): the same storage
    assert w.untyped_storage().nbytes() == 4000
    assert storage_key(w) in keys


def test_storage_key_works_on_meta_and_fake_tensors_where_data_ptr_cannot():
    meta = torch.empty(8, device="meta")
    other = torch.empty(8, device="meta")
    assert meta.untyped_storage().data_ptr() == other.untyped_storage().data_ptr() == 0
    assert storage_key(meta) == storage_key(meta[2:]) != storage_key(other)
    with FakeTensorMode():
        fake = torch.empty(8)
        view = fake.view(2, 4)
        copy = fake.clone()
    assert storage_key(fake) == storage_key(view) != storage_key(copy)


def test_a_tensor_without_a_storage_has_no_key():
    sparse = torch.eye(3).to_sparse()
    assert storage_of(sparse) is None
    assert storage_key(sparse) is None
    assert view_key(sparse) is None


def test_storage_key_of_a_storage_is_that_of_its_tensors():
    w = torch.ones(3)
    assert storage_key(w.untyped_storage()) == storage_key(w)


def test_view_key_tells_views_of_one_storage_apart():
    fused = torch.zeros(12, 4)
    q, k = fused[:4], fused[4:8]
    assert storage_key(q) == storage_key(k)
    assert view_key(q) != view_key(k)
    assert view_key(q) == view_key(fused[:4]) == view_key(q.detach())
    assert view_key(fused) != view_key(fused.t())  # same offset and storage, other strides


# -- the ledger ----------------------------------------------------------------------------


def test_a_storage_counts_once_with_its_rounding():
    ledger = Ledger(block=CUDA_BLOCK)
    a = torch.empty(100)  # 400 bytes -> 512
    entry, fresh = ledger.add(a.untyped_storage())
    assert fresh
    assert (entry.raw, entry.nbytes, entry.id) == (400, 512, 0)
    again, fresh_again = ledger.add(a[50:].untyped_storage())
    assert again is entry
    assert not fresh_again
    assert ledger.live == 512
    assert len(ledger) == 1
    assert ledger.get(a.untyped_storage()) is entry
    assert ledger.get(torch.empty(1).untyped_storage()) is None


def test_a_free_is_queued_then_applied_before_the_next_lookup():
    ledger = Ledger()
    ledger.recording = True
    a = torch.empty(10)
    ledger.add(a.untyped_storage())
    gc.collect()
    del a
    assert len(ledger._pending) == 1  # seen by the weak reference, not yet applied
    assert ledger._live == 40
    assert ledger.live == 0  # reading applies it
    assert ledger.events == [Event("alloc", 0, 40), Event("free", 0, 40)]


def test_a_freed_storages_key_reused_by_a_new_storage_counts_the_new_one():
    ledger = Ledger()
    ledger.recording = True
    seen, reused = set(), 0
    for n in range(1, 40):
        t = torch.empty(8)
        key = storage_key(t)
        reused += key in seen
        seen.add(key)
        entry, fresh = ledger.add(t.untyped_storage())
        assert fresh
        assert entry.id == n - 1
        assert ledger.live == 32
        del t
    assert reused  # the allocator did hand a freed address out again
    assert ledger.live == 0
    assert [e.kind for e in ledger.events] == ["alloc", "free"] * 39


def test_growth_in_place_is_a_free_and_a_new_allocation():
    ledger = Ledger(block=CUDA_BLOCK)
    ledger.recording = True
    a = torch.empty(100)
    first, _ = ledger.add(a.untyped_storage())
    a.resize_(1000)
    grown, fresh = ledger.add(a.untyped_storage())
    assert fresh
    assert grown.previous == first.id
    assert grown.id != first.id
    assert ledger.live == 4096
    assert ledger.events == [Event("alloc", 0, 512), Event("free", 0, 512), Event("alloc", 1, 4096)]
    del a
    assert ledger.live == 0
    assert ledger.events[-1] == Event("free", 1, 4096)


def test_an_empty_storage_is_watched_but_counts_nothing_until_it_grows():
    ledger = Ledger()
    ledger.recording = True
    e = torch.empty(0)
    entry, _ = ledger.add(e.untyped_storage())
    assert (entry.nbytes, entry.id, ledger.live, ledger.events) == (0, -1, 0, [])
    e.resize_(5)
    grown, fresh = ledger.add(e.untyped_storage())
    assert fresh
    assert (grown.nbytes, grown.id) == (20, 0)
    assert ledger.events == [Event("alloc", 0, 20)]  # no free of the empty one


def test_transient_bytes_reach_the_peak_and_leave_at_once():
    ledger = Ledger(block=CUDA_BLOCK)
    ledger.recording = True
    keep = torch.empty(1000)
    ledger.add(keep.untyped_storage())
    entry = ledger.transient(100)
    assert (ledger.live, ledger.peak) == (4096, 4096 + 512)
    assert ledger.peak_index == 1
    assert ledger.events[1:] == [Event("alloc", entry.id, 512), Event("free", entry.id, 512)]


def test_peak_follows_the_highest_live_and_reset_peak_restarts_it():
    ledger = Ledger()
    a, b = torch.empty(10), torch.empty(20)
    ledger.add(a.untyped_storage())
    ledger.add(b.untyped_storage())
    del b
    assert (ledger.live, ledger.peak, ledger.peak_index) == (40, 120, -1)  # -1: not recording
    ledger.reset_peak()
    assert ledger.peak == 40
    del a


def test_restart_keeps_the_baseline_forgets_the_rest_and_records_afresh():
    ledger = Ledger()
    keep, drop = torch.empty(10), torch.empty(25)
    kept, _ = ledger.add(keep.untyped_storage())
    ledger.add(drop.untyped_storage())
    assert ledger.restart([kept]) == 100
    assert ledger.recording
    assert (ledger.live, ledger.peak, ledger.peak_index) == (40, 40, 0)
    assert ledger.events == [Event("alloc", kept.id, 40)]
    del drop  # forgotten: its free is not recorded
    assert ledger.live == 40
    assert ledger.events == [Event("alloc", kept.id, 40)]
    ledger.clear()
    assert (ledger.live, len(ledger)) == (0, 0)
    del keep


def test_restart_while_recording_closes_the_events_so_far_with_frees_of_the_dropped():
    ledger = Ledger()
    ledger.recording = True
    keep, drop = torch.empty(10), torch.empty(25)
    kept, _ = ledger.add(keep.untyped_storage())
    dropped, _ = ledger.add(drop.untyped_storage())
    before = ledger.events
    assert ledger.restart([kept]) == 100
    assert before == [
        Event("alloc", kept.id, 40),
        Event("alloc", dropped.id, 100),
        Event("free", dropped.id, 100),
    ]
    assert ledger.events == [Event("alloc", kept.id, 40)]  # a new list, the same id
    del keep, drop


def test_fake_and_meta_storages_are_counted_and_freed_like_real_ones():
    ledger = Ledger()
    with FakeTensorMode():
        fake = torch.empty(16)
        ledger.add(fake.untyped_storage())
    meta = torch.empty(4, device="meta")
    ledger.add(meta.untyped_storage())
    assert ledger.live == 64 + 16
    del fake, meta
    assert ledger.live == 0


def test_event_is_a_small_tuple():
    event = Event("free", 3, 512)
    assert event == ("free", 3, 512)
    assert (event.kind, event.id, event.nbytes) == ("free", 3, 512)
    assert list(event) == ["free", 3, 512]
