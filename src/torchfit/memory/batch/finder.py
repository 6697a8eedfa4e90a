"""The biggest batch: predicted (`max_batch_size`), then verified (`find_batch_size`).

Memory is affine in the batch size, ``fixed + batch_size * per_sample`` (model states do
not grow with the batch, activations do), so a prediction inverts that line within a
budget minus a stated `Margin` (`solve_batch_size`, `max_batch_size`). `find_batch_size`
starts at the prediction, verifies it with one real step of the user's own code, and on
an out-of-memory error frees what the failed step held, backs off to the largest size
the prediction and its observations allow, and retries. `simulate_gpu` makes CPU code
run out of memory like a card of a given size, so all of it runs without a GPU.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Concatenate, ParamSpec, Protocol, overload

from torchfit._core import checks
from torchfit.memory.batch.predict import (
    Budget,
    BudgetKind,
    Margin,
    Predictor,
    find_budget,
    resolve_margin,
)
from torchfit.memory.batch.results import BatchSizeResult
from torchfit.memory.batch.search import Options, Search

__all__ = ["find_batch_size"]

_P = ParamSpec("_P")


class _Decorator(Protocol):
    def __call__(
        self, step: Callable[Concatenate[int, _P], object], /
    ) -> Callable[_P, BatchSizeResult]: ...


class _AccumulatingDecorator(Protocol):
    def __call__(
        self, step: Callable[Concatenate[int, int, _P], object], /
    ) -> Callable[_P, BatchSizeResult]: ...


def _positional_slots(step: Callable[..., object]) -> int | None:
    """How many positional arguments ``step`` takes (None: unlimited or unknown)."""
    try:
        parameters = inspect.signature(step).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature
        return None
    count = 0
    for parameter in parameters:
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            return None
        if parameter.kind in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        ):
            count += 1
    return count


def _wrap(step: Callable[..., object], options: Options) -> Callable[..., BatchSizeResult]:
    injected = 1 if options.effective is None else 2
    slots = _positional_slots(step)
    name = getattr(step, "__qualname__", repr(step))
    if slots is not None and slots < injected:
        wanted = (
            "step(batch_size, ...)"
            if injected == 1
            else ("step(batch_size, accumulation_steps, ...) because effective_batch_size is set")
        )
        raise TypeError(f"find_batch_size needs {wanted}; {name} takes {slots} positional")

    def search(*args: object, **kwargs: object) -> BatchSizeResult:
        if slots is not None and injected + len(args) > slots:
            raise TypeError(
                f"{name} takes {slots} positional arguments and find_batch_size passes the "
                f"first {injected} itself; call it without them (got {len(args)} more)"
            )
        if options.effective is None:
            return Search(lambda b, _steps: step(b, *args, **kwargs), options).run()
        return Search(lambda b, steps: step(b, steps, *args, **kwargs), options).run()

    functools.update_wrapper(search, step)
    del search.__wrapped__  # type: ignore[attr-defined]  # the signature below is the truth
    try:
        signature = inspect.signature(step)
        remaining = list(signature.parameters.values())[injected:]
        search.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=remaining, return_annotation=BatchSizeResult
        )
    except (TypeError, ValueError):
        pass
    return search


@overload
def find_batch_size(
    step: Callable[Concatenate[int, _P], object],
    /,
    *,
    start: int | None = ...,
    predict: Predictor | None = ...,
    budget: Budget | None = ...,
    batch_limit: int | None = ...,
    probe_upward: bool = ...,
    effective_batch_size: None = None,
    margin: float | Margin | None = ...,
    restore: object = ...,
    warmup: bool | None = ...,
    max_trials: int = ...,
) -> Callable[_P, BatchSizeResult]: ...
@overload
def find_batch_size(
    step: Callable[Concatenate[int, int, _P], object],
    /,
    *,
    start: int | None = ...,
    predict: Predictor | None = ...,
    budget: Budget | None = ...,
    batch_limit: int | None = ...,
    probe_upward: bool = ...,
    effective_batch_size: int,
    margin: float | Margin | None = ...,
    restore: object = ...,
    warmup: bool | None = ...,
    max_trials: int = ...,
) -> Callable[_P, BatchSizeResult]: ...
@overload
def find_batch_size(
    step: None = None,
    /,
    *,
    start: int | None = ...,
    predict: Predictor | None = ...,
    budget: Budget | None = ...,
    batch_limit: int | None = ...,
    probe_upward: bool = ...,
    effective_batch_size: None = None,
    margin: float | Margin | None = ...,
    restore: object = ...,
    warmup: bool | None = ...,
    max_trials: int = ...,
) -> _Decorator: ...
@overload
def find_batch_size(
    step: None = None,
    /,
    *,
    start: int | None = ...,
    predict: Predictor | None = ...,
    budget: Budget | None = ...,
    batch_limit: int | None = ...,
    probe_upward: bool = ...,
    effective_batch_size: int,
    margin: float | Margin | None = ...,
    restore: object = ...,
    warmup: bool | None = ...,
    max_trials: int = ...,
) -> _AccumulatingDecorator: ...
@checks.arguments(  # types at the door; the search's own checks say the rest (Options)
    budget=checks.parsed(find_budget, kinds=(int, float)),  # a name: its own message
    margin=checks.parsed(lambda margin: resolve_margin(margin, BudgetKind.BYTES, 0)),
)
def find_batch_size(
    step: Callable[..., object] | None = None,
    /,
    *,
    start: int | None = None,
    predict: Predictor | None = None,
    budget: Budget | None = None,
    batch_limit: int | None = None,
    probe_upward: bool = False,
    effective_batch_size: int | None = None,
    margin: float | Margin | None = None,
    restore: object = (),
    warmup: bool | None = None,
    max_trials: int = 25,
) -> Callable[..., BatchSizeResult] | _Decorator | _AccumulatingDecorator:
    """Find the biggest batch your own step runs with: predict, verify, back off.

    Works as ``@find_batch_size``, ``@find_batch_size(...)`` and
    ``find_batch_size(step, ...)``; each gives a function that takes the step's other
    arguments, runs the search and returns a `BatchSizeResult`. The step is called as
    ``step(batch_size, *args, **kwargs)``, or ``step(batch_size, accumulation_steps,
    *args, **kwargs)`` when ``effective_batch_size`` is set.

    The search:

    1. Starts at the predicted size (``predict`` within ``budget`` minus ``margin``, see
       `max_batch_size`), else at ``start``, else at 128, capped by ``batch_limit``
       and ``effective_batch_size``.
    2. If a named optimizer has no state yet, runs one warm-up step at batch 2 (or less)
       first and probes from the state it leaves: later steps hold the optimizer state
       that the first step only creates at its end.
    3. Runs one real step. On an out-of-memory error (`is_oom`) it clears the frames of
       the failed step, runs ``gc.collect()`` and ``torch.cuda.empty_cache()``, and, as
       the size was one the prediction said fits, takes the prediction as optimistic:
       it shrinks to 0.7x the failed size (or less, if the bytes at the OOM, a lower
       bound on the per-sample cost, say so), and halves after a second OOM in a row.
       An OOM that struck below the budget (memory the meter does not see: another
       process, fragmentation, cuDNN or NCCL handles) lowers the usable bytes to what
       was held then. When a step after a back-off is measured with room to spare, the
       gap below the size that failed is closed by the measured line if that line
       foresees every OOM seen; else (or once an OOM follows a success) it bisects
       between the last success and the failure on a 10% grid, so the answer is within
       10% of the largest size that runs. If every size down to 1 failed and no
       measured line explains it (memory that does not grow with the batch: kernels
       and cuDNN refusals chosen by shape), it walks back up through the sizes it
       skipped, smallest first, and closes the gap above the first that runs; only
       then, or when ``max_trials`` is spent, does it give up. Errors that are not
       OOMs are re-raised untouched.
    4. With ``probe_upward``, after a success it tries the largest size the measured
       steps allow (on a simulated card or CUDA: the secant of the two largest, since at
       small batches the optimizer step can set a flat peak), else doubles and bisects.
       Without it, no size above the first one is tried.
    5. Keeps the largest size that ran; when that step was measured above the margin,
       the answer shrinks (without another step) to the size the margin allows.

    Every trial starts from the same state: the objects in ``restore`` (modules,
    optimizers, tensors, LR schedulers, GradScaler) and all RNGs (torch CPU and CUDA,
    ``random``, numpy) are copied to host memory first and written back bitwise after
    each trial and at the end. Objects not named are not protected. Under an initialized
    ``torch.distributed`` process group, ranks agree (all-reduce MIN) on every size tried,
    every outcome, and the answer; a step with its own collectives (DDP's gradient
    all-reduce) may hang when only some ranks run out of memory mid-step.

    Args:
        step: The user's step; see above.
        start: First size when there is no prediction.
        predict: An `AffineEstimate` or a callable ``batch_size -> MemoryEstimate``.
        budget: Bytes, a size string, a `GPU` or a `SimulatedGPU`; by default the active
            `simulate_gpu` card, else this process's CUDA device (free + reserved bytes).
        batch_limit: Never try more than this.
        probe_upward: Look for a larger size after the first success.
        effective_batch_size: Keep ``batch_size * accumulation_steps`` at this value: the
            answer is the micro-batch and the accumulation steps (exact when a step count
            within twice the minimum divides it; else the smallest cover above it).
        margin: A fraction of the budget to keep free, or a `Margin` (default: 5%, 2% on
            a simulated card, plus the CUDA context for a `GPU` budget).
        restore: An object or a tuple of objects to restore after each trial.
        warmup: Force (True) or skip (False) the warm-up step; by default, when a named
            optimizer has no state.
        max_trials: At most this many real steps (Lightning's default, 25).

    Returns:
        A function of the step's remaining arguments that returns a `BatchSizeResult`;
        its ``returned`` is what the step returned at the largest size that ran (what
        accelerate's ``find_executable_batch_size`` returns), and with a callable
        ``predict`` its ``fitted_from`` names the sizes the line was fitted from.

    Raises:
        torch.OutOfMemoryError: (from the search) not even batch size 1 runs.
        TypeError, ValueError: bad options, or a step that cannot take the batch size.

    Example:
        >>> import torch
        >>> from torchfit.memory import simulate_gpu
        >>> net = torch.nn.Linear(256, 256)
        >>> opt = torch.optim.SGD(net.parameters(), lr=0.1)
        >>> @find_batch_size(start=1024, probe_upward=True, restore=(net, opt))
        ... def step(batch_size):
        ...     loss = net(torch.randn(batch_size, 256)).square().mean()
        ...     loss.backward()
        ...     opt.step()
        ...     opt.zero_grad()
        >>> with simulate_gpu("2MiB", track=(net, opt)):
        ...     result = step()
        >>> [(trial.batch_size, str(trial.outcome)) for trial in result.trials]
        [(2, 'ok'), (1024, 'oom'), (716, 'oom'), (358, 'oom'), (179, 'ok'), (291, 'ok')]
        >>> result.batch_size
        291
    """
    options = Options(
        start=start,
        predict=predict,
        budget=budget,
        batch_limit=batch_limit,
        probe_upward=probe_upward,
        effective=effective_batch_size,
        margin=margin,
        restore=restore if isinstance(restore, tuple) else (restore,),
        warmup=warmup,
        max_trials=max_trials,
    )
    if step is not None:
        return _wrap(step, options)
    return functools.partial(_wrap, options=options)
