"""fit_batch_size: real transformers Trainer runs on CPU under a simulated card."""

from __future__ import annotations

import copy
import math
import random

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainingArguments,
    default_data_collator,
)

from torchfit.integrations.transformers import fit_batch_size  # noqa: E402
from torchfit.memory import simulate_gpu  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning:transformers.*"),
    pytest.mark.filterwarnings("ignore::UserWarning:accelerate.*"),
    pytest.mark.filterwarnings("ignore::UserWarning:torch.utils.data.*"),
]

CARD = 24 * 2**20
SEQ = 32


class Tokens(torch.utils.data.Dataset):
    """Fixed-length token rows (a language-modelling set after packing)."""

    def __init__(self, n=2048):
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 256, (n, SEQ), generator=generator)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, index):
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def gpt2():
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2, n_embd=64, n_head=2, vocab_size=256, n_positions=SEQ,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return GPT2LMHeadModel(config)


def make_trainer(tmp_path, model=None, dataset=None, **options):
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=3,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        **options,
    )
    return Trainer(
        model=model if model is not None else gpt2(),
        args=args,
        train_dataset=dataset if dataset is not None else Tokens(),
        data_collator=default_data_collator,
    )


def seen_by(model):
    """Batch sizes of the real forward passes (fake copies run on FakeTensors)."""
    sizes = []

    def hook(module, args, kwargs):
        ids = kwargs["input_ids"]
        if type(ids) is torch.Tensor:  # not a FakeTensor: a real step
            sizes.append(ids.shape[0])

    model.register_forward_pre_hook(hook, with_kwargs=True)
    return sizes


def trains(batch_size, tmp_path, card=CARD, **options):
    """Does a plain Trainer run of three steps at this size fit the card?"""
    trainer = make_trainer(tmp_path, per_device_train_batch_size=batch_size, **options)
    sizes = seen_by(trainer.model)
    try:
        with simulate_gpu(card, track=trainer.model):
            trainer.train()
    except torch.OutOfMemoryError:
        return False
    assert sizes == [batch_size] * 3
    return True


def largest_that_trains(low, tmp_path, **options):
    """Bisection over real runs, from a size that must train (else the pick was too big)."""
    assert trains(low, tmp_path, **options), f"the chosen batch {low} does not train"
    high = max(low + 1, math.ceil(low * 1.1))
    while trains(high, tmp_path, **options):
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if trains(middle, tmp_path, **options) else (low, middle)
    return low


def pick_and_train(tmp_path, card=CARD, fit_options=None, **options):
    trainer = make_trainer(tmp_path, **options)
    sizes = seen_by(trainer.model)
    with simulate_gpu(card, track=trainer.model) as simulated:
        result = fit_batch_size(trainer, **(fit_options or {}))
        searched = list(sizes)
        trainer.train()
    assert simulated.ooms == result.ooms  # the training that followed ran out of nothing
    return trainer, result, searched, sizes[len(searched) :]


@pytest.fixture(scope="module")
def picked(tmp_path_factory):
    return pick_and_train(tmp_path_factory.mktemp("pick"))


@pytest.fixture(scope="module")
def true_max(picked, tmp_path_factory):
    return largest_that_trains(picked[1].batch_size, tmp_path_factory.mktemp("bisect"))


@pytest.mark.slow
def test_the_pick_is_at_most_the_true_largest_batch_and_close_to_it(picked, true_max):
    trainer, result, searched, trained = picked
    assert result.batch_size <= true_max
    assert result.batch_size >= 0.85 * true_max
    assert (result.real_steps, result.ooms) == (2, 0)
    assert searched == [2, result.predicted]
    # the Trainer trains at the new size, not at the copy it made at construction
    assert trainer.args.per_device_train_batch_size == result.batch_size
    assert trained == [result.batch_size] * 3


@pytest.mark.slow
def test_the_closeness_check_can_fail(tmp_path, true_max):
    _, result, _, _ = pick_and_train(tmp_path, fit_options={"margin": 0.5})
    assert result.batch_size < 0.85 * true_max


@pytest.mark.slow
def test_keeping_the_effective_batch_raises_accumulation(tmp_path, picked):
    _, plain, _, _ = picked
    trainer, result, _, trained = pick_and_train(
        tmp_path,
        fit_options={"keep_effective_batch": True},
        per_device_train_batch_size=256,
        gradient_accumulation_steps=2,
    )
    args = trainer.args
    assert args.gradient_accumulation_steps == result.accumulation_steps > 2
    assert args.per_device_train_batch_size == result.batch_size
    assert result.batch_size * result.accumulation_steps == 512
    # accumulating keeps the gradients alive through the next forward: never more than
    # the plain pick
    assert result.batch_size <= plain.batch_size
    assert set(trained) == {result.batch_size}
    assert len(trained) == 3 * result.accumulation_steps


@pytest.mark.slow
def test_gradient_checkpointing_is_traced_and_put_back(tmp_path, picked):
    _, plain, _, _ = picked
    _, result, _, trained = pick_and_train(tmp_path, activation_checkpointing=True)
    assert result.batch_size > plain.batch_size  # fewer activations kept
    assert result.ooms == 0
    assert set(trained) == {result.batch_size}


@pytest.mark.slow
def test_bf16_autocast_is_traced(tmp_path, picked):
    _, plain, _, _ = picked
    _, result, _, trained = pick_and_train(tmp_path, bf16=True)
    assert result.predicted > plain.predicted  # bf16 activations
    assert set(trained) == {result.batch_size}


def _state(trainer):
    model = trainer.model
    return {
        "params": [p.detach().clone() for p in model.parameters()],
        "grads": [p.grad for p in model.parameters()],
        "training": [m.training for m in model.modules()],
        "checkpointing": model.is_activation_checkpointing,
        "hooks": hasattr(model, "_require_grads_hook"),
        "optimizer": trainer.optimizer,
        "args": {
            k: v
            for k, v in trainer.args.to_dict().items()
            if k not in ("per_device_train_batch_size", "gradient_accumulation_steps")
        },
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state()[1].copy(),  # noqa: NPY002
    }


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    return a == b


def test_nothing_but_the_batch_size_changes(tmp_path):
    # Real steps on the CPU (an explicit budget): the warm-up and the verification step
    # change the weights and draw random numbers; all of it is put back.
    trainer = make_trainer(tmp_path, activation_checkpointing=True, gradient_accumulation_steps=2)
    trainer.model.eval()
    before = _state(trainer)
    result = fit_batch_size(trainer, budget=CARD, keep_effective_batch=True)
    assert result.real_steps == 2
    assert _same(before, _state(trainer))
    assert trainer.optimizer is None  # train() builds its own, as without the search
    assert trainer._train_batch_size == result.batch_size


def test_an_optimizer_passed_in_is_used_and_restored(tmp_path):
    model = gpt2()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(
        torch.zeros(1, SEQ, dtype=torch.long), labels=torch.zeros(1, SEQ, dtype=torch.long)
    ).loss.backward()
    optimizer.step()  # momentum buffers exist
    saved = copy.deepcopy(optimizer.state_dict())
    trainer = Trainer(
        model=model,
        args=TrainingArguments(str(tmp_path), report_to=[], use_cpu=True),
        train_dataset=Tokens(),
        data_collator=default_data_collator,
        optimizers=(optimizer, None),
    )
    with simulate_gpu(CARD, track=(model, optimizer)):
        result = fit_batch_size(trainer)
    assert trainer.optimizer is optimizer
    assert _same(saved, optimizer.state_dict())
    assert result.real_steps == 1  # the optimizer has state: no warm-up step


# ----------------------------------------------------------------------------- bad input


def test_a_trainer_that_is_not_one_is_refused(tmp_path):
    with pytest.raises(TypeError, match=r"needs a transformers.Trainer.*got Linear"):
        fit_batch_size(torch.nn.Linear(2, 2))


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        (
            {"budget": "12 parsecs"},
            ValueError,
            r"fit_batch_size\(budget='12 parsecs'\): cannot read",
        ),
        ({"budget": 0}, ValueError, r"budget=0\): a budget must be more than 0 bytes"),
        (
            {"margin": -0.2},
            ValueError,
            r"margin=-0.2\): Margin.fraction must be in \[0, 1\); got -0.2",
        ),
        ({"budget": "1GiB", "keep_effective_batch": "yes"}, TypeError, r"expected True or False"),
    ],
)
def test_bad_options_are_refused(tmp_path, options, error, message):
    trainer = make_trainer(tmp_path)
    with pytest.raises(error, match=message):
        fit_batch_size(trainer, **options)


def test_no_dataset_and_no_budget_are_refused_with_the_fix(tmp_path):
    trainer = make_trainer(tmp_path)
    with pytest.raises(ValueError, match=r"no budget: training runs on cpu.*pass budget="):
        fit_batch_size(trainer)
    trainer.train_dataset = None
    with pytest.raises(ValueError, match=r"no train_dataset.*pass train_dataset="):
        fit_batch_size(trainer, budget="1GiB")
