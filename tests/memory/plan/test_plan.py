import json
import re

import pytest

from torchfit._core.units import format_bytes
from torchfit.memory import GPU
from torchfit.memory.plan import plan_card, resolve_budget


def test_gpt3_does_not_fit_one_a100_40gb_even_in_int8():
    plan = plan_card("gpt3-175b", "A100 40GB", mode="inference", dtype="int8", seq_len=2048)
    assert not plan.fits
    assert plan.estimate.weights > 160 * 10**9  # 175B int8 weights alone exceed the card
    assert plan.largest_batch == 0


def test_gpt2_in_4bit_fits_an_rtx_2070_super_with_room():
    plan = plan_card("gpt2", "RTX 2070 Super", mode="inference", dtype="nf4", seq_len=1024)
    assert plan.fits
    assert plan.headroom > 0.75 * plan.budget
    assert plan.largest_batch >= 8


def test_verdict_agrees_with_headroom_and_max_batch():
    plan = plan_card("gpt2", "RTX 3060", batch_size=4, seq_len=512)
    assert plan.fits == (plan.headroom >= 0)
    bigger = plan_card("gpt2", "RTX 3060", batch_size=plan.largest_batch + 1, seq_len=512)
    at_max = plan_card("gpt2", "RTX 3060", batch_size=plan.largest_batch, seq_len=512)
    assert at_max.fits
    assert not bigger.fits


def test_longest_seq_is_the_boundary():
    plan = plan_card("llama-2-7b", "RTX 4090", mode="inference", dtype="nf4", seq_len=512)
    assert plan.longest_seq == 4096  # 4-bit 7B at batch 1 reaches the model's maximum
    tight = plan_card("llama-2-7b", "RTX 3060", mode="inference", dtype="bf16", seq_len=512)
    assert not tight.fits
    assert tight.longest_seq == 0


def test_advice_is_re_estimated_and_ranked():
    plan = plan_card("llama-2-7b", "RTX 4090", seq_len=1024)
    assert not plan.fits
    knobs = [a.knob for a in plan.advice]
    assert any("QLoRA" in k for k in knobs)
    assert any("8-bit AdamW" in k for k in knobs)
    # each advice figure is a real re-estimate: it differs from the current total
    assert all(a.device_needed == plan.estimate.device_needed - a.saves for a in plan.advice)
    fitting = [a for a in plan.advice if a.fits]
    assert all(a.device_needed <= plan.budget for a in fitting)
    # ranked: fitting knobs first, then by bytes saved
    assert plan.advice == tuple(sorted(plan.advice, key=lambda a: (not a.fits, -a.saves)))


def test_gradient_accumulation_keeps_the_effective_batch():
    plan = plan_card("gpt2", "RTX 3060", batch_size=64, seq_len=1024)
    accumulation = [a for a in plan.advice if "accumulation" in a.knob]
    assert accumulation
    micro, steps = (int(x) for x in accumulation[0].knob.split()[1::2][:2])
    assert micro * steps >= 64
    assert accumulation[0].fits


def test_budget_forms():
    card, count = resolve_budget("12GiB")
    assert card.memory == 12 * 2**30 and count == 1
    card, count = resolve_budget(8 * 2**30)
    assert card.memory == 8 * 2**30
    card, count = resolve_budget(["RTX 3090", "RTX 3060"])
    assert count == 2 and "3060" in card.name
    assert resolve_budget(GPU.custom("mine", memory="10GiB"))[0].name == "mine"
    with pytest.raises(ValueError, match="empty list"):
        resolve_budget([])
    with pytest.raises(ValueError, match=r"close matches|GPU.custom"):
        resolve_budget("RTX 9999")


def test_plan_reads_as_a_report_and_serializes():
    plan = plan_card("gpt2", "T4", seq_len=512)
    text = str(plan)
    assert "T4" in text and "verdict" in text and "largest batch" in text
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["fits"] == plan.fits
    assert data["estimate"]["device_total"] == plan.estimate.device_total
    assert data["settings"]["step"]["precision"] == "16-mixed"  # T4: no native bf16


def test_context_and_reserved_are_included():
    plan = plan_card("gpt2", "RTX 3060", mode="inference", seq_len=128)
    e = plan.estimate
    assert e.context > 200 * 2**20
    assert e.reserved is not None and e.reserved >= e.total
    assert e.device_total == e.reserved + e.context


def test_sharded_plan_on_several_cards():
    cards = ["A100 40GB"] * 8
    kw = dict(seq_len=2048, gradient_checkpointing=True)
    replica = plan_card("llama-2-7b", cards, **kw)
    fsdp = plan_card("llama-2-7b", cards, strategy="fsdp", **kw)
    zero2 = plan_card("llama-2-7b", cards, strategy="zero2", **kw)
    assert not replica.fits
    assert fsdp.fits
    assert fsdp.estimate.device_total <= zero2.estimate.device_total < replica.estimate.device_total
    # model states are sharded 8 ways: per rank they fall far below the single copy
    states = lambda p: p.estimate.weights + p.estimate.gradients + p.estimate.optimizer  # noqa: E731
    assert states(fsdp) < states(replica) / 4
    assert "fsdp, per rank" in str(fsdp)
    with pytest.raises(ValueError, match="ddp"):
        plan_card("gpt2", cards, strategy="pipeline")


_SHARDED = re.compile(
    r"(?P<label>[^:]+?) on (?P<n>\d+) GPUs at batch (?P<micro>\d+) per GPU"
    r"(?:, (?P<steps>\d+) steps accumulated)? \(global (?P<kept>\d+)(?:, was (?P<was>\d+))?\)"
)


def test_sharding_advice_keeps_the_global_batch_on_the_fewest_gpus():
    # gpt2-large, batch 16 x 1024: activations alone (45 GiB) overflow one RTX 4090
    plan = plan_card("gpt2-large", "RTX 4090", batch_size=16, seq_len=1024)
    assert not plan.fits
    found = {}
    for advice in plan.advice:
        match = _SHARDED.fullmatch(advice.knob)
        if match:
            found[match["label"]] = (advice, match)
    assert set(found) == {"DDP", "ZeRO-2", "FSDP / ZeRO-3"}
    strategies = {"DDP": "ddp", "ZeRO-2": "zero2", "FSDP / ZeRO-3": "fsdp"}
    for label, (advice, match) in found.items():
        n, micro = int(match["n"]), int(match["micro"])
        steps = int(match["steps"] or 1)
        assert advice.fits and match["was"] is None
        assert int(match["kept"]) == n * micro * steps == 16  # the global batch is kept
        cards = ["RTX 4090"] * n
        assert advice.changes["strategy"] == strategies[label]
        assert advice.step.batch_size == micro
        assert advice.step.gradient_accumulation_steps == steps
        # the advice carries the step it was estimated with: planning it gives its figure
        again = plan_card("gpt2-large", cards, advice.step, strategy=strategies[label])
        assert again.fits and again.estimate.device_needed == advice.device_needed
        if steps > 1:  # accumulation only where the next larger micro-batch would not fit
            larger = advice.step.replace(
                batch_size=2 * micro, gradient_accumulation_steps=steps // 2
            )
            assert not plan_card("gpt2-large", cards, larger, strategy=strategies[label]).fits


def test_sharding_advice_says_when_the_global_batch_must_grow():
    # llama-2-7b full fine-tune, batch 8: no strategy fits 8 x RTX 4090; the nearest miss
    # runs one sample per GPU on 64 GPUs, which the advice must say changes the batch
    plan = plan_card("llama-2-7b", "RTX 4090", batch_size=8, seq_len=1024)
    fsdp = [a for a in plan.advice if a.knob.startswith("FSDP")]
    assert len(fsdp) == 1 and not fsdp[0].fits
    match = _SHARDED.fullmatch(fsdp[0].knob)
    assert match and match["n"] == "64" and match["kept"] == "64" and match["was"] == "8"
    fewer = plan_card("llama-2-7b", ["RTX 4090"] * 8, strategy="fsdp", batch_size=1, seq_len=1024)
    assert not fewer.fits  # 8 GPUs, the most that keep batch 8, do not hold it


def test_a_plan_that_fits_gets_no_sharding_advice_that_changes_its_batch():
    # gpt2 at batch 1 fits an RTX 3060; two GPUs at batch 1 each would be global batch 2
    plan = plan_card("gpt2", "RTX 3060", batch_size=1, seq_len=1024)
    assert plan.fits
    sharded = [a for a in plan.advice if _SHARDED.fullmatch(a.knob)]
    assert all(_SHARDED.fullmatch(a.knob)["was"] is None for a in sharded)
    assert not [a for a in plan.advice if "GPUs at batch" in a.knob]
    # at batch 8 splitting over two GPUs keeps the global batch: that advice stays
    wide = plan_card("gpt2", "RTX 3060", batch_size=8, seq_len=1024)
    kept = [_SHARDED.fullmatch(a.knob) for a in wide.advice if "GPUs at batch" in a.knob]
    assert kept and all(m and m["was"] is None and m["kept"] == "8" for m in kept)


def test_fsdp_offload_and_param_dtype_options_change_the_rank_estimate():
    common = {"strategy": "fsdp", "seq_len": 2048, "gradient_checkpointing": True}
    cards = ["A100 40GB"] * 8
    plain = plan_card("llama-2-13b", cards, **common)
    offloaded = plan_card("llama-2-13b", cards, offload_optimizer=True, **common)
    assert plain.estimate.optimizer > 0
    assert offloaded.estimate.optimizer == 0
    assert offloaded.settings.offload_optimizer
    policy = plan_card("llama-2-13b", cards, param_dtype="bf16", **common)
    assert policy.estimate.device_total < plain.estimate.device_total
    assert any("MixedPrecisionPolicy(param_dtype=bf16)" in n for n in policy.estimate.notes)
    both = plan_card(
        "llama-2-13b",
        cards,
        offload_optimizer=True,
        offload_params=True,
        param_dtype="bf16",
        **common,
    )
    assert both.estimate.weights < policy.estimate.weights
    assert both.estimate.device_total < offloaded.estimate.device_total


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"offload_optimizer": True}, r"need a strategy: pass strategy='fsdp'"),
        ({"strategy": "ddp", "param_dtype": "bf16"}, r"param_dtype='bf16' with strategy='ddp'"),
        ({"strategy": "fsdp", "param_dtype": "fp32"}, r"'bf16' or 'fp16'"),
    ],
)
def test_sharding_options_without_their_strategy_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        plan_card("llama-2-7b", ["A100 40GB"] * 2, **kwargs)


def test_hsdp_plan_over_two_nodes_matches_fsdp_over_one():
    common = {"seq_len": 2048, "gradient_checkpointing": True, "param_dtype": "bf16"}
    hybrid = plan_card(
        "llama-2-13b", ["A100 40GB"] * 16, strategy="hsdp", gpus_per_node=8, **common
    )
    node = plan_card("llama-2-13b", ["A100 40GB"] * 8, strategy="fsdp", **common)
    assert hybrid.estimate.total == node.estimate.total
    assert hybrid.settings.gpus_per_node == 8
    assert any(n.startswith("HSDP") for n in hybrid.estimate.notes)


@pytest.mark.parametrize("quadratic", [0, 3, 40])
def test_plan_and_max_batch_size_find_the_same_largest_batch(monkeypatch, quadratic):
    """`fits` and `memory.max_batch_size` search one memory curve the same way."""
    from torchfit.memory import MemoryEstimate, max_batch_size
    from torchfit.memory.plan import verdict

    def held(batch):  # not affine in the batch: a bisection decides, not the line
        return 10**9 + 7_000_000 * batch + quadratic * 1000 * batch * batch

    def device_estimate(model, settings, card):
        return MemoryEstimate(weights=held(settings.step.batch_size), device="cuda")

    from torchfit.memory.plan import device

    monkeypatch.setattr(verdict, "_device_estimate", device_estimate)
    monkeypatch.setattr(device, "device_estimate", device_estimate)
    monkeypatch.setattr(device, "step_estimate", lambda m, s: device_estimate(m, s, None))
    monkeypatch.setattr(verdict, "step_estimate", lambda m, s: device_estimate(m, s, None))
    monkeypatch.setattr(device, "on_card", lambda single, settings, card: single)
    card = GPU.custom("lab card", memory="6GiB")
    plan = plan_card("gpt2", card, batch_size=1, seq_len=128)
    predicted = max_batch_size(lambda b: MemoryEstimate(weights=held(b)), card.memory, margin=0.0)
    brute = max(b for b in range(1, 10_000) if held(b) <= card.memory)
    assert plan.largest_batch == predicted == brute


def test_a_budget_too_small_to_hold_anything_was_meant_as_gigabytes():
    with pytest.raises(ValueError, match=r"gpu must be .* >= 1048576; got 42; .*'24GB'"):
        plan_card("gpt2", gpu=42)
    assert not plan_card("gpt2", gpu=2**20).fits  # 1 MiB: a (hopeless) budget, not an error


@pytest.mark.parametrize(
    ("model", "gpu", "kwargs"),
    [
        ("gpt2", "RTX 3060", {"seq_len": 512}),
        ("llama-2-7b", "RTX 3060", {"mode": "inference", "seq_len": 512}),
        ("llama-2-13b", ["A100 40GB"] * 8, {"strategy": "fsdp", "seq_len": 2048}),
    ],
)
def test_a_plan_is_truthy_exactly_when_it_fits(model, gpu, kwargs):
    plan = plan_card(model, gpu, **kwargs)
    assert bool(plan) is plan.fits
    assert ("fits" if plan else "does not fit") == ("fits" if plan.fits else "does not fit")


def test_a_plan_repr_is_one_short_line_and_str_the_report():
    plan = plan_card("llama-2-13b", ["A100 40GB"] * 8, strategy="fsdp", seq_len=2048)
    line = repr(plan)
    assert "\n" not in line and len(line) < 200
    assert line == (
        "<Plan llama-2-13b, train, bf16-mixed, batch 1, seq 2048: DOES NOT FIT, "
        f"needs {format_bytes(plan.estimate.device_needed)} of 40.00 GiB "
        "on 8 x NVIDIA A100 40GB (fsdp, per rank)>"
    )
    assert len(str(plan)) > 1000 and "advice (each re-estimated):" in str(plan)
    fitting = plan_card("gpt2", "RTX 3060", seq_len=512)
    assert repr(fitting).startswith("<Plan gpt2, train, bf16-mixed, batch 1, seq 512: FITS, ")
    assert repr(fitting).endswith(" of 12.00 GiB on NVIDIA GeForce RTX 3060 12GB>")
    vision = plan_card("alexnet", "RTX 3060")
    assert ", input 3x227x227: " in repr(vision)


def test_the_workspace_note_says_what_its_bytes_are():
    # gpt2 at 1024 tokens: 400 MiB of workspace, 16 MiB of it cuBLAS's (one per thread:
    # forward and backward); the rest is the loss's fp32 logit gradients at backward's start
    plan = plan_card("gpt2", "RTX 3060", seq_len=1024)
    e = plan.estimate
    [note] = [n for n in e.notes if n.startswith("workspace ")]
    assert note.startswith(f"workspace {format_bytes(e.workspace)}: ")
    assert "16.25 MiB of cuBLAS workspace" in note
    assert "(start of backward: " in note and "gradients of the logits" in note
    transient = e.workspace - 2 * int(8.125 * 2**20)
    assert f"{format_bytes(transient)} of the step's transients" in note
    # inference without a transient: the workspace is cuBLAS's alone, its note says so
    served = plan_card("gpt2", "RTX 3060", mode="inference", seq_len=1024).estimate
    assert not [n for n in served.notes if n.startswith("workspace ")]
    assert any(n.startswith("cuBLAS workspace 8.12 MiB") for n in served.notes)


def test_fsdp_under_autocast_is_advised_bf16_gathers_with_the_copies_it_saves():
    cards = ["A100 40GB"] * 8
    plan = plan_card("llama-2-13b", cards, strategy="fsdp", seq_len=2048)
    [advice] = [a for a in plan.advice if a.knob.startswith("FSDP2 MixedPrecisionPolicy")]
    assert advice.knob == "FSDP2 MixedPrecisionPolicy(param_dtype=bf16)"
    assert "autocast keeps no 16-bit weight copies" in advice.detail
    # the autocast copies (in overhead) are a whole bf16 model: 13B x 2 bytes, per rank
    assert plan.estimate.overhead > 23 * 2**30
    gathered = plan_card("llama-2-13b", cards, strategy="fsdp", seq_len=2048, param_dtype="bf16")
    assert advice.device_needed == gathered.estimate.device_needed
    assert advice.saves >= plan.estimate.overhead - gathered.estimate.overhead
    assert gathered.estimate.overhead < 2**20
    # nothing to advise where the gathers are 16-bit already, or without FSDP
    for other in (gathered, plan_card("llama-2-13b", cards, strategy="ddp", seq_len=2048)):
        assert not [a for a in other.advice if "MixedPrecisionPolicy" in a.knob]


def test_the_verdict_decides_on_the_oom_line_not_on_what_the_allocator_would_cache():
    # Unbounded, the allocator would cache more than this 12 GiB card has; bounded, it
    # frees its cache and retries before it raises, so the step runs down to the OOM line.
    plan = plan_card("Qwen/Qwen2.5-0.5B", "RTX 3060", seq_len=1152)
    e = plan.estimate
    assert e.oom_line is not None
    assert e.device_needed == max(e.oom_line, e.total) + e.context < e.device_total
    assert e.device_total > plan.budget
    assert plan.fits and plan.headroom == plan.budget - e.device_needed > 0
    assert "needs on the card (OOM line)" in str(e)


@pytest.mark.parametrize("budget", ["3GiB", "6GiB"])
def test_the_quick_refusal_agrees_with_the_device_estimate(budget):
    from torchfit.memory.plan.device import device_estimate, holds, step_estimate
    from torchfit.memory.plan.settings import Settings
    from torchfit.memory.step import Step

    card, _ = resolve_budget(budget)
    for batch in (1, 2, 3, 5, 8, 13):
        settings = Settings(
            model="gpt2", step=Step(batch_size=batch, seq_len=512, precision="bf16-mixed")
        )
        full = device_estimate("gpt2", settings, card)
        assert holds("gpt2", settings, card) == (full.device_needed <= card.total)
        assert step_estimate("gpt2", settings).total <= full.device_needed  # the lower bound


def test_the_advice_skips_replays_of_steps_too_big_for_the_card_and_says_the_same(monkeypatch):
    from torchfit.memory.plan import device, verdict

    full_estimates = []
    real = verdict._device_estimate

    def counted(model, settings, card):
        full_estimates.append(settings.step.batch_size)
        return real(model, settings, card)

    monkeypatch.setattr(verdict, "_device_estimate", counted)
    monkeypatch.setattr(device, "device_estimate", counted)
    quick = plan_card("gpt2-medium", "RTX 3060", batch_size=64, seq_len=1024)
    quick_count = len(full_estimates)
    full_estimates.clear()
    monkeypatch.setattr(verdict, "outgrows", lambda model, settings, card: False)
    slow = plan_card("gpt2-medium", "RTX 3060", batch_size=64, seq_len=1024)
    assert [a.to_dict() for a in quick.advice] == [a.to_dict() for a in slow.advice]
    assert any("GPUs" in a.knob for a in quick.advice)  # the sharding search ran
    assert quick_count < len(full_estimates), (quick_count, len(full_estimates))


@pytest.mark.parametrize(("model", "card"), [("gpt2", "RTX 3060"), ("alexnet", "GTX 1060 6GB")])
def test_card_fit_is_the_plans_estimate_and_largest_batch(model, card):
    from torchfit.memory.plan.verdict import card_fit
    from torchfit.memory.step import Step

    plan = plan_card(model, card, Step(batch_size=2))
    settings, estimate, largest = card_fit(model, plan.gpu, plan.step)
    assert settings == plan.settings
    assert estimate.device_needed == plan.estimate.device_needed
    assert largest == plan.largest_batch


def test_a_traced_search_redraws_its_guess_and_asks_few_sizes(monkeypatch):
    # a trace costs about a second a size: the guess redrawn with the card's view at the
    # guess asks a handful of sizes where a gallop from the first guess asked 15 (ResNet-18
    # on a 6 GB card); the answer is a boundary: it fits, one more does not
    from torchfit.memory.plan import device, verdict
    from torchfit.memory.plan.settings import Settings
    from torchfit.memory.step import Step

    asked = []
    real = verdict.step_estimate

    def counted(model, settings):
        asked.append(settings.step.batch_size)
        return real(model, settings)

    monkeypatch.setattr(verdict, "step_estimate", counted)
    card, _ = resolve_budget("GTX 1060 6GB")
    at = Settings(model="resnet-18", step=Step(batch_size=32, input_shape=(3, 112, 112)))
    _, _, largest = verdict._searched("resnet-18", at, card)
    assert len(set(asked)) <= 9, asked
    assert device.holds("resnet-18", at.replace(batch_size=largest), card)
    assert not device.holds("resnet-18", at.replace(batch_size=largest + 1), card)
