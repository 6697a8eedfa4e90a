"""The Lightning callback: real Trainer runs on CPU under a simulated card."""

from __future__ import annotations

import copy
import math
import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

pl = pytest.importorskip("lightning.pytorch")

from torchfit.integrations.lightning import BatchSizeFinder  # noqa: E402
from torchfit.memory import simulate_gpu  # noqa: E402

pytestmark = [
    # Lightning's own warnings (its pytree helper, dataloader worker hints) are not ours.
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore:.*does not have many workers.*"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*"),
]

CARD = 4 * 2**20
FEATURES = 64


def data(n=8192):
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(
        torch.randn(n, FEATURES, generator=generator),
        torch.randint(0, 10, (n,), generator=generator),
    )


class Model(pl.LightningModule):
    def __init__(self, batch_size=4, *, dataset=None):
        super().__init__()
        self.batch_size = batch_size
        self.net = torch.nn.Sequential(
            torch.nn.Linear(FEATURES, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
            torch.nn.ReLU(), torch.nn.Linear(256, 10),
        )  # fmt: skip
        self.dataset = dataset if dataset is not None else data()
        self.seen = []  # batch sizes of the real training steps

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.seen.append(len(x))
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        return DataLoader(self.dataset, batch_size=self.batch_size, shuffle=True)


def trainer(*callbacks, module=pl, **kwargs):
    options = dict(
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        accelerator="cpu",
    )
    return module.Trainer(callbacks=list(callbacks), **{**options, **kwargs})


def trains(batch_size, card=CARD, factory=Model, **kwargs):
    """Does a plain Lightning run (three steps: AdamW's state exists from the second) fit?"""
    torch.manual_seed(0)
    model = factory(batch_size)
    try:
        with simulate_gpu(card, track=model):
            trainer(**kwargs).fit(model)
    except torch.OutOfMemoryError:
        return False
    assert model.seen == [batch_size] * 3
    return True


def largest_that_trains(low, **kwargs):
    """Bisection over real runs, from a size that must train (else the pick was too big)."""
    assert trains(low, **kwargs), f"the chosen batch {low} does not train on the card"
    high = max(low + 1, math.ceil(low * 1.1))
    while trains(high, **kwargs):
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if trains(middle, **kwargs) else (low, middle)
    return low


def pick(card=CARD, factory=Model, **options):
    torch.manual_seed(0)
    model = factory()
    finder = BatchSizeFinder(**options)
    with simulate_gpu(card, track=model) as simulated:
        trainer(finder).fit(model)
    assert simulated.ooms == finder.result.ooms  # the training that followed ran out of nothing
    return model, finder


@pytest.fixture(scope="module")
def chosen():
    return pick()


@pytest.fixture(scope="module")
def true_max(chosen):
    return largest_that_trains(chosen[1].result.batch_size)


@pytest.mark.slow
def test_the_pick_is_at_most_the_true_largest_batch_and_close_to_it(chosen, true_max):
    model, finder = chosen
    result = finder.result
    assert result.batch_size <= true_max
    assert result.batch_size >= 0.85 * true_max
    assert (result.real_steps, result.ooms) == (2, 0)  # warm-up at 2, then the prediction
    # the training that followed ran at the chosen size (the last batch of an epoch may be short)
    assert model.batch_size == result.batch_size
    assert model.seen[:2] == [2, result.predicted]  # the search's two real steps
    assert model.seen[2:] == [result.batch_size] * 3


@pytest.mark.slow
def test_the_closeness_check_can_fail(true_max):
    # Keeping half the card free picks far below the largest batch: the check above sees it.
    _, finder = pick(margin=0.5)
    assert finder.result.batch_size < 0.85 * true_max


def test_a_loader_built_before_the_search_is_rebuilt():
    class Stepping(Model):
        def configure_optimizers(self):
            opt = torch.optim.AdamW(self.parameters(), lr=1e-3)
            # reads the number of batches: Lightning builds the train loader right here
            total = self.trainer.estimated_stepping_batches
            return {
                "optimizer": opt,
                "lr_scheduler": torch.optim.lr_scheduler.LinearLR(opt, total_iters=total),
            }

    model, finder = pick(factory=Stepping)
    assert model.seen[2:] == [finder.result.batch_size] * 3


class DataModule(pl.LightningDataModule):
    def __init__(self, batch_size=4):
        super().__init__()
        self.save_hyperparameters()
        self.batch_size = batch_size
        self.dataset = data()  # host memory: made outside the simulated card

    def train_dataloader(self):
        return DataLoader(self.dataset, batch_size=self.batch_size)


class Bare(Model):
    def __init__(self, batch_size=None):
        super().__init__()
        del self.batch_size

    def train_dataloader(self):  # pragma: no cover - the datamodule's is used
        raise AssertionError


def test_the_size_is_set_where_lightning_sets_it():
    from lightning.pytorch.utilities.parsing import lightning_getattr

    model, datamodule = Bare(), DataModule()
    finder = BatchSizeFinder()
    with simulate_gpu(CARD, track=model):
        trainer(finder).fit(model, datamodule=datamodule)
    size = finder.result.batch_size
    assert datamodule.batch_size == datamodule.hparams.batch_size == size
    assert lightning_getattr(model, "batch_size") == size
    assert not hasattr(model, "batch_size")
    assert model.seen[2:] == [size] * 3


def _state(model, optimizer):
    return {
        "params": [p.detach().clone() for p in model.parameters()],
        "grads": [p.grad for p in model.parameters()],
        "training": [m.training for m in model.modules()],
        "optimizer": copy.deepcopy(optimizer.state_dict()),
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


class Snap(pl.Callback):
    def on_fit_start(self, trainer, module):
        self.state = _state(module, trainer.optimizers[0])


def test_model_optimizer_and_rngs_are_left_as_they_were():
    # Real steps on the CPU (an explicit budget, no simulated card): the warm-up and the
    # verification step change weights, AdamW's state and the RNGs, and all is put back.
    torch.manual_seed(0)
    model, finder = Model(), BatchSizeFinder(budget=CARD)
    before, after = Snap(), Snap()
    trainer(before, finder, after, max_steps=1).fit(model)
    assert finder.result.real_steps == 2
    assert before.state["grads"] == [None] * 6
    assert not before.state["optimizer"]["state"]
    assert _same(before.state, after.state)


def test_the_trainers_precision_is_traced(chosen):
    # bf16 autocast keeps the activations of the Linear layers in bf16: more fit.
    torch.manual_seed(0)
    model, finder = Model(), BatchSizeFinder()
    with simulate_gpu(CARD, track=model):
        trainer(finder, precision="bf16-mixed").fit(model)
    assert finder.result.predicted > chosen[1].result.predicted
    assert model.seen[-3:] == [finder.result.batch_size] * 3


def test_manual_optimization_and_gradient_accumulation_are_probed():
    class Manual(Model):
        def __init__(self, batch_size=4):
            super().__init__(batch_size)
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            x, y = batch
            self.seen.append(len(x))
            opt = self.optimizers()
            loss = torch.nn.functional.cross_entropy(self.net(x), y)
            self.manual_backward(loss)
            opt.step()
            opt.zero_grad()
            self.log("loss", loss)

    model, finder = pick(factory=Manual)
    assert finder.result.ooms == 0
    assert model.seen[2:] == [finder.result.batch_size] * 3
    # accumulating keeps the gradients alive through the next forward: a smaller pick
    torch.manual_seed(0)
    accumulating, finder2 = Model(), BatchSizeFinder()
    with simulate_gpu(CARD, track=accumulating):
        trainer(finder2, accumulate_grad_batches=2, max_steps=2).fit(accumulating)
    assert finder2.result.ooms == 0
    assert finder2.result.batch_size < finder.result.batch_size


def test_a_step_that_cannot_be_traced_falls_back_to_real_steps():
    class DataDependent(Model):
        def training_step(self, batch, batch_idx):
            x, y = batch
            self.seen.append(len(x))
            keep = y >= 0  # a boolean mask: the output's shape depends on the data
            return torch.nn.functional.cross_entropy(self.net(x[keep]), y[keep])

    with pytest.warns(RuntimeWarning, match="could not trace the training step"):
        model, finder = pick(factory=DataDependent)
    assert finder.result.predicted is None
    assert model.seen[-3:] == [finder.result.batch_size] * 3
    assert finder.result.batch_size > 4  # probed upward from the module's size


def test_pytorch_lightning_trainers_take_the_same_callback():
    pytorch_lightning = pytest.importorskip("pytorch_lightning")

    class Classic(pytorch_lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.batch_size = 4
            self.net = torch.nn.Linear(FEATURES, 10)
            self.dataset = data()

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            return DataLoader(self.dataset, batch_size=self.batch_size)

    model, finder = Classic(), BatchSizeFinder()
    assert isinstance(finder, pytorch_lightning.Callback)
    assert isinstance(finder, pl.Callback)
    with simulate_gpu("1MiB", track=model):
        trainer(finder, module=pytorch_lightning).fit(model)
    assert model.batch_size == finder.result.batch_size > 4


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        (
            {"budget": "12 parsecs"},
            ValueError,
            r"BatchSizeFinder\(budget='12 parsecs'\): cannot read",
        ),
        ({"budget": -1}, ValueError, r"budget=-1\): a budget must be more than 0 bytes"),
        ({"budget": True}, TypeError, r"budget=True\): expected bytes, a size such as '8GiB'"),
        ({"budget": [8]}, TypeError, r"budget=\[8\]\): expected bytes"),
        ({"margin": 1.5}, ValueError, r"margin=1.5\): Margin.fraction must be in \[0, 1\)"),
        ({"margin": "x"}, TypeError, r"margin='x'\): margin must be a fraction such as 0.1"),
        (
            {"batch_limit": 0},
            ValueError,
            r"batch_limit=0\): batch_limit must be >= 1; got 0",
        ),
        ({"batch_limit": 2.5}, TypeError, r"batch_limit=2.5\): expected a whole number"),
        ({"batch_arg_name": "batch size"}, TypeError, r"batch_arg_name='batch size'\): expected"),
    ],
)
def test_bad_options_are_refused_at_construction(options, error, message):
    with pytest.raises(error, match=message):
        BatchSizeFinder(**options)


def test_a_module_without_the_attribute_is_refused_with_the_fix():
    class NoSize(Model):
        def __init__(self):
            super().__init__()
            del self.batch_size

    with pytest.raises(ValueError, match=r"NoSize has no attribute 'bs'.*self.bs = \.\.\."):
        trainer(BatchSizeFinder(batch_arg_name="bs")).fit(NoSize())


def test_a_batch_size_that_is_not_a_number_is_refused():
    model = Model()
    model.batch_size = None
    with pytest.raises(ValueError, match=r"batch_size is None; expected a whole number >= 1"):
        trainer(BatchSizeFinder("4MiB")).fit(model)


def test_no_budget_on_a_cpu_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"no budget: training runs on cpu.*pass budget="):
        trainer(BatchSizeFinder()).fit(Model())


def test_a_loader_that_ignores_the_attribute_is_refused():
    class Fixed(Model):
        def train_dataloader(self):
            return DataLoader(self.dataset, batch_size=32)

    with pytest.raises(ValueError, match=r"batch_size=32 while batch_size is 4.*self.batch_size"):
        trainer(BatchSizeFinder("4MiB")).fit(Fixed())


def test_a_loader_passed_to_fit_is_refused():
    model = Model()
    with pytest.raises(ValueError, match=r"passed to trainer.fit\(\.\.\.\) already built"):
        trainer(BatchSizeFinder("4MiB")).fit(model, train_dataloaders=model.train_dataloader())


def test_an_explicit_budget_works_without_a_simulated_card():
    # On a CPU a real step cannot run out of memory: the prediction is taken as verified.
    model, finder = Model(), BatchSizeFinder(budget="4MiB")
    trainer(finder, max_steps=1).fit(model)
    assert 4 < finder.result.batch_size == model.batch_size
    assert finder.result.budget == 4 * 2**20
