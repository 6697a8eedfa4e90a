"""The warm-up step is recorded too, and the CUDA target replays it before the step.

A real run measures a step after a warm-up step: the step starts in the segments (and
holes) the warm-up left. The trace records the warm-up from the weights and inputs
(``Trace.warmup_events``) and ``trace(..., device="cuda")`` replays it before the step.
"""

import pytest
import torch
from torch import nn

from torchfit._core.ledger import Event, cuda_block_bytes
from torchfit.memory.allocator import cublas_workspace_bytes, replay
from torchfit.memory.tracing import trace, trace_events, trace_step


def live_after(events):
    """Ids allocated and not freed after ``events``."""
    live = set()
    for event in events:
        if event.kind == "alloc":
            live.add(event.id)
        else:
            live.remove(event.id)
    return live


def mlp():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    return model, torch.randn(32, 64)


def small_gpt2():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_layer=2, n_embd=256, n_head=4, vocab_size=4096, n_positions=256,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(config)
        ids = torch.zeros(8, 256, dtype=torch.long)
    return model, {"input_ids": ids, "labels": ids}


def test_the_warm_up_is_recorded_from_the_weights_and_inputs():
    model, x = mlp()
    traced = trace_events(model, x, optimizer="adamw", device="cuda")
    tensors = [*model.parameters(), x]
    first = traced.warmup_events[: len(tensors)]
    assert [event.kind for event in first] == ["alloc"] * len(tensors)
    assert sorted(event.nbytes for event in first) == sorted(
        cuda_block_bytes(t.untyped_storage().nbytes()) for t in tensors
    )
    assert traced.warmup_events[len(tensors)].kind == "alloc"  # then the forward
    # The optimizer state is made in the warm-up, after its start.
    state = {s.id for s in traced.storages if s.category == "optimizer"}
    assert state
    assert state.isdisjoint(event.id for event in first)


def test_the_warm_up_ends_with_what_the_step_starts_with_under_the_same_ids():
    model, x = mlp()
    traced = trace_events(model, x, optimizer="adamw", device="cuda")
    start = {s.id for s in traced.storages if s.phase == "start"}
    assert live_after(traced.warmup_events) == start
    assert {event.id for event in traced.events[: len(start)]} == start
    assert replay(traced.events, warmup=traced.warmup_events).allocated == sum(
        s.nbytes for s in traced.storages if s.phase == "start"
    )


def test_what_the_warm_up_leaves_and_the_step_drops_is_freed_at_its_end():
    kept = []

    def step(model, x):
        out = model(x)
        kept.append(out.detach())  # held past the step: not what the step starts with
        out.sum().backward()

    traced = trace_step(step, nn.Linear(64, 64), torch.randn(32, 64), device="cuda")
    assert traced.warmup_events[-1] == Event("free", traced.warmup_events[-1].id, 32 * 64 * 4)
    assert live_after(traced.warmup_events) == {s.id for s in traced.storages if s.phase == "start"}
    assert any("left over from the warm-up" in note for note in traced.estimate.notes)


def test_every_warm_up_step_is_recorded():
    def step(model, opt, x):
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()

    model, x = mlp()
    opt = torch.optim.AdamW(model.parameters())
    allocs = {}
    for warmup in (0, 1, 2, 3):
        traced = trace_step(step, model, opt, x, device="cuda", warmup=warmup)
        allocs[warmup] = sum(event.kind == "alloc" for event in traced.warmup_events)
    starts_with = sum(1 for s in traced.storages if s.phase == "start")
    steady = sum(event.kind == "alloc" for event in traced.events) - starts_with
    # the first warm-up step also makes the optimizer state; the later ones are steady
    assert allocs[0] == 0
    assert allocs[1] > steady
    assert allocs[2] - allocs[1] == allocs[3] - allocs[2] == steady


def test_inference_has_no_warm_up():
    model, x = mlp()
    traced = trace_events(model, x, mode="inference", device="cuda")
    assert traced.warmup_events == ()
    assert traced.to_dict()["warmup_events"] == []


def test_to_dict_keeps_the_warm_up_events():
    model, x = mlp()
    traced = trace_events(model, x, optimizer="sgd", device="cuda")
    assert traced.to_dict()["warmup_events"] == [list(e) for e in traced.warmup_events]


def test_cuda_reserved_is_the_step_after_the_warm_up():
    model, inputs = small_gpt2()
    traced = trace_events(model, inputs, device="cuda")
    estimate = trace(model, inputs, device="cuda")
    # an unknown card: 32 MiB per thread, the forward's and autograd's backward thread's
    workspaces = [
        ("cuBLAS", cublas_workspace_bytes(None)),
        ("cuBLAS 2", cublas_workspace_bytes(None)),
    ]
    after_warm_up = replay(traced.events, warmup=[*workspaces, *traced.warmup_events])
    assert estimate.reserved == after_warm_up.peak_reserved
    # From an empty allocator (the replay before the warm-up was recorded) it is lower:
    # the warm-up's segments hold the step's optimizer state where activations were.
    assert estimate.reserved > replay([*workspaces, *traced.events]).peak_reserved
    assert any("of the warm-up step's" in note for note in estimate.notes)
