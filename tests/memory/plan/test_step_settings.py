"""fits and the CLI take how the loop runs, precision by name, and the CUDA stack."""

import pytest

import torchfit
from torchfit.cli import main
from torchfit.memory.allocator.context import EAGER_LIBRARY_BYTES, bare_context_bytes

LORA = 4_194_304  # rank-8 adapters on q and v of Llama-2-7B


def _plan(**kwargs):
    common = dict(mode="train", seq_len=1024, trainable_params=LORA)
    return torchfit.fits("llama-2-7b", "A100 40GB", **{**common, **kwargs})


def test_precision_by_name_is_the_pure_16_bit_estimate():
    true16 = _plan(precision="bf16-true")
    mixed = _plan(precision="bf16-mixed")
    assert true16.step.precision == "bf16-true"
    # bf16-true keeps base and adapters in bf16; bf16-mixed over a frozen base keeps the
    # base as the checkpoint stores it (fp16 for Llama-2) and the adapters in fp32
    assert mixed.estimate.weights - true16.estimate.weights == 2 * LORA
    fp32_base = _plan(precision="bf16-mixed", base_dtype="fp32")
    assert fp32_base.estimate.weights == 4 * true16.estimate.weights // 2
    assert "bf16-true" in str(true16).splitlines()[0]


def test_accumulation_and_zeroing_in_place_keep_the_gradients():
    plain = _plan(precision="bf16-true")
    accumulated = _plan(precision="bf16-true", gradient_accumulation_steps=4)
    in_place = _plan(precision="bf16-true", set_to_none=False)
    assert accumulated.estimate.gradients == in_place.estimate.gradients > 0
    assert plain.estimate.gradients == 0  # the peak is the start of backward
    assert accumulated.estimate.total > plain.estimate.total


def test_the_accumulation_advice_keeps_the_runs_own_accumulation_in_its_words():
    plan = torchfit.fits(
        "gpt2", "RTX 3060", batch_size=16, seq_len=1024, dtype="bf16",
        gradient_accumulation_steps=4,
    )  # fmt: skip
    advice = next(a for a in plan.advice if "accumulation steps" in a.knob)
    micro, steps = int(advice.knob.split()[1]), int(advice.knob.split()[3])
    assert steps == advice.step.gradient_accumulation_steps
    assert micro * steps == 16 * 4
    assert advice.detail == "same effective batch (64)"


def test_the_accumulation_advice_is_re_estimated_with_the_gradients_alive():
    plan = torchfit.fits("gpt2", "RTX 3060", batch_size=16, seq_len=1024, dtype="bf16")
    advice = next(a for a in plan.advice if "accumulation steps" in a.knob)
    micro = int(advice.knob.split()[1])
    steps = int(advice.knob.split()[3])
    again = torchfit.fits(
        "gpt2",
        "RTX 3060",
        batch_size=micro,
        seq_len=1024,
        dtype="bf16",
        gradient_accumulation_steps=steps,
    )
    assert advice.device_needed == again.estimate.device_needed
    without = torchfit.fits("gpt2", "RTX 3060", batch_size=micro, seq_len=1024, dtype="bf16")
    assert advice.device_needed > without.estimate.device_needed


def test_the_cuda_version_and_a_measured_context_reach_the_plan():
    old = _plan(precision="bf16-true", cuda_version="11.2")
    assert old.estimate.context == bare_context_bytes(old.gpu) + EAGER_LIBRARY_BYTES[11]
    measured = _plan(precision="bf16-true", context_bytes="500MiB")
    assert measured.estimate.context == 500 * 2**20


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(precision="32", dtype="bf16"), "contradicts precision='32-true'"),
        (dict(precision="bf16-true", dtype="fp16"), "contradicts precision"),
        (dict(precision="fp8-true"), "unknown precision 'fp8-true'"),
        (
            dict(gradient_accumulation_steps=0),
            "gradient_accumulation_steps must be a whole number >= 1; got 0",
        ),
        (dict(cuda_version="eleven"), "cannot read the CUDA version"),
    ],
)
def test_bad_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _plan(**kwargs)


def test_the_command_line_takes_the_same_settings(capsys):
    code = main(
        [
            "plan",
            "llama-2-7b",
            "--gpu",
            "A100 40GB",
            "--precision",
            "bf16-true",
            "--dtype",
            "nf4",
            "--trainable-params",
            str(LORA),
            "--seq",
            "1024",
            "--accumulate",
            "4",
            "--keep-output",
            "--cuda-version",
            "12.1",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert out.splitlines()[0].startswith("llama-2-7b, train, nf4 base, bf16-true, batch 1 x 4")
    assert "gradients alive through forward and backward (4 accumulation steps)" in out
    assert "the forward's output (the logits) is kept through backward" in out


def test_the_command_line_refuses_contradictions_in_one_line(capsys):
    code = main(["plan", "gpt2", "--gpu", "RTX 3060", "--precision", "32", "--dtype", "bf16"])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert "contradicts precision='32-true'" in err


def test_a_training_plan_says_what_it_does_not_model():
    from torchfit.memory.plan.device import PLAN_NOT_MODELLED

    trained = torchfit.fits("gpt2", "RTX 3060", batch_size=1, seq_len=64)
    served = torchfit.fits("gpt2", "RTX 3060", batch_size=1, seq_len=64, mode="inference")
    assert PLAN_NOT_MODELLED in trained.estimate.notes
    assert "torch.compile" in PLAN_NOT_MODELLED
    assert PLAN_NOT_MODELLED not in served.estimate.notes
