"""torchfit.fits: the card's plan, with the step's time and the host when asked."""

import pytest

import torchfit
from torchfit.host import SampleCost
from torchfit.memory.plan import plan_card
from torchfit.speed import step_time

KW = {"batch_size": 4, "seq_len": 512}


def test_without_time_or_machine_it_is_the_cards_plan():
    plan = torchfit.fits("gpt2", "RTX 3060", **KW)
    card = plan_card("gpt2", "RTX 3060", **KW)
    assert plan.estimate == card.estimate and plan.largest_batch == card.largest_batch
    assert plan.time is None and plan.host is None and plan.machine_fits is None
    assert "time" not in plan.to_dict() and "host" not in plan.to_dict()
    assert str(plan) == str(card)


def test_time_is_the_planned_steps_on_the_card():
    plan = torchfit.fits("gpt2", "T4", **KW, time=True)
    assert plan.step.precision == "16-mixed"  # the card chose fp16, and that is what is timed
    assert plan.time.seconds == step_time("gpt2", "T4", plan.step).seconds
    assert plan.to_dict()["time"]["seconds"] == plan.time.seconds
    assert "\nstep time (predicted, the planned step on this card):\n" in str(plan)


def test_machine_adds_the_host_and_a_verdict_for_the_whole_machine():
    plan = torchfit.fits("gpt2", "RTX 3060", **KW, machine="desktop-3060")
    assert plan.host.machine.name == "desktop-3060" and plan.host.fits
    assert plan.machine_fits is True and plan.to_dict()["machine_fits"] is True
    assert str(plan).endswith("machine verdict: FITS (the card: fits; the host: fits)")
    too_big = torchfit.fits("llama-3.1-8b", "RTX 3060", **KW, machine="desktop-3060")
    assert not too_big and too_big.machine_fits is False
    assert "machine verdict: DOES NOT FIT (the card: does not fit" in str(too_big)


def test_a_loader_cost_checks_cores_and_disk_at_the_steps_pace():
    cost = SampleCost.from_rate(50.0, cpu_load=1.0)  # a slow decode: 50 samples/s a core
    plan = torchfit.fits("gpt2", "RTX 3060", **KW, machine="desktop-3060", loader=cost)
    feed = plan.host.feed
    timed = step_time("gpt2", "RTX 3060", plan.step)
    assert feed is not None and plan.time is None  # timed for the feed, not asked to show
    assert feed.samples_per_s == pytest.approx(KW["batch_size"] / timed.seconds)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"loader": SampleCost(0.01, 0.01)}, r"loader= checks the cores and disk of a machine"),
        ({"loader": SampleCost(0.01, 0.01), "machine": "this", "gpu": ["H100", "H100"],
          "strategy": "ddp"}, r"one machine feeds one card"),
        (
            {"machine": "desktop-3060", "gpu": ["H100", "H100"], "strategy": "zero2",
             "offload_optimizer": True},
            r"offloaded state is not planned here.*optimizer_offload_bytes",
        ),
    ],
)  # fmt: skip
def test_what_it_cannot_answer_is_refused_with_the_fix(kwargs, match):
    arguments = {"gpu": "RTX 3060", **kwargs}
    with pytest.raises(ValueError, match=match):
        torchfit.fits("gpt2", arguments.pop("gpu"), **KW, **arguments)
