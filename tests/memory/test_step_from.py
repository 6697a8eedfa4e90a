"""`Step` fields read from real ``TrainingArguments`` and a real Lightning ``Trainer``."""

import subprocess
import sys
import typing
import warnings

import pytest
import torch
from transformers import Trainer, TrainingArguments
from transformers.training_args import OptimizerNames

from tiny_configs import tiny_llama
from torchfit import Step, estimate
from torchfit._core.optimizers import optimizer_name_of, parse_optimizer
from torchfit.memory.step import (
    LIGHTNING_ALIASES,
    TRANSFORMERS_OPTIMIZERS,
    NotModelledWarning,
    StepFields,
    lightning_fields,
    merge_fields,
    training_arguments_fields,
)

lightning = pytest.importorskip("lightning")


def _args(tmp_path, **settings):
    return TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, **settings)


def _llama():
    return tiny_llama()


@pytest.fixture(scope="module")
def trainer():
    return lightning.Trainer(
        accelerator="cpu",
        precision="bf16-mixed",
        accumulate_grad_batches=4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


# -- TrainingArguments ----------------------------------------------------------------------


def test_the_defaults_are_read_as_the_trainer_runs_them(tmp_path):
    read = training_arguments_fields(_args(tmp_path))
    # transformers 5 defaults to optim="adamw_torch_fused" with torch >= 2.8
    assert read.fields == {
        "batch_size": 8,
        "gradient_accumulation_steps": 1,
        "precision": "32-true",
        "optimizer": "adamw-fused",
        "gradient_checkpointing": False,
    }
    assert read.notes == ()
    assert read.unsupported == {}


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"bf16": True}, {"precision": "bf16-mixed"}),
        ({"fp16": True}, {"precision": "16-mixed"}),
        ({"bf16_full_eval": True}, {"precision": "32-true"}),  # evaluation only
        ({"per_device_train_batch_size": 3}, {"batch_size": 3}),
        ({"gradient_accumulation_steps": 16}, {"gradient_accumulation_steps": 16}),
        ({"activation_checkpointing": True}, {"gradient_checkpointing": True}),
        ({"optim": "adamw_torch"}, {"optimizer": "adamw"}),
        ({"optim": "paged_adamw_8bit"}, {"optimizer": "paged-adamw-8bit"}),
    ],
)
def test_each_setting_becomes_its_field(tmp_path, settings, expected):
    read = training_arguments_fields(_args(tmp_path, **settings))
    assert {name: read.fields[name] for name in expected} == expected


def test_the_deprecated_gradient_checkpointing_spelling_is_read_too(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers: use activation_*
        args = _args(tmp_path, gradient_checkpointing=True)
    assert training_arguments_fields(args).fields["gradient_checkpointing"] is True


def test_the_accelerate_environment_decides_autocast_as_the_trainer_does(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    read = training_arguments_fields(_args(tmp_path))
    assert read.fields["precision"] == "bf16-mixed"
    assert "ACCELERATE_MIXED_PRECISION" in read.read_from["precision"]
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp8")
    read = training_arguments_fields(_args(tmp_path))
    with pytest.raises(ValueError, match=r"mixed_precision='fp8'.*Pass precision="):
        merge_fields(read, {})
    assert merge_fields(read, {"precision": "bf16-mixed"})["precision"] == "bf16-mixed"


def test_every_mapped_optim_is_a_transformers_name_parse_optimizer_agrees_with():
    known = {o.value for o in OptimizerNames}
    assert set(TRANSFORMERS_OPTIMIZERS) <= known
    for optim, name in TRANSFORMERS_OPTIMIZERS.items():
        assert parse_optimizer(optim).value == name, optim  # one reading of each name


@pytest.mark.parametrize("optim", ["adamw_torch", "adamw_torch_fused", "sgd"])
def test_a_torch_optimizer_is_what_transformers_builds(tmp_path, optim):
    args = _args(tmp_path, optim=optim)
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args)
    built = cls([torch.nn.Parameter(torch.zeros(4))], **kwargs)
    assert training_arguments_fields(args).fields["optimizer"] == optimizer_name_of(built).value


@pytest.mark.parametrize(
    "optim", ["adamw_8bit", "adamw_bnb_8bit", "paged_adamw_8bit", "paged_adamw_32bit", "lion_32bit"]
)
def test_a_bitsandbytes_optimizer_is_what_transformers_builds(tmp_path, optim):
    pytest.importorskip("bitsandbytes")
    args = _args(tmp_path, optim=optim)
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args)
    name = training_arguments_fields(args).fields["optimizer"]
    assert (kwargs["optim_bits"] == 8) == name.endswith("-8bit")
    assert kwargs["is_paged"] == name.startswith("paged-")
    assert cls.__name__.lower() == name.removeprefix("paged-").removesuffix("-8bit")


@pytest.mark.parametrize(
    ("optim_args", "name"),
    [(None, "sgd"), ("momentum=0.9", "sgd-momentum"), ("momentum=0, nesterov=False", "sgd")],
)
def test_sgd_momentum_comes_from_optim_args_as_transformers_reads_it(tmp_path, optim_args, name):
    args = _args(tmp_path, optim="sgd", optim_args=optim_args)
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args)
    built = cls([torch.nn.Parameter(torch.zeros(4))], **kwargs)
    assert training_arguments_fields(args).fields["optimizer"] == name
    assert optimizer_name_of(built).value == name
    with pytest.raises(ValueError, match="momentum='fast' is not a number"):
        training_arguments_fields(_args(tmp_path, optim="sgd", optim_args="momentum=fast"))


def test_every_other_transformers_optim_is_refused_by_name_unless_replaced(tmp_path):
    left = sorted({o.value for o in OptimizerNames} - set(TRANSFORMERS_OPTIMIZERS))
    assert "rmsprop" in left
    for optim in left:
        read = training_arguments_fields(_args(tmp_path, optim=optim))
        assert "optimizer" not in read.fields
        with pytest.raises(ValueError, match=rf"optim='{optim}' has no memory model.*adamw_torch"):
            merge_fields(read, {"seq_len": 64})
    assert merge_fields(read, {"optimizer": "adamw"})["optimizer"] == "adamw"


def test_adafactor_is_read_with_a_note_on_transformers_own_class(tmp_path):
    read = training_arguments_fields(_args(tmp_path, optim="adafactor"))
    assert read.fields["optimizer"] == "adafactor"
    assert any("transformers' own Adafactor" in note for note in read.notes)


def test_settings_not_modelled_are_notes_and_warnings(tmp_path):
    args = _args(
        tmp_path,
        torch_compile=True,
        auto_find_batch_size=True,
        activation_checkpointing=True,
        activation_checkpointing_kwargs={"every_n_layers": 2, "offload": True},
    )
    read = training_arguments_fields(args)
    joined = " | ".join(read.notes)
    for words in ("torch_compile=True", "auto_find_batch_size", "every_n_layers=2", "offload"):
        assert words in joined
    with pytest.warns(NotModelledWarning) as seen:
        read.warn()
    assert [str(w.message) for w in seen] == [f"TrainingArguments: {n}" for n in read.notes]
    assert len(seen) == 4
    assert seen[0].filename == __file__  # the line that called warn()


def test_something_else_than_training_arguments_is_a_type_error():
    with pytest.raises(TypeError, match=r"expected a transformers\.TrainingArguments; got dict"):
        training_arguments_fields({"bf16": True})


# -- merging --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "given"),
    [
        ({"bf16": True}, {"precision": "bf16-mixed"}),
        ({"bf16": True}, {"precision": "bf16"}),  # another spelling of it
        ({"bf16": True}, {"precision": "bf16-true"}),  # a model loaded in bf16
        ({}, {"precision": "16-true"}),  # a model loaded in fp16, no autocast
        ({}, {"optimizer": "adamw_torch_fused"}),
        ({}, {"optimizer": lambda params: torch.optim.SGD(params, lr=0.1)}),  # taken as given
        ({"per_device_train_batch_size": 4}, {"batch_size": 4, "seq_len": 128}),
    ],
)
def test_given_fields_that_agree_are_kept(tmp_path, settings, given):
    merged = merge_fields(training_arguments_fields(_args(tmp_path, **settings)), given)
    assert merged.items() >= given.items()


@pytest.mark.parametrize(
    ("settings", "given", "message"),
    [
        ({"bf16": True}, {"precision": "32-true"}, r"precision='32-true'.*'bf16-mixed'.*bf16=True"),
        ({"bf16": True}, {"precision": "16-mixed"}, r"precision='16-mixed'.*bf16=True"),
        ({"fp16": True}, {"precision": "16-true"}, r"precision='16-true'.*fp16=True"),
        ({}, {"precision": "bf16-mixed"}, r"'32-true'.*bf16=False, fp16=False"),
        ({}, {"optimizer": "sgd"}, r"optimizer='sgd'.*'adamw-fused'.*optim='adamw_torch_fused'"),
        ({}, {"batch_size": 2}, r"batch_size=2.*per_device_train_batch_size=8.*replace"),
        ({}, {"gradient_checkpointing": True}, r"activation_checkpointing=False"),
    ],
)
def test_a_contradiction_names_both(tmp_path, settings, given, message):
    read = training_arguments_fields(_args(tmp_path, **settings))
    with pytest.raises(ValueError, match=message):
        merge_fields(read, given)


def test_the_fields_make_the_step_the_keywords_make(tmp_path):
    args = _args(
        tmp_path,
        bf16=True,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=4,
        activation_checkpointing=True,
        optim="adamw_torch",
    )
    fields = merge_fields(training_arguments_fields(args), {"seq_len": 64})
    step = Step(**fields)
    assert step == Step.of(**fields)
    same = estimate(
        _llama(), batch_size=2, seq_len=64, precision="bf16-mixed", gradient_accumulation_steps=4,
        gradient_checkpointing=True, optimizer="adamw",
    )  # fmt: skip
    assert estimate(_llama(), step).total == same.total
    assert same.total != estimate(_llama(), batch_size=2, seq_len=64).total  # the fields count


# -- Lightning ------------------------------------------------------------------------------


def test_a_trainer_gives_its_precision_and_accumulation(trainer):
    read = lightning_fields(trainer)
    assert read.fields == {"precision": "bf16-mixed", "gradient_accumulation_steps": 4}
    assert read.read_from["gradient_accumulation_steps"] == "accumulate_grad_batches=4"
    assert read.notes == ()
    with pytest.raises(ValueError, match=r"precision='16-mixed' contradicts the Lightning Trainer"):
        merge_fields(read, {"precision": "16-mixed"})
    assert merge_fields(read, {"precision": "bf16"})["precision"] == "bf16"


def test_a_fabric_gives_its_precision_and_the_fp32_outputs_of_its_module():
    fabric = lightning.Fabric(accelerator="cpu", devices=1, precision="bf16-true")
    read = lightning_fields(fabric)
    assert read.fields == {"precision": "bf16-true", "fp32_output": True}
    # what the field says: the module fabric.setup returns computes in bf16, returns fp32
    module = fabric.setup(torch.nn.Linear(4, 4))
    assert module.weight.dtype == torch.bfloat16
    assert module(torch.zeros(2, 4)).dtype == torch.float32
    step = Step.from_lightning(fabric, batch_size=2, seq_len=64, keep_output=True)
    plain = step.replace(fp32_output=False)
    assert estimate(_llama(), step).total > estimate(_llama(), plain).total


def test_a_trainer_step_estimates_as_the_keywords_do(trainer):
    step = Step.of(**merge_fields(lightning_fields(trainer), {"batch_size": 2, "seq_len": 64}))
    same = estimate(
        _llama(), batch_size=2, seq_len=64, precision="bf16-mixed", gradient_accumulation_steps=4
    )
    assert estimate(_llama(), step).total == same.total
    assert same.total != estimate(_llama(), batch_size=2, seq_len=64).total


def test_every_lightning_precision_input_resolves_as_lightning_resolves_it():
    from lightning.fabric.connector import _convert_precision_to_unified_args
    from lightning.fabric.plugins.precision import precision as lightning_precision

    assert dict(LIGHTNING_ALIASES) == lightning_precision._PRECISION_INPUT_STR_ALIAS_CONVERSION
    inputs = [
        value
        for part in typing.get_args(lightning_precision._PRECISION_INPUT)
        for value in typing.get_args(part)
    ]
    assert {16, "16", "bf16", "64-true", "transformer-engine"} <= set(inputs)
    for value in inputs:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Lightning discourages the legacy aliases
            theirs = _convert_precision_to_unified_args(value)
        read = lightning_fields(value)
        if "precision" in read.unsupported:
            assert theirs in {"64-true", "transformer-engine", "transformer-engine-float16"}
            with pytest.raises(
                ValueError, match=rf"precision={value!r}.*has no torchfit precision"
            ):
                merge_fields(read, {})
            assert merge_fields(read, {"precision": "32-true"}) == {"precision": "32-true"}
        else:
            assert read.fields["precision"] == theirs, value


@pytest.mark.parametrize("value", ["fp8", "BF16-mixed", 8, True])
def test_a_value_lightning_would_refuse_is_refused(value):
    with pytest.raises(ValueError, match="is not a Lightning precision"):
        lightning_fields(value)


def test_something_else_than_lightning_is_a_type_error():
    with pytest.raises(TypeError, match=r"expected a lightning\.Trainer.*got object"):
        lightning_fields(object())


def test_a_bitsandbytes_plugin_gives_the_quantized_base():
    pytest.importorskip("bitsandbytes")
    from lightning.pytorch.plugins import BitsandbytesPrecision

    plugin = BitsandbytesPrecision("nf4-dq", dtype=torch.bfloat16)
    assert plugin.precision == "32-true"  # inherited: the plugin's own field would mislead
    read = lightning_fields(plugin)
    assert read.fields == {
        "quantization": "nf4",
        "precision": "bf16-true",
        "base_dtype": "fp16",
        "double_quant": True,
        "quantize_head": True,
    }
    assert Step.of(**merge_fields(read, {"seq_len": 64})).quantization == "nf4"
    kept = lightning_fields(BitsandbytesPrecision("fp4", ignore_modules={"lm_head"}))
    assert (kept.fields["double_quant"], "quantize_head" in kept.fields) == (False, False)
    assert "ignore_modules=['lm_head']" in kept.notes[0]
    training = lightning_fields(BitsandbytesPrecision("int8-training"))
    with pytest.raises(ValueError, match="int8-training"):
        merge_fields(training, {})


def test_an_accumulation_schedule_counts_its_largest_factor():
    schedule = lightning.pytorch.callbacks.GradientAccumulationScheduler({0: 2, 3: 8, 6: 4})
    scheduled = lightning.Trainer(
        accelerator="cpu", callbacks=[schedule], logger=False, enable_checkpointing=False
    )
    read = lightning_fields(scheduled)
    assert scheduled.accumulate_grad_batches == 1  # what the Trainer says before fit
    assert read.fields["gradient_accumulation_steps"] == 8
    assert "GradientAccumulationScheduler" in read.read_from["gradient_accumulation_steps"]


def test_a_distributed_strategy_is_a_note():
    ddp = lightning.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", logger=False, enable_checkpointing=False
    )
    assert "strategy DDPStrategy" in lightning_fields(ddp).notes[0]


def test_step_fields_warn_each_note_once():
    read = StepFields(source="X", notes=("a", "b"))
    with pytest.warns(NotModelledWarning) as seen:
        read.warn()
    assert [str(w.message) for w in seen] == ["X: a", "X: b"]


def test_reading_needs_neither_transformers_nor_lightning_imported():
    code = (
        "import sys, torchfit.memory.step\n"
        "print(sorted(m for m in ('transformers', 'lightning', 'pytorch_lightning') "
        "if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# -- the constructors on Step -----------------------------------------------------------------


def test_step_from_training_arguments_builds_the_step_and_warns_at_the_caller(tmp_path):
    args = _args(
        tmp_path,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        bf16=True,
        gradient_checkpointing=True,
        optim="paged_adamw_8bit",
        torch_compile=True,
    )
    with pytest.warns(NotModelledWarning, match="torch_compile") as caught:
        step = Step.from_training_arguments(args, seq_len=512)
    assert [w.filename for w in caught] == [__file__]  # points at this line, not torchfit
    expected = Step(
        batch_size=4,
        seq_len=512,
        gradient_accumulation_steps=2,
        precision="bf16-mixed",
        gradient_checkpointing=True,
        optimizer="paged-adamw-8bit",
    )
    assert step == expected


def test_step_from_training_arguments_refuses_a_contradicting_field(tmp_path):
    with pytest.raises(ValueError, match=r"precision='32-true'.*bf16=True"):
        Step.from_training_arguments(_args(tmp_path, bf16=True), precision="32-true")


def test_step_from_lightning_reads_the_trainer_and_plans_on_a_card(trainer):
    from torchfit import fits

    step = Step.from_lightning(trainer, batch_size=2, seq_len=256)
    assert (step.precision, step.gradient_accumulation_steps) == ("bf16-mixed", 4)
    plan = fits(_llama(), "RTX 3060", step)
    assert plan.step == step  # planned as read: nothing re-chosen for the card
