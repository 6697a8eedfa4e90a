"""Batch size in Lightning and the Trainer: each framework's own finder vs torchfit's.

Everything runs on the CPU under a `simulate_gpu` card (each op whose new outputs would
take the live bytes past the card raises a real ``torch.OutOfMemoryError`` with CUDA's
message, which both frameworks recognize as an OOM). For each framework, one model and
one card:

* true maximum: the largest batch for which a plain run of the framework (a fresh
  model, three training steps: AdamW's state exists from the second) fits the card,
  found by bisection over such runs;
* Lightning: ``lightning.pytorch.callbacks.BatchSizeFinder`` in ``power`` and
  ``binsearch`` mode (defaults: start 2, three steps per trial, 5% margin in
  binsearch), and ``torchfit.integrations.lightning.BatchSizeFinder``; the real
  training steps and OOMs are counted from the start of ``fit`` until the finder
  returns (the module counts its ``training_step`` calls; the card counts OOMs);
* transformers: ``TrainingArguments(auto_find_batch_size=True)`` starting from
  ``per_device_train_batch_size`` (accelerate's ``find_executable_batch_size``: the
  whole training restarts at x0.9 after each OOM), and
  ``torchfit.integrations.transformers.fit_batch_size``; for auto_find_batch_size the
  steps counted are those of the attempts that ran out of memory plus the first step
  of the attempt that did not (the answer is known once a step ran), and the time is
  until that step ended.

Then the framework trains three steps at the chosen size on the same card ("training
runs"). Regenerate with ``python benchmarks/integrations.py`` (about 3 minutes on 2
shared CPU cores).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from torchfit._core.units import format_bytes
from torchfit.memory import simulate_gpu

MiB = 2**20
STEPS = 3


@dataclasses.dataclass
class Outcome:
    chosen: int
    steps: int
    ooms: int
    seconds: float
    trains: bool = False


def largest(fits: Callable[[int], bool], guess: int) -> int:
    """Bisection over real runs in a bracket grown (or shrunk) around ``guess``."""
    low, high = guess, max(guess + 1, math.ceil(guess * 1.1))
    if fits(low):
        while fits(high):
            low, high = high, 2 * high
    else:
        high = low
        while low > 1 and not fits(low):
            high, low = low, low // 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


# ---------------------------------------------------------------------------- Lightning

SIDE, IMAGES = 28, 8192
LIGHTNING_CARD = 64 * MiB
CARDS: list[Any] = []  # the card of the run in progress


def lightning_run(batch_size: int, callbacks: list[Any], *, max_steps: int = STEPS) -> Any:
    import lightning.pytorch as pl  # noqa: PLC0415 - optional

    torch.manual_seed(0)
    images = TensorDataset(torch.randn(IMAGES, 1, SIDE, SIDE), torch.randint(0, 10, (IMAGES,)))

    class Classifier(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.batch_size = batch_size
            self.net = nn.Sequential(
                nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                nn.Flatten(), nn.Linear(32 * (SIDE // 4) ** 2, 10),
            )  # fmt: skip
            self.seen: list[int] = []

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:  # noqa: ARG002
            x, y = batch
            self.seen.append(len(x))
            loss = nn.functional.cross_entropy(self.net(x), y)
            self.log("loss", loss)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

        def train_dataloader(self) -> DataLoader:
            return DataLoader(images, batch_size=self.batch_size, shuffle=True)

    model = Classifier()
    trainer = pl.Trainer(
        max_steps=max_steps,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tempfile.mkdtemp(),
        accelerator="cpu",
    )
    with simulate_gpu(LIGHTNING_CARD, track=model) as card:
        CARDS[:] = [card]  # not an attribute of the module: traces deep-copy the module
        trainer.fit(model)
    return model


def lightning_fits(batch_size: int) -> bool:
    try:
        model = lightning_run(batch_size, [])
    except torch.OutOfMemoryError:
        return False
    return model.seen == [batch_size] * STEPS


def lightning_finder(make: Callable[[], Any]) -> Outcome:
    import lightning.pytorch as pl  # noqa: PLC0415 - optional

    class Start(pl.Callback):
        # setup runs before every on_fit_start (Lightning moves its own finder first)
        def setup(self, _trainer: Any, _module: Any, stage: str | None = None) -> None:  # noqa: ARG002
            self.t0 = time.perf_counter()

    class End(pl.Callback):
        def on_fit_start(self, _trainer: Any, module: Any) -> None:
            module.searched = (len(module.seen), CARDS[0].ooms, time.perf_counter())

    start, finder = Start(), make()
    try:
        model = lightning_run(2, [start, finder, End()])
    except torch.OutOfMemoryError:
        return Outcome(chosen=-1, steps=-1, ooms=-1, seconds=float("nan"))
    steps, ooms, t1 = model.searched
    chosen = model.batch_size
    trained = model.seen[steps:]
    return Outcome(chosen, steps, ooms, t1 - start.t0, trains=trained == [chosen] * STEPS)


# ------------------------------------------------------------------------- transformers

SEQ, ROWS = 64, 4096
HF_CARD = 128 * MiB
HF_START = 256  # auto_find_batch_size only shrinks: start well above what fits


def hf_trainer(batch_size: int, **options: Any) -> Any:
    from transformers import (  # noqa: PLC0415 - optional
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainingArguments,
        default_data_collator,
    )

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2, n_embd=128, n_head=4, vocab_size=2000, n_positions=SEQ,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    model = GPT2LMHeadModel(config)
    rows = torch.randint(0, 2000, (ROWS, SEQ))
    args = TrainingArguments(
        tempfile.mkdtemp(),
        per_device_train_batch_size=batch_size,
        max_steps=STEPS,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        **options,
    )
    dataset = [{"input_ids": row, "labels": row} for row in rows]
    trainer = Trainer(
        model=model, args=args, train_dataset=dataset, data_collator=default_data_collator
    )
    trainer.seen = []

    def count(_module: Any, _args: Any, kwargs: Any) -> None:
        if type(kwargs["input_ids"]) is torch.Tensor:  # a real step, not a traced one
            trainer.seen.append(kwargs["input_ids"].shape[0])

    model.register_forward_pre_hook(count, with_kwargs=True)
    return trainer


def hf_fits(batch_size: int) -> bool:
    trainer = hf_trainer(batch_size)
    try:
        with simulate_gpu(HF_CARD, track=trainer.model):
            trainer.train()
    except torch.OutOfMemoryError:
        return False
    return trainer.seen == [batch_size] * STEPS


def hf_auto_find(start: int) -> Outcome:
    from transformers import TrainerCallback  # noqa: PLC0415 - optional

    trainer = hf_trainer(start, auto_find_batch_size=True)
    attempts: list[tuple[int, int]] = []  # (steps before the attempt, OOMs before it)
    first_step: dict[int, float] = {}

    class Attempts(TrainerCallback):
        def on_train_begin(self, *_args: Any, **_kwargs: Any) -> None:
            attempts.append((len(trainer.seen), card.ooms))

        def on_step_end(self, *_args: Any, **_kwargs: Any) -> None:
            first_step.setdefault(len(attempts), time.perf_counter())

    trainer.add_callback(Attempts())
    with simulate_gpu(HF_CARD, track=trainer.model) as card:
        t0 = time.perf_counter()
        trainer.train()
    steps_before, ooms = attempts[-1]
    chosen = trainer._train_batch_size  # noqa: SLF001 - where accelerate's answer lives
    trained = trainer.seen[steps_before:]
    return Outcome(
        chosen,
        steps_before + 1,
        ooms,
        first_step[len(attempts)] - t0,
        trains=trained == [chosen] * STEPS,
    )


def hf_torchfit() -> Outcome:
    from torchfit.integrations.transformers import fit_batch_size  # noqa: PLC0415

    trainer = hf_trainer(8)
    with simulate_gpu(HF_CARD, track=trainer.model) as card:
        t0 = time.perf_counter()
        result = fit_batch_size(trainer)
        seconds = time.perf_counter() - t0
        steps, ooms = len(trainer.seen), card.ooms
        try:
            trainer.train()
            trains = trainer.seen[steps:] == [result.batch_size] * STEPS
        except torch.OutOfMemoryError:
            trains = False
    return Outcome(result.batch_size, steps, ooms, seconds, trains=trains)


# --------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")  # the frameworks' deprecation and worker notices
    from lightning.pytorch import callbacks  # noqa: PLC0415 - optional

    from torchfit.integrations.lightning import BatchSizeFinder  # noqa: PLC0415

    rows = []
    finders = {
        "Lightning BatchSizeFinder(mode='power')": lambda: callbacks.BatchSizeFinder("power"),
        "Lightning BatchSizeFinder(mode='binsearch')": lambda: callbacks.BatchSizeFinder(
            "binsearch"
        ),
        "torchfit BatchSizeFinder()": BatchSizeFinder,
    }
    outcomes = {name: lightning_finder(make) for name, make in finders.items()}
    best = largest(lightning_fits, outcomes["torchfit BatchSizeFinder()"].chosen)
    model = f"CNN 2 conv, 1x{SIDE}x{SIDE}, AdamW ({format_bytes(LIGHTNING_CARD)} card)"
    rows += [("Lightning", model, best, name, out) for name, out in outcomes.items()]
    with contextlib.redirect_stdout(None):  # the Trainer prints its metrics
        outcomes = {
            f"auto_find_batch_size=True (from {HF_START})": hf_auto_find(HF_START),
            "auto_find_batch_size=True (from 8, the default)": hf_auto_find(8),
            "torchfit fit_batch_size(trainer)": hf_torchfit(),
        }
        best = largest(hf_fits, outcomes["torchfit fit_batch_size(trainer)"].chosen)
    model = f"GPT-2 2x128, seq {SEQ}, AdamW fused ({format_bytes(HF_CARD)} card)"
    rows += [("transformers Trainer", model, best, name, out) for name, out in outcomes.items()]
    print(table(rows))


def table(rows: list[tuple[str, str, int, str, Outcome]]) -> str:
    head = (
        "| framework | model | true max | finder | chosen | chosen / max | real steps | OOMs "
        "| training runs | search s |"
    )
    lines = [head, "|" + "---|" * 10]
    for framework, model, best, name, out in rows:
        lines.append(
            f"| {framework} | {model} | {best} | {name} | {out.chosen} | "
            f"{out.chosen / best:.1%} | {out.steps} | {out.ooms} | "
            f"{'yes' if out.trains else '**no**'} | {out.seconds:.1f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
