"""What both integrations share: checked options, sample batches, and the search itself.

The search is `torchfit.memory.find_batch_size` with a predictor that traces the
framework's own step (`torchfit.memory.trace_step`: fake tensors, no memory used): the
predicted size is verified with a real step, and an out-of-memory error backs off. A
step that cannot be traced (an op whose output shape depends on the data, a kernel
without a fake implementation) falls back, with a warning, to a search by real steps
that starts at the current batch size and probes upward. Every RNG is put back at the
end, also the draws the predictor's sample batches made.
"""

from __future__ import annotations

import dataclasses
import itertools
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from torchfit._core.rng import kept_rng
from torchfit.memory import GPU, MemoryEstimate, find_batch_size
from torchfit.memory.batch import BatchSizeResult, Margin, SimulatedGPU

__all__ = [
    "Samples",
    "SearchPlan",
    "check_search_options",
    "move_to",
    "run_search",
]


#: How many samples at the start of a dataset are scanned for the largest one.
SCAN = 1024


def check_search_options(
    owner: str,
    *,
    budget: Any,
    margin: Any,
    batch_limit: Any = None,
) -> None:
    """Refuse a bad budget, margin or cap now, naming the value, what was expected and the fix.

    Example:
        >>> check_search_options("BatchSizeFinder", budget="12 parsecs", margin=None)
        Traceback (most recent call last):
        ...
        ValueError: BatchSizeFinder(budget='12 parsecs'): cannot read '12 parsecs' as a ...
    """
    if isinstance(budget, bool) or (
        budget is not None and not isinstance(budget, int | float | str | GPU | SimulatedGPU)
    ):
        raise TypeError(
            f"{owner}(budget={budget!r}): expected bytes, a size such as '8GiB', a GPU name "
            "such as 'A100 80GB', a torchfit GPU or a SimulatedGPU; got "
            f"{type(budget).__name__}"
        )
    if isinstance(budget, int | float) and not budget > 0:
        raise ValueError(
            f"{owner}(budget={budget!r}): a budget must be more than 0 bytes; pass the memory "
            "the step may use, e.g. budget='8GiB'"
        )
    if batch_limit is not None and (
        isinstance(batch_limit, bool) or not isinstance(batch_limit, int)
    ):
        raise TypeError(
            f"{owner}(batch_limit={batch_limit!r}): expected a whole number >= 1 or None"
        )
    checks: dict[str, Callable[[], object]] = {
        "budget": lambda: find_batch_size(_never_called, start=1, budget=budget),  # type: ignore[arg-type]
        "margin": lambda: find_batch_size(_never_called, start=1, margin=margin),
        "batch_limit": lambda: find_batch_size(_never_called, start=1, batch_limit=batch_limit),
    }
    for name, check in checks.items():  # torchfit's own checks, with the option named
        try:
            check()
        except (TypeError, ValueError) as error:
            value = {"budget": budget, "margin": margin, "batch_limit": batch_limit}[name]
            raise type(error)(f"{owner}({name}={value!r}): {error}") from None


def _never_called(batch_size: int) -> None:  # pragma: no cover - a decoration target only
    raise AssertionError(batch_size)


def move_to(value: Any, device: torch.device) -> Any:
    """``value`` with every tensor in it (dicts, lists, tuples) moved to ``device``."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, Mapping):
        return type(value)({key: move_to(item, device) for key, item in value.items()})  # type: ignore[call-arg]
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return type(value)(*(move_to(item, device) for item in value))
    if isinstance(value, list | tuple):
        return type(value)(move_to(item, device) for item in value)
    return value


def _elements(sample: object) -> int:
    """How big one sample is: elements of its tensors, arrays and lists of numbers."""
    if isinstance(sample, torch.Tensor | np.ndarray):
        return int(sample.size if isinstance(sample, np.ndarray) else sample.numel())
    if isinstance(sample, Mapping):
        return sum(_elements(item) for item in sample.values())
    if isinstance(sample, list | tuple):
        if sample and all(isinstance(item, int | float) for item in sample):
            return len(sample)
        return sum(_elements(item) for item in sample)
    if isinstance(sample, str | bytes):
        return len(sample)
    return 0


class Samples:
    """Batches of any size made from a dataset's first samples, the largest of them first.

    A batch of ``b`` is ``collate`` of ``b`` samples: the largest of the first `SCAN`
    samples (so that padding to the longest sees the longest), then the others in order,
    cycled when ``b`` exceeds the dataset. Samples are read once and kept.

    Example:
        >>> data = [[1, 2], [3, 4, 5, 6], [7]]
        >>> Samples(data, list).batch(4)
        [[3, 4, 5, 6], [1, 2], [7], [3, 4, 5, 6]]
    """

    def __init__(self, dataset: Any, collate: Callable[[list[Any]], Any]) -> None:
        """Scan the start of ``dataset`` (map-style or iterable) for its largest sample."""
        self.collate = collate
        self.dataset = dataset
        self.length: int | None = None
        if isinstance(dataset, torch.utils.data.IterableDataset) or not hasattr(
            dataset, "__getitem__"
        ):
            self._read = list(itertools.islice(iter(dataset), SCAN))
            self._get: Callable[[int], Any] = self._read.__getitem__
            count = len(self._read)
        else:
            self.length = len(dataset)
            self._get = dataset.__getitem__
            count = min(self.length, SCAN)
        if count == 0:
            raise ValueError("the training dataset is empty: there is no sample to size a batch")
        self._cache: dict[int, Any] = {}
        sizes = [_elements(self._sample(i)) for i in range(count)]
        first = max(range(count), key=sizes.__getitem__)
        total = self.length if self.length is not None else count
        self.order = [first, *(i for i in range(total) if i != first)]

    def _sample(self, index: int) -> Any:
        if index not in self._cache:
            self._cache[index] = self._get(index)
        return self._cache[index]

    def batch(self, batch_size: int) -> Any:
        """A collated batch of ``batch_size`` samples."""
        count = len(self.order)
        return self.collate([self._sample(self.order[i % count]) for i in range(batch_size)])


@dataclasses.dataclass
class SearchPlan:
    """One framework's step, made ready for `run_search`.

    Attributes:
        owner: Who runs the search, for messages (``"BatchSizeFinder"``).
        step: Runs one real step: ``step(batch_size, accumulation_steps)``.
        trace: Traces one step on fake tensors: ``trace(batch_size) -> MemoryEstimate``.
        restore: Objects `find_batch_size` restores after every trial.
        device: The device training runs on.
        start: The batch size the user set (where a search without a prediction starts).
        cap: Never try more than this (the dataset length, the user's limit).
        effective: Keep ``batch * accumulation`` at this value (``None``: no accumulation).
    """

    owner: str
    step: Callable[[int, int], object]
    trace: Callable[[int], MemoryEstimate]
    restore: tuple[object, ...]
    device: torch.device
    start: int
    cap: int | None = None
    effective: int | None = None


class _UntraceableError(Exception):
    """The step could not run on fake tensors; the search falls back to real steps."""


def run_search(
    plan: SearchPlan,
    *,
    budget: Any,
    margin: float | Margin | None,
) -> BatchSizeResult:
    """Predict by tracing, verify with a real step, back off on OOM; RNGs kept.

    Raises:
        ValueError: No budget was given and the device has none to read (a CPU outside
            `simulate_gpu`).
        torch.OutOfMemoryError: Not even a batch of 1 fits.
    """
    calls = 0
    traces: dict[int, MemoryEstimate] = {}

    def predict(batch_size: int) -> MemoryEstimate:
        nonlocal calls
        calls += 1
        if batch_size not in traces:
            try:
                traces[batch_size] = plan.trace(batch_size)
            except (RuntimeError, NotImplementedError, TypeError, AttributeError) as error:
                raise _UntraceableError(str(error)) from error
        return traces[batch_size]

    def step(batch_size: int, accumulation_steps: int = 1) -> None:
        nonlocal calls
        calls += 1
        plan.step(batch_size, accumulation_steps)

    def search(
        predict: Callable[[int], MemoryEstimate] | None = None,
        start: int | None = None,
        *,
        probe_upward: bool = False,
    ) -> BatchSizeResult:
        if plan.effective is None:
            return find_batch_size(
                step,
                predict=predict,
                start=start,
                probe_upward=probe_upward,
                budget=budget,
                margin=margin,
                batch_limit=plan.cap,
                restore=plan.restore,
            )()
        return find_batch_size(
            step,
            predict=predict,
            start=start,
            probe_upward=probe_upward,
            budget=budget,
            margin=margin,
            batch_limit=plan.cap,
            restore=plan.restore,
            effective_batch_size=plan.effective,
        )()

    with kept_rng():
        try:
            return search(predict)
        except _UntraceableError as error:
            # Real steps can only probe upward where they are measured: on CUDA, or on
            # a simulated card (the default budget on a CPU; a SimulatedGPU passed in).
            upward = (
                budget is None or plan.device.type == "cuda" or isinstance(budget, SimulatedGPU)
            )
            warnings.warn(
                f"{plan.owner}: torchfit could not trace the training step on fake tensors "
                f"({error}); searching by real steps instead, from batch {plan.start}"
                + (" upward" if upward else " down (no memory to measure on this device)"),
                RuntimeWarning,
                stacklevel=3,
            )
            start = min(plan.start, plan.cap) if plan.cap is not None else plan.start
            return search(start=start, probe_upward=upward)
        except ValueError as error:
            if budget is None and calls == 0:
                raise ValueError(
                    f"{plan.owner}: no budget: training runs on {plan.device}, which has no "
                    "device memory torchfit can read; pass budget= (bytes, a size such as "
                    "'8GiB', or a GPU name such as 'A100 80GB'), or train under "
                    "torchfit.memory.simulate_gpu(...) to play a card on the CPU"
                ) from error
            raise
