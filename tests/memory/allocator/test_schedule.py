"""The synthetic step schedule: its order on a tiny outline, its reserved bytes on real steps.

The real steps are the H200 runs committed in ``benchmarks/gpu_runs/`` (torch
2.11.0+cu130, driver 580.159.04): ``step2.peak_reserved`` (``max_memory_reserved`` of
the step measured after a warm-up step) or ``after.peak_reserved`` for a forward.
"""

import json
from pathlib import Path

import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st

from torchfit.memory import estimate
from torchfit.memory.allocator import replay, smallest_capacity, step_schedule, to_device
from torchfit.memory.outline import StepOutline

MiB = 2**20
RUNS = Path(__file__).parents[3] / "benchmarks" / "gpu_runs"
LLAMA_1B = {
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "head_dim": 64,
    "tie_word_embeddings": True,
}
LLAMA_3B = {**LLAMA_1B, "hidden_size": 3072, "num_hidden_layers": 28}
LLAMA_3B |= {"num_attention_heads": 24, "head_dim": 128}

TINY = StepOutline(
    training=True,
    parameters=(4 * MiB, 2 * MiB),
    inputs=(1024,),
    num_layers=2,
    residual=MiB,
    block_saved=(3 * MiB, 5 * MiB),
    block_transient=((2 * MiB, 1), (3 * MiB, 0)),
    checkpointing=True,
    logits=8 * MiB,
    loss=(16 * MiB, 16 * MiB),
    loss_grads=(16 * MiB, 16 * MiB),
    block_grads=(6 * MiB,),
    layer_gradients=(MiB,),
    head_gradients=(4 * MiB,),
    states=(4 * MiB, 4 * MiB),
    step_temporaries=(4 * MiB, MiB),
)


def _keys(ops):
    return [(op[0], len(op) == 2) for op in ops]  # (key, is an allocation)


def test_the_warm_up_creates_the_state_after_backward_and_the_step_starts_with_it():
    s = step_schedule(TINY)
    warm = _keys(s.warmup)
    last_grad = max(i for i, (k, a) in enumerate(warm) if k[0] == "grad" and a)
    first_state = warm.index((("state", 0), True))
    assert first_state > last_grad
    assert warm[:first_state].count((("state", 0), True)) == 0
    start = [k for k, _ in _keys(s.events)[:5]]
    assert start == [("weight", 0), ("weight", 1), ("input", 0), ("state", 0), ("state", 1)]
    assert (("state", 0), True) not in _keys(s.events)[5:]


def test_checkpointing_keeps_block_inputs_and_recomputes_one_block_at_a_time():
    ops = _keys(step_schedule(TINY).events)
    # forward: no saved tensor, every block input kept until its block's backward
    loss = ops.index((("loss", 0), True))
    assert not any(k[0] == "saved" for k, _ in ops[:loss])
    assert not any(k == ("h", 0) and not a for k, a in ops[:loss])
    # backward: the top block is recomputed after the loss's gradients are gone,
    # and its saved tensors are freed before the block below is recomputed
    recompute_top = ops.index((("saved", 1, 0), True))
    assert ops.index((("dloss", 0), False)) < recompute_top
    assert ops.index((("saved", 1, 0), False)) < ops.index((("saved", 0, 0), True))
    assert ops.index((("h", 0), False)) > ops.index((("saved", 1, 0), False))


def test_every_allocation_is_freed_once_and_the_step_replays():
    s = step_schedule(TINY)
    stats = replay(s.events, warmup=s.warmup)
    held = sum(TINY.parameters) + sum(TINY.inputs) + sum(TINY.states)
    assert stats.allocated == held  # the step ends where it started
    assert stats.peak_reserved >= stats.peak_allocated > held


def test_an_inference_forward_keeps_each_layers_cache_and_ends_with_the_logits():
    o = StepOutline(
        training=False,
        parameters=(4 * MiB,),
        num_layers=3,
        residual=MiB,
        block_transient=((2 * MiB, 1), (2 * MiB, 0)),
        logits=8 * MiB,
        kv_cache=(MiB, MiB),
    )
    s = step_schedule(o)
    assert s.warmup == ((("weight", 0), 4 * MiB),)
    ops = _keys(s.events)
    assert ops[-1] == (("logits",), True)
    kv = [k for k, a in ops if k[0] == "kv"]
    assert kv == [("kv", layer, j) for layer in range(3) for j in range(2)]
    assert not any(k[0] == "kv" and not a for k, a in ops)


def test_the_oom_line_is_below_the_peak_when_cached_blocks_can_be_released():
    steps = [("a", 30 * MiB), ("a",), ("b", 40 * MiB)]
    assert replay(steps).peak_reserved == 70 * MiB
    assert smallest_capacity(steps) == 40 * MiB


def _fits(events, pages):
    try:
        replay(events, capacity=pages * 2 * MiB)
    except torch.OutOfMemoryError:
        return False
    return True


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(9, 26), st.integers(1, 7)), min_size=1, max_size=60
    )
)
def test_the_oom_line_is_where_every_larger_capacity_fits(ops):
    # drawn allocations (512 B to 64 MiB) and frees of a drawn live one: the walk down
    # from the peak (each fitting run vouches for every capacity down to its own peak)
    # finds what trying every capacity from the peak down finds
    events, live = [], []
    for index, (pick, power, eighths) in enumerate(ops):
        if pick == 0 and live:
            events.append((live.pop(index % len(live)),))
        else:
            events.append((index, (2**power * eighths) // 8 or 1))
            live.append(index)
    stats = replay(events)
    pages = -(-stats.peak_reserved // (2 * MiB))
    while pages > 1 and _fits(events, pages - 1):
        pages -= 1
    assert smallest_capacity(events) == smallest_capacity(events, lower=stats.peak_allocated)
    assert smallest_capacity(events, lower=stats.peak_allocated) == pages * 2 * MiB


def test_a_step_can_fit_below_a_capacity_where_it_runs_out():
    # a drawn trace: 18-26 MiB fit (running out early empties the cache of the freed
    # 11.5, 6.5 and 15 MiB blocks' segments), 28 MiB does not (the cache stays and the
    # last 5.5 MiB finds no room), 30 MiB does: the line is the top band's 30 MiB
    sizes = [11.5, None, 6.5, None, 15, None, 4.5, 2.5, 0.5, 5.5]
    steps = [(i - 1,) if mib is None else (i, int(mib * MiB)) for i, mib in enumerate(sizes)]
    assert [pages * 2 for pages in range(1, 16) if _fits(steps, pages)] == [18, 20, 22, 24, 26, 30]
    assert smallest_capacity(steps) == 30 * MiB


@pytest.mark.parametrize(
    ("fields", "error", "name"),
    [
        ({"logits": -1}, ValueError, "logits"),
        ({"head_copy": -1}, ValueError, "head_copy"),
        ({"head_copy": 1.5}, TypeError, "head_copy"),
        ({"tied_gradient": -5}, ValueError, "tied_gradient"),
        ({"tied_in_place": 1}, TypeError, "tied_in_place"),
        ({"tied_in_place": "yes"}, TypeError, "tied_in_place"),
        ({"block_copies": (MiB, -2)}, ValueError, "block_copies"),
        ({"block_copies": (float("nan"),)}, TypeError, "block_copies"),
    ],
)
def test_a_bad_outline_says_which_field(fields, error, name):
    with pytest.raises(error, match=rf"StepOutline\.{name}"):
        StepOutline(training=True, parameters=(), **fields)


def _record(run, case):
    for line in (RUNS / f"h200-{run}.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("case") == case:
            return record
    raise KeyError(case)


# case, run, the error allowed on its measured reserved peak, config, estimate's words
SHARED = [
    (
        "T04_llama1b_bf16true_gc_b8_s2048",
        "a",
        0.02,
        LLAMA_1B,
        {
            "batch_size": 8,
            "seq_len": 2048,
            "precision": "bf16-true",
            "gradient_checkpointing": True,
        },
    ),
    (
        "T1_llama3b_bf16true_gc_b4_s4096",
        "b",
        0.02,
        LLAMA_3B,
        {
            "batch_size": 4,
            "seq_len": 4096,
            "precision": "bf16-true",
            "gradient_checkpointing": True,
        },
    ),
    (
        "T03_llama1b_bf16true_b4_s2048",
        "a",
        0.03,
        LLAMA_1B,
        {"batch_size": 4, "seq_len": 2048, "precision": "bf16-true"},
    ),
    (
        "I01_llama1b_forward_bf16_b8_s4096",
        "a",
        0.05,
        LLAMA_1B,
        {"batch_size": 8, "seq_len": 4096, "mode": "inference", "dtype": "bf16"},
    ),
]


@pytest.mark.parametrize(
    ("case", "run", "error", "config", "words"), SHARED, ids=[c[0] for c in SHARED]
)
def test_the_replayed_schedule_lands_near_the_measured_reserved_peak(
    case, run, error, config, words
):
    record = _record(run, case)
    measured = (record.get("step2") or record["after"])["peak_reserved"]
    found = estimate(transformers.LlamaConfig(**config), device="cuda", **words)
    assert found.outline is not None
    on_card = to_device(found, gpu="H200", context_bytes=0)
    assert abs(on_card.reserved / measured - 1) < error, (case, on_card.reserved, measured)
    assert on_card.total == found.total + on_card.workspace - found.workspace
    assert on_card.oom_line is not None
    assert on_card.total <= on_card.oom_line <= on_card.reserved


def _llama_1b_on_cuda(layers=None, **words):
    """A CUDA estimate of Llama-3.2-1B's shape (``layers`` of them when given)."""
    config = LLAMA_1B if layers is None else {**LLAMA_1B, "num_hidden_layers": layers}
    return estimate(transformers.LlamaConfig(**config), device="cuda", **words)


def test_an_estimate_changed_after_the_closed_form_falls_back_to_the_approximation():
    found = _llama_1b_on_cuda(2, batch_size=2, seq_len=256)
    replayed = to_device(found, gpu="H200", context_bytes=0)
    assert replayed.oom_line is not None
    assert any("synthetic schedule" in note for note in replayed.notes)
    halved = to_device(found.replace(weights=found.weights // 2), gpu="H200", context_bytes=0)
    assert halved.oom_line is None
    assert any("approximated from the allocated peak" in note for note in halved.notes)


def test_the_oom_line_separates_the_batches_a_capped_h200_ran_from_those_it_refused():
    # F2: Llama-3.2-1B bf16, checkpointing, s2048, the allocator capped at 20 GiB with
    # set_per_process_memory_fraction: batch 3 ran, batch 4 ran out of memory
    record = _record("b", "F2_llama1b_bf16true_gc_s2048_cap20")
    cap, largest = record["cap_bytes"], record["largest_batch"]

    def line(batch):
        found = _llama_1b_on_cuda(
            batch_size=batch,
            seq_len=record["seq"],
            precision="bf16-true",
            gradient_checkpointing=True,
        )
        return to_device(found, gpu="H200", context_bytes=0).oom_line

    assert line(largest) <= cap < line(largest + 1)


def test_without_the_search_the_device_need_is_the_device_total_and_never_below():
    found = _llama_1b_on_cuda(
        2, batch_size=2, seq_len=512, precision="bf16-true", gradient_checkpointing=True
    )
    searched = to_device(found, gpu="H200", context_bytes=0)
    quick = to_device(found, gpu="H200", context_bytes=0, oom_line=False)
    assert quick.oom_line is None and searched.oom_line is not None
    assert quick.reserved == searched.reserved
    assert quick.device_needed == quick.device_total >= searched.device_needed
    assert searched.device_needed < searched.device_total  # the search found cached blocks
