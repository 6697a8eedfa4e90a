"""Auto batch size, side by side: torchfit vs accelerate vs a Lightning-style search.

Every method runs on the CPU under a `simulate_gpu` card (each op whose new outputs would
take the live bytes past the card raises a real ``torch.OutOfMemoryError``), for a few
real architectures trained with AdamW (a fresh optimizer: its state appears in the
first step). For each (model, card):

* true maximum: the largest batch for which a fresh copy runs four steps (one that
  creates the optimizer state, then three in the steady state) without an OOM, found by
  bisection around a first guess, with the three sizes above it checked to fail too;
* accelerate: the real ``accelerate.utils.find_executable_batch_size`` (start 128, x0.9
  per OOM) around a "training loop" of three steps that starts from the original model
  and optimizer (accelerate's documented pattern builds them inside the loop);
* Lightning power / binsearch: ``BatchSizeFinder``'s published rules re-implemented here
  (Lightning is not installed): start 2, three steps per trial, double until OOM, then
  halve (power) or bisect (binsearch); training state carries over between trials and is
  restored at the end, except that the gradients a failed trial left are dropped;
* torchfit, predicted from two measured steps: ``measure_step`` (the real CPU
  allocator) at two sizes, the line solved within the card, then ``find_batch_size``;
  the measuring steps count as real steps;
* torchfit, predicted from two steps measured on an unlimited simulated card (the same
  accounting as the card, as ``max_memory_allocated`` is on CUDA);
* torchfit, predicted by ``torchfit.memory.trace`` (fake tensors: no real step);
* torchfit, no prediction: start at 2 and probe upward from what each step measured.

Every pick is then checked: three steady-state steps at the chosen size on the card.
Columns: chosen / true maximum, real steps (search + predictor), OOMs hit, whether
the pick survives the steady state, and wall time. Regenerate with
``python benchmarks/batch_size.py`` (``--quick``: one card per model).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import gc
import math
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from torchfit._core.step import Mode, run_step
from torchfit._core.units import format_bytes
from torchfit.memory.batch import find_batch_size, is_oom, max_batch_size, simulate_gpu
from torchfit.memory.batch.probe import Snapshot
from torchfit.memory.measure import measure_step
from torchfit.memory.result import AffineEstimate, MemoryEstimate

MiB = 2**20
STEPS_PER_TRIAL = 3  # Lightning's BatchSizeFinder default (steps_per_trial=3)


@dataclasses.dataclass
class Task:
    name: str
    build: Callable[[], nn.Module]
    batch: Callable[[int], Any]
    cards: tuple[int, ...]  # bytes


def _mlp() -> nn.Module:
    return nn.Sequential(
        nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    )


def _cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 8 * 8, 10),
    )  # fmt: skip


SEQ = 64


def _gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel  # noqa: PLC0415 - optional

    config = GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=2000, n_positions=SEQ)
    return GPT2LMHeadModel(config)


def _tokens(batch_size: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 2000, (batch_size, SEQ))
    return {"input_ids": ids, "labels": ids}


TASKS = [
    Task("MLP 784-512-512-10", _mlp, lambda b: torch.randn(b, 784), (16 * MiB, 32 * MiB)),
    Task("CNN 2 conv + BN", _cnn, lambda b: torch.randn(b, 3, 32, 32), (64 * MiB, 160 * MiB)),
    Task(f"GPT-2 2x128, seq {SEQ}", _gpt2, _tokens, (128 * MiB, 512 * MiB)),
]


class Counter:
    """Counts real steps (and OOMs) across a method's whole run."""

    def __init__(self, model: nn.Module, opt: torch.optim.Optimizer, task: Task) -> None:
        self.model, self.opt, self.task = model, opt, task
        self.steps = 0
        self.ooms = 0

    def step(self, batch_size: int) -> None:
        self.steps += 1
        batch = self.task.batch(batch_size)
        try:
            run_step(self.model, batch, mode=Mode.TRAIN, optimizer=self.opt)
        except Exception as error:
            if is_oom(error):
                self.ooms += 1
            raise


def fresh(task: Task, seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = task.build()
    model.train()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def fits(task: Task, card: int, batch_size: int) -> bool:
    """A fresh copy runs the state-creating step plus three steady steps on the card."""
    model, opt = fresh(task)
    counter = Counter(model, opt, task)
    try:
        with simulate_gpu(card, track=(model, opt)):
            for _ in range(1 + STEPS_PER_TRIAL):
                counter.step(batch_size)
    except torch.OutOfMemoryError:
        return False
    finally:
        del model, opt, counter
        gc.collect()
    return True


def true_maximum(task: Task, card: int, guess: int) -> int:
    """Bisection in a bracket grown around ``guess``; the three sizes above must fail."""
    step = max(guess // 32, 1)
    size = max(guess, 1)
    if fits(task, card, size):
        lo, hi = size, size + step
        while fits(task, card, hi):
            lo, hi, step = hi, hi + 2 * step, 2 * step
    else:
        lo, hi = max(size - step, 0), size
        while lo > 0 and not fits(task, card, lo):
            hi, lo, step = lo, max(lo - 2 * step, 0), 2 * step
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(task, card, mid) else (lo, mid)
    if any(fits(task, card, lo + k) for k in (1, 2, 3)):
        raise RuntimeError(f"{task.name}: memory is not monotone in the batch around {lo}")
    return lo


# -- methods ------------------------------------------------------------------------------


@dataclasses.dataclass
class Outcome:
    chosen: int
    steps: int
    predictor_steps: int
    ooms: int
    seconds: float
    note: str = ""


def run_accelerate(counter: Counter, snapshot: Snapshot) -> int:
    from accelerate.utils import find_executable_batch_size  # noqa: PLC0415 - optional

    @find_executable_batch_size(starting_batch_size=128)
    def train(batch_size: int) -> int:
        # accelerate's documented pattern builds the model and optimizer inside the loop,
        # so an attempt never inherits what a failed one left: restore them.
        snapshot.restore()
        for _ in range(STEPS_PER_TRIAL):
            counter.step(batch_size)
        return batch_size

    chosen: int = train()
    return chosen


def _lightning_trial(counter: Counter, batch_size: int) -> bool:
    try:
        for _ in range(STEPS_PER_TRIAL):
            counter.step(batch_size)
    except torch.OutOfMemoryError:
        # Generous to the baseline: drop the gradients a failed backward left, so the
        # next trial only pays for its own size.
        counter.model.zero_grad(set_to_none=True)
        gc.collect()  # Lightning's garbage_collection_cuda
        return False
    return True


def run_lightning_power(counter: Counter, max_trials: int = 25) -> int:
    """Lightning's _run_power_scaling: double from 2 until an OOM, then halve and stop."""
    size, any_success = 2, False
    for _ in range(max_trials):
        if _lightning_trial(counter, size):
            any_success, size = True, size * 2
        else:
            size //= 2
            if any_success:
                break
    return size


def run_lightning_binsearch(counter: Counter, max_trials: int = 25) -> int:
    """Lightning's _run_binary_scaling: double from 2 until an OOM, then bisect."""
    size, low, high, count = 2, 1, None, 0
    while True:
        if _lightning_trial(counter, size):
            count += 1
            if count > max_trials:
                break
            low = size
            if high is not None:
                if high - low <= 1:
                    break
                size = (high + low) // 2
            else:
                size *= 2
        else:
            high = size
            size = (high + low) // 2
            if high - low <= 1:
                break
    return size


def _line(b1: int, p1: int, b2: int, p2: int) -> AffineEstimate:
    per = max(math.ceil((p2 - p1) / (b2 - b1)), 1)
    return AffineEstimate(
        MemoryEstimate(weights=max(p1 - per * b1, 0)), MemoryEstimate(activations=per)
    )


def _fit(peak_at: Callable[[int], int], card: int) -> AffineEstimate:
    """Measure at 8, 16, 32, ... until two consecutive secants agree within 10% and the
    line's answer for the card is within 8x of the largest size measured.

    At small batches the peak is often the optimizer step, which grows only by the input
    batch: points there give a slope several times too small (the MLP below: 3 KiB per
    sample, its input, against ~11 KiB once activations set the peak), and agree with
    each other. Extrapolating by at most 8x keeps the measurements near the answer.
    """
    peaks = {8: peak_at(8), 16: peak_at(16)}
    b = 16
    while True:
        peaks[2 * b] = peak_at(2 * b)
        low = (peaks[b] - peaks[b // 2]) / (b // 2)
        high = (peaks[2 * b] - peaks[b]) / b
        line = _line(b, peaks[b], 2 * b, peaks[2 * b])
        near = max_batch_size(line, card, margin=0.0) <= 16 * b
        if high > 0 and abs(high - low) <= 0.1 * high and near:
            return line
        b *= 2


def measured_line(task: Task, model: nn.Module, card: int) -> tuple[AffineEstimate, int]:
    """measure_step (a warm-up step and a measured step on a copy, real CPU allocator)."""
    calls = []

    def peak_at(b: int) -> int:
        calls.append(b)
        return measure_step(model, task.batch(b), optimizer="adamw", device="cpu").peak

    return _fit(peak_at, card), 2 * len(calls)


def simulated_line(task: Task, model: nn.Module, card: int) -> tuple[AffineEstimate, int]:
    """Steady-state peaks seen by an unlimited simulated card (one state-creating step)."""
    work = copy.deepcopy(model)
    opt = torch.optim.AdamW(work.parameters(), lr=1e-3)
    counter = Counter(work, opt, task)
    counter.step(8)  # creates the optimizer state

    def peak_at(b: int) -> int:
        with simulate_gpu(2**50, track=(work, opt)) as card_:
            counter.step(b)
        return card_.peak

    return _fit(peak_at, card), counter.steps


def traced(task: Task, model: nn.Module) -> Callable[[int], MemoryEstimate]:
    from torchfit.memory.tracing.tracer import trace  # noqa: PLC0415 - may not exist yet

    def predict(batch_size: int) -> MemoryEstimate:
        return trace(model, task.batch(batch_size), optimizer="adamw", device="cpu")

    return predict


def run_method(task: Task, card: int, method: str) -> Outcome:
    model, opt = fresh(task)
    counter = Counter(model, opt, task)
    snapshot = Snapshot((model, opt))
    predictor_steps, note = 0, ""
    started = time.perf_counter()
    if method == "torchfit: measure_step line":
        predict: Any
        predict, predictor_steps = measured_line(task, model, card)
    elif method == "torchfit: simulated-card line":
        predict, predictor_steps = simulated_line(task, model, card)
    elif method == "torchfit: trace":
        predict = traced(task, model)
    with simulate_gpu(card, track=(model, opt)):
        if method == "accelerate find_executable_batch_size":
            chosen = run_accelerate(counter, snapshot)
        elif method == "Lightning-style power":
            chosen = run_lightning_power(counter)
        elif method == "Lightning-style binsearch":
            chosen = run_lightning_binsearch(counter)
        elif method == "torchfit: no prediction, probe up":
            search = find_batch_size(counter.step, start=2, probe_upward=True, restore=(model, opt))
            result = search()
            chosen = result.batch_size
        else:
            search = find_batch_size(counter.step, predict=predict, restore=(model, opt))
            result = search()
            chosen = result.batch_size
            note = f"predicted {result.predicted}"
    seconds = time.perf_counter() - started
    snapshot.restore()
    return Outcome(chosen, counter.steps, predictor_steps, counter.ooms, seconds, note)


METHODS = [
    "accelerate find_executable_batch_size",
    "Lightning-style power",
    "Lightning-style binsearch",
    "torchfit: measure_step line",
    "torchfit: simulated-card line",
    "torchfit: trace",
    "torchfit: no prediction, probe up",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one card per model")
    parser.add_argument("--tasks", default="", help="comma-separated name prefixes")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for task in TASKS:
        if args.tasks and not any(task.name.startswith(p) for p in args.tasks.split(",")):
            continue
        for card in task.cards[:1] if args.quick else task.cards:
            model, _ = fresh(task)
            guess_line, _ = simulated_line(task, model, card)
            guess = max_batch_size(guess_line, card, margin=0.0)
            best = true_maximum(task, card, guess)
            print(f"# {task.name} on a {format_bytes(card)} card: true maximum {best}", flush=True)
            for method in METHODS:
                try:
                    out = run_method(task, card, method)
                except ImportError as error:
                    print(f"  {method}: skipped ({error})", flush=True)
                    continue
                steady = fits_steady(task, card, out.chosen)
                rows.append((task.name, card, best, method, out, steady))
                print(f"  {method}: {out}  steady={steady}", flush=True)
    print()
    print(table(rows))


def fits_steady(task: Task, card: int, batch_size: int) -> bool:
    return batch_size > 0 and fits(task, card, batch_size)


def table(rows: list[tuple[str, int, int, str, Outcome, bool]]) -> str:
    head = (
        "| model | card | true max | method | chosen | chosen / max | real steps "
        "(search + predictor) | OOMs | steady state fits | wall s |"
    )
    lines = [head, "|" + "---|" * 10]
    for name, card, best, method, out, steady in rows:
        ratio = out.chosen / best if best else float("nan")
        steps = f"{out.steps + out.predictor_steps} ({out.steps} + {out.predictor_steps})"
        lines.append(
            f"| {name} | {format_bytes(card)} | {best} | {method} | {out.chosen} | "
            f"{ratio:.1%} | {steps} | {out.ooms} | {'yes' if steady else '**no**'} | "
            f"{out.seconds:.1f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
