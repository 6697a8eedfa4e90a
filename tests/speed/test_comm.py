"""Data-parallel step time: NCCL's bus bandwidth, what each strategy sends, what hides it."""

import dataclasses

import pytest

from torchfit import fits
from torchfit.memory import gpu
from torchfit.speed.comm import (
    LINKS,
    CommPlan,
    collective_seconds,
    comm_for,
    data_parallel_time,
    link_of,
)
from torchfit.speed.result import KindTime, StepTime

transformers = pytest.importorskip("transformers")
TINY = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=128)


@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_collectives_move_what_nccl_tests_bus_bandwidth_counts(ranks):
    link = LINKS["nvlink4"]
    share = (ranks - 1) / ranks
    reduce = collective_seconds("all_reduce", 1e9, ranks, link)
    assert reduce == pytest.approx(2 * share * 1e9 / 480e9)
    gather = collective_seconds("all_gather", 1e9, ranks, link)
    assert gather == pytest.approx(share * 1e9 / 370e9)
    assert collective_seconds("reduce_scatter", 1e9, ranks, link) == gather
    assert collective_seconds("all_reduce", 1e9, 1, link) == 0.0
    with pytest.raises(ValueError, match="'all_reduce', 'all_gather' or 'reduce_scatter'"):
        collective_seconds("broadcast", 1e9, ranks, link)


@pytest.mark.parametrize(
    ("card", "link"),
    [
        ("H100", "nvlink4"),
        ("H200", "nvlink4"),
        ("A100 40GB", "nvlink3"),
        ("A100 80GB", "nvlink3"),
        ("A100 80GB PCIe", "pcie4"),
        ("H100 PCIe", "pcie5"),
        ("RTX 4090", "pcie4"),
        ("T4", "pcie3"),
    ],
)
def test_a_cards_link_is_its_machines(card, link):
    assert link_of(gpu(card)) is LINKS[link]


def test_each_strategy_sends_what_it_must_and_hides_what_it_can():
    link, kw = LINKS["pcie4"], {"grad_bytes": 4e9, "param_bytes": 2e9}
    ddp = comm_for("ddp", ranks=4, link=link, **kw)
    assert ddp.backward == collective_seconds("all_reduce", 4e9, 4, link)
    assert ddp.forward == 0.0 and not ddp.per_micro_batch
    assert ddp.exposed == collective_seconds("all_reduce", 25 * 2**20, 4, link)  # last bucket
    zero = comm_for("zero2", ranks=4, link=link, **kw)
    assert zero.exposed == collective_seconds("all_gather", 2e9, 4, link)  # after the step
    assert zero.sharded_optimizer and not ddp.sharded_optimizer
    fsdp = comm_for("fsdp", ranks=4, link=link, **kw)
    gather = collective_seconds("all_gather", 2e9, 4, link)
    assert (fsdp.forward, fsdp.per_micro_batch) == (gather, True)
    assert fsdp.backward == gather + collective_seconds("reduce_scatter", 4e9, 4, link)
    with pytest.raises(ValueError, match="HSDP spans nodes"):
        comm_for("hsdp", ranks=4, link=link, **kw)


def test_fsdp_gathers_the_root_unit_once():
    link, kw = LINKS["pcie4"], {"grad_bytes": 4e9, "param_bytes": 2e9}
    kept = comm_for("fsdp", ranks=4, link=link, resident_bytes=5e8, **kw)
    assert kept.forward == collective_seconds("all_gather", 2e9, 4, link)
    again = collective_seconds("all_gather", 1.5e9, 4, link)
    assert kept.backward == again + collective_seconds("reduce_scatter", 4e9, 4, link)
    assert kept.bytes == 2e9 + 1.5e9 + 4e9
    with pytest.raises(ValueError, match=r"resident_bytes=3e\+09 is more than param_bytes"):
        comm_for("fsdp", ranks=4, link=link, resident_bytes=3e9, **kw)


def _timed(forward, backward):
    rows = (KindTime("matmul", "forward", forward, 1e12, 1e9, 10),
            KindTime("matmul", "backward", backward, 2e12, 2e9, 20))  # fmt: skip
    return StepTime("m", "card", forward + backward, 8, 8192, 3e12, 1e15, rows, ("note",))


def test_a_phase_takes_the_longer_of_its_compute_and_what_overlaps_it():
    timed = _timed(forward=0.1, backward=0.2)
    hidden = CommPlan(0.05, 0.15, 0.0, 1e9, per_micro_batch=True, what="x")
    job = data_parallel_time(timed, hidden, ranks=4, accumulation=1, link=LINKS["pcie4"])
    assert job.seconds == timed.seconds and job.mfu == pytest.approx(timed.mfu)
    slow = CommPlan(0.3, 0.5, 0.01, 1e9, per_micro_batch=True, what="x")
    job = data_parallel_time(timed, slow, ranks=4, accumulation=2, link=LINKS["pcie4"])
    # per micro-batch (half of each phase): 0.3 - 0.05 and 0.5 - 0.1, twice, then 0.01
    assert job.seconds == pytest.approx(0.3 + 2 * (0.25 + 0.4) + 0.01)
    assert (job.samples, job.tokens, job.gpus) == (32, 32768, 4)
    assert job.cost(2.0, tokens=1e9) == pytest.approx(4 * 2.0 * job.hours(tokens=1e9))
    assert job.breakdown[-1].kind == "comm"
    once = dataclasses.replace(slow, per_micro_batch=False)  # DDP: only the last backward
    job = data_parallel_time(timed, once, ranks=4, accumulation=2, link=LINKS["pcie4"])
    assert job.seconds == pytest.approx(0.3 + (0.3 - 0.05) + (0.5 - 0.1) + 0.01)


def test_a_sharded_optimizer_steps_its_shard_only():
    rows = (*_timed(0.1, 0.2).breakdown, KindTime("memory", "optimizer", 0.08, 0.0, 8e9, 40))
    timed = dataclasses.replace(_timed(0.1, 0.2), seconds=0.38, breakdown=rows)
    free = CommPlan(0.0, 0.0, 0.0, 0.0, per_micro_batch=False, what="x", sharded_optimizer=True)
    job = data_parallel_time(timed, free, ranks=8, accumulation=1, link=LINKS["nvlink4"])
    assert job.seconds == pytest.approx(0.3 + 0.01)
    assert job.phase_seconds("optimizer") == pytest.approx(0.01)


def test_a_plan_over_several_cards_is_timed_with_its_collectives():
    kw = {"batch_size": 4, "seq_len": 128, "precision": "bf16-mixed", "time": True}
    one = fits(TINY, "RTX 4090", **kw).time
    four = fits(TINY, ["RTX 4090"] * 4, strategy="ddp", **kw).time
    assert four.gpus == 4 and four.tokens == 4 * one.tokens
    assert four.seconds >= one.seconds and four.tokens_per_s > one.tokens_per_s
    assert any("4 GPUs over PCIe 4.0 x16" in n for n in four.notes)
    assert not any("communication between GPUs" in n for n in four.notes)
    nvlink = fits(TINY, ["H100"] * 4, strategy="fsdp", **kw).time
    assert nvlink.gpu == "4 x NVIDIA H100 SXM"


def test_what_the_time_of_several_cards_cannot_say_is_refused():
    kw = {"batch_size": 1, "seq_len": 64, "time": True}
    with pytest.raises(ValueError, match="HSDP spans nodes"):
        fits(TINY, ["H100"] * 4, strategy="hsdp", gpus_per_node=2, **kw)


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: collective_seconds("all_reduce", float("nan"), 8, LINKS["pcie4"]), "nbytes"),
        (lambda: collective_seconds("all_reduce", -1.0, 8, LINKS["pcie4"]), "nbytes"),
        (lambda: collective_seconds("all_reduce", 1e9, 0, LINKS["pcie4"]), "ranks"),
        (lambda: comm_for("ddp", ranks=-2, link=LINKS["pcie4"], grad_bytes=1.0,
                          param_bytes=1.0), "ranks"),
        (lambda: comm_for("ddp", ranks=2, link=LINKS["pcie4"], grad_bytes=float("inf"),
                          param_bytes=1.0), "grad_bytes"),
        (lambda: comm_for("fsdp", ranks=2, link=LINKS["pcie4"], grad_bytes=1.0,
                          param_bytes=-5.0), "param_bytes"),
        (lambda: data_parallel_time(_timed(0.1, 0.2), CommPlan(0, 0, 0, 0, False, "x"),
                                    ranks=4, accumulation=0, link=LINKS["pcie4"]),
         "accumulation"),
    ],
)  # fmt: skip
def test_a_bad_size_is_refused_by_name(call, name):
    with pytest.raises(ValueError, match=rf"^{name} must be"):
        call()


def test_a_value_of_the_wrong_kind_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match="ranks"):
        collective_seconds("all_reduce", 1e9, "8", LINKS["pcie4"])
    with pytest.raises(TypeError, match="link"):
        collective_seconds("all_reduce", 1e9, 8, "nvlink4")


def test_fsdp_over_a_4_bit_base_gathers_the_packed_codes():
    """FSDP-QLoRA (4-bit codes in the units, the prepared root in fp32): each pass gathers
    the model as stored, a quarter of a 16-bit one's blocks, and the adapters' gradients
    alone are reduce-scattered."""
    from torchfit.memory import estimate
    from torchfit.whole import _fsdp_gathers

    kw = {"batch_size": 1, "seq_len": 64, "dtype": "nf4", "lora_rank": 8}
    plan = fits("llama-3.2-1b", ["H100"] * 2, strategy="fsdp", time=True, **kw)
    assert plan.time.gpus == 2 and any(
        "FSDP: parameters all-gathered" in n for n in plan.time.notes
    )
    root, blocks = _fsdp_gathers("llama-3.2-1b", plan)
    gathered = root + blocks
    single = estimate("llama-3.2-1b", plan.step)
    assert gathered == pytest.approx(single.weights, rel=0.01)  # the model as it is held
    # the 4-bit blocks and the fp32 embedding: well under the model in bf16
    assert gathered < 0.7 * 2 * plan.time.parameters
