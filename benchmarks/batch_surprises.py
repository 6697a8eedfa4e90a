"""Out-of-memory errors the memory model did not foresee: torchfit vs accelerate's back-off.

Each scenario is a fake training step run on the CPU under a `simulate_gpu` card: it
holds ``layers`` activation chunks of ``batch * per_sample`` bytes in all, and its
prediction (the `AffineEstimate` given to ``find_batch_size(predict=...)``) is wrong in
one way:

* ``30% more``: the step really holds 1.3x the predicted activations (the card sees it);
* ``other process``: a quarter of the card is held by memory the meter does not see (a
  fake OOM once the step's own bytes pass the rest), as another process on a real GPU;
* ``fragmentation``: allocations fail once 80% of the card is taken, as when the
  caching allocator's free blocks are too scattered to serve a request;
* ``cuDNN``: the step raises cuDNN's ``CUDNN_STATUS_NOT_SUPPORTED`` above 60% of the
  predicted size (a kernel with no algorithm for that batch), memory unchanged;
* ``exact``: the prediction is right (the control).

torchfit's ``find_batch_size`` starts at the predicted size; accelerate's
``find_executable_batch_size`` (x0.9 per OOM) starts at the same size, so both see the
same card and the same step. The true maximum is found by bisection over the step
itself. Printed: OOMs, steps, and the final size over the true maximum. Ratios, not
timings: the figures do not depend on the machine. Run with
``python benchmarks/batch_surprises.py``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch
from accelerate.utils import find_executable_batch_size

from torchfit import format_bytes
from torchfit.memory import MemoryEstimate, find_batch_size, max_batch_size, simulate_gpu
from torchfit.memory.result import AffineEstimate

CARD = 64 * 2**20
WEIGHTS = 4 * 2**20
PER_SAMPLE = 14 * 2**10  # predicted activation bytes per sample
LAYERS = 8


@dataclasses.dataclass(frozen=True)
class Scenario:
    """A fake step whose real memory differs from the prediction in one way."""

    name: str
    ratio: float = 1.0  # real activations over predicted
    hidden: float = 0.0  # share of the card held out of the meter's sight
    refuse_above: float | None = None  # share of the predicted size above which cuDNN refuses

    def step(self, batch_size: int, predicted: int) -> None:
        """One "training step": activations layer by layer, then freed."""
        from torchfit.memory.batch.simulate import active_simulator  # noqa: PLC0415

        card = active_simulator()
        assert card is not None
        chunk = math.ceil(batch_size * PER_SAMPLE * self.ratio / LAYERS / 4)
        held = []
        for _ in range(LAYERS):
            if self.hidden and card.live + 4 * chunk > card.capacity * (1 - self.hidden):
                raise torch.OutOfMemoryError(
                    f"CUDA out of memory. Tried to allocate {format_bytes(4 * chunk)}. (hidden)"
                )
            held.append(torch.empty(chunk))
        if self.refuse_above is not None and batch_size > self.refuse_above * predicted:
            raise RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear")
        del held


SCENARIOS = (
    Scenario("30% more", ratio=1.3),
    Scenario("other process", hidden=0.25),
    Scenario("fragmentation", hidden=0.2),
    Scenario("cuDNN", refuse_above=0.6),
    Scenario("exact"),
)


def prediction() -> AffineEstimate:
    """What the memory model says: the weights, plus the predicted activations per sample."""
    return AffineEstimate(MemoryEstimate(weights=WEIGHTS), MemoryEstimate(activations=PER_SAMPLE))


def runs(step: Callable[[int], None], batch_size: int) -> bool:
    """Whether ``step(batch_size)`` completes on a fresh card holding the weights."""
    weights = torch.empty(WEIGHTS // 4)
    try:
        with simulate_gpu(CARD, track=weights):
            step(batch_size)
    except (torch.OutOfMemoryError, RuntimeError):
        return False
    return True


def true_max(step: Callable[[int], None], upper: int) -> int:
    """The largest size that runs (bisection; memory is monotone in the batch)."""
    good, bad = 0, upper + 1
    while bad - good > 1:
        middle = (good + bad) // 2
        good, bad = (middle, bad) if runs(step, middle) else (good, middle)
    return good


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How one finder did on one scenario."""

    ooms: int
    steps: int
    final: int


def with_torchfit(scenario: Scenario) -> tuple[Outcome, int]:
    """``find_batch_size`` from the prediction; returns the outcome and the predicted size."""
    weights = torch.empty(WEIGHTS // 4)
    with simulate_gpu(CARD, track=weights) as card:
        predicted = max_batch_size(prediction(), card)
        result = find_batch_size(
            lambda b: scenario.step(b, predicted), predict=prediction(), budget=card
        )()
    assert result.predicted == predicted
    return Outcome(result.ooms, result.real_steps, result.batch_size), predicted


def with_accelerate(scenario: Scenario, start: int, predicted: int) -> Outcome:
    """accelerate's decorator from ``start``, on the same card and step."""
    weights = torch.empty(WEIGHTS // 4)
    counts = {"steps": 0, "ooms": 0}

    @find_executable_batch_size(starting_batch_size=start)
    def loop(batch_size: int) -> int:
        counts["steps"] += 1
        try:
            scenario.step(batch_size, predicted)
        except RuntimeError:
            counts["ooms"] += 1
            raise
        return batch_size

    with simulate_gpu(CARD, track=weights):
        final = loop()
    return Outcome(counts["ooms"], counts["steps"], final)


def main() -> None:
    """Print one row per scenario."""
    print(
        f"{'scenario':<14} {'predicted':>9} {'true max':>8}  "
        f"{'torchfit OOMs/steps final/max':>30}  {'accelerate OOMs/steps final/max':>32}"
    )
    for scenario in SCENARIOS:
        ours, predicted = with_torchfit(scenario)
        theirs = with_accelerate(scenario, predicted, predicted)
        best = true_max(lambda b, s=scenario, p=predicted: s.step(b, p), 2 * predicted)
        print(
            f"{scenario.name:<14} {predicted:>9} {best:>8}  "
            f"{ours.ooms:>10} / {ours.steps:<3} {ours.final / best:>12.3f}   "
            f"{theirs.ooms:>10} / {theirs.steps:<3} {theirs.final / best:>12.3f}"
        )


if __name__ == "__main__":
    main()
