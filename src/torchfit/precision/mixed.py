"""`MixedPrecision`: autocast, the gradient scaler and the optimizer step in one object."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from torchfit._core import checks
from torchfit._core.hardware import parse_device
from torchfit._core.units import DType
from torchfit.precision import pitfalls
from torchfit.precision import step as _step
from torchfit.precision.choice import (
    Precision,
    PrecisionChoice,
    choose_precision,
    parse_precision,
)
from torchfit.precision.state import ScaleLog, check_state, make_state
from torchfit.precision.step import NonFiniteCheck, StepOutcome
from torchfit.precision.window import Window

__all__ = ["MixedPrecision"]


Optimizers = torch.optim.Optimizer | Sequence[torch.optim.Optimizer]
Schedulers = torch.optim.lr_scheduler.LRScheduler | Sequence[torch.optim.lr_scheduler.LRScheduler]


class MixedPrecision:
    """Autocast, loss scaling, accumulation and the optimizer step for one training run.

    Per micro-batch: run the forward under `autocast`, call `backward` on the loss, then
    `step`. `step` returns `StepOutcome.ACCUMULATED` inside an accumulation window and
    does the real step at its end: unscale each optimizer once (fp16), decide whether any
    gradient is inf/nan, clip, step every optimizer, update the scale once, advance the
    schedulers, zero the gradients.

    On inf/nan, every optimizer skips the step together (plain ``GradScaler`` lets each
    optimizer decide alone), the schedulers do not advance, the gradients are zeroed,
    `skipped_steps` grows, and with fp16 the scale backs off once. bf16 and fp32 have no
    scaler; ``skip_nonfinite`` says what decides instead (`NonFiniteCheck`): by default
    the window's losses, and the clipping norm when clipping (both free: the usual
    divergence, a loss gone inf/nan, is caught at no cost); ``"grads"`` also reads every
    gradient once when not clipping (an inf/nan gradient under a finite loss, at about
    2% of a small model's CPU step); ``"never"`` steps on inf/nan like plain
    ``torch.amp`` (the parameters become nan). On CUDA a check costs one sync per
    optimizer step.

    Args:
        dtype: ``"auto"`` (see `choose_precision`), ``"bf16"``, ``"fp16"`` or ``"fp32"``
            (or a ``torch.dtype``).
        device: where the run trains; ``None`` means CUDA when available, else the CPU.
        accumulate: micro-batches per optimizer step; `backward` divides each loss by it.
        init_scale: the GradScaler's first loss scale (fp16 only).
        growth_factor: scale multiplier after ``growth_interval`` clean steps (fp16 only).
        backoff_factor: scale multiplier on a skipped step (fp16 only).
        growth_interval: clean steps between scale growths (fp16 only).
        skip_nonfinite: what makes a bf16/fp32 step skip: ``"loss"`` (default),
            ``"grads"`` or ``"never"``; see above. fp16's GradScaler always decides.

    Raises:
        ValueError: an unknown dtype, a CUDA device without a GPU, or bad numbers.

    Example:
        >>> import torch
        >>> model = torch.nn.Linear(4, 2)
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> mp = MixedPrecision("bf16", device="cpu", accumulate=2)
        >>> for _ in range(2):
        ...     with mp.autocast():
        ...         loss = model(torch.randn(8, 4)).float().pow(2).mean()
        ...     mp.backward(loss)
        ...     outcome = mp.step(opt)
        >>> outcome, mp.optimizer_steps, mp.skipped_steps
        (<StepOutcome.STEPPED: 'stepped'>, 1, 0)
        >>> mp.dtype, mp.scaler is None
        (<Precision.BF16: 'bf16'>, True)
    """

    @checks.arguments(
        dtype=checks.parsed(parse_precision),
        device=checks.parsed(parse_device, kinds=(str,)),
        accumulate=checks.whole(at_least=1),
        init_scale=checks.number(above=0),
        growth_factor=checks.number(above=1),
        backoff_factor=checks.number(above=0, below=1),
        growth_interval=checks.whole(at_least=1),
        skip_nonfinite=checks.parsed(_step.parse_check),
    )
    def __init__(
        self,
        dtype: str | torch.dtype | DType | Precision = "auto",
        *,
        device: str | torch.device | None = None,
        accumulate: int = 1,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        skip_nonfinite: str | NonFiniteCheck = NonFiniteCheck.LOSS,
    ) -> None:
        """Resolve the precision and build the scaler; see the class docstring."""
        self.choice: PrecisionChoice = choose_precision(dtype, device=device)
        self.device = torch.device(self.choice.device)
        self.accumulate = accumulate
        self.skip_nonfinite = _step.parse_check(skip_nonfinite)
        self.scaler: torch.amp.GradScaler | None = None
        if self.choice.scaler:
            self.scaler = torch.amp.GradScaler(
                self.device.type,
                init_scale=init_scale,
                growth_factor=growth_factor,
                backoff_factor=backoff_factor,
                growth_interval=growth_interval,
            )
        self._scale = ScaleLog(float(init_scale) if self.scaler is not None else None)
        self._autocast_dtype = self.dtype.torch_dtype
        self._autocast_on = self.dtype is not Precision.FP32
        self.optimizer_steps = 0
        self.skipped_steps = 0
        self.last_grad_norm: torch.Tensor | None = None
        self._window = Window()
        self._graph_checked = False
        self._checked_optimizers: tuple[int, ...] = ()
        self._checked_schedulers: tuple[int, ...] = ()

    # -- what was chosen ------------------------------------------------------------------

    @property
    def dtype(self) -> Precision:
        """The precision in use (``auto`` already resolved)."""
        return self.choice.precision

    @property
    def reason(self) -> str:
        """Why this precision: what the hardware does (or "requested explicitly")."""
        return self.choice.reason

    @property
    def loss_scale(self) -> float | None:
        """The current loss scale (None without a scaler); read without a device sync."""
        return self._scale.events[-1][1] if self._scale.events else None

    @property
    def scale_history(self) -> tuple[tuple[int, float], ...]:
        """``(update index, scale)`` at the start and after every change of the loss scale.

        The update index counts optimizer steps, skipped ones included; a skip halves the
        scale (by default), ``growth_interval`` clean steps in a row double it.
        """
        return tuple(self._scale.events)

    @property
    def micro_step(self) -> int:
        """Micro-batches finished in the current accumulation window (0 at a boundary)."""
        return self._window.micro

    def __repr__(self) -> str:
        """The choice, the scaler and the counters in one line."""
        scaler = f"scale={self.loss_scale:g}" if self.scaler is not None else "scaler=None"
        return (
            f"MixedPrecision(dtype={str(self.dtype)!r}, device={str(self.device)!r}, {scaler}, "
            f"accumulate={self.accumulate}, optimizer_steps={self.optimizer_steps}, "
            f"skipped_steps={self.skipped_steps}, reason={self.reason!r})"
        )

    # -- the training step ----------------------------------------------------------------

    def autocast(self) -> torch.autocast:
        """The autocast context for the forward pass and loss (disabled for fp32)."""
        if not self._autocast_on:
            return torch.autocast(self.device.type, enabled=False)
        return torch.autocast(self.device.type, dtype=self._autocast_dtype)

    @checks.arguments(weight=checks.number(above=0, fix=_step.NO_SHARE))
    def backward(
        self, loss: torch.Tensor, *, weight: float | None = None, retain_graph: bool = False
    ) -> None:
        """Backward of ``loss`` divided by `accumulate` (or times ``weight``), scaled for fp16.

        The first call checks the autograd graph before running it: a loss that cannot
        have gradients, a loss on another device, or float16 weights (a halved model)
        raise here, not after the backward. Several losses in one micro-batch each get
        their own call (the graph they share needs ``retain_graph=True`` in all but the
        last); their gradients add up, as with ``scaler.scale(loss).backward()``.

        Args:
            loss: the micro-batch's loss (a mean over the micro-batch).
            weight: this micro-batch's share of the window in place of ``1/accumulate``,
                for micro-batches of unequal size, e.g. its token count over the
                window's. Give it for every micro-batch of a window or for none.
            retain_graph: keep the autograd graph for another backward through it
                (``Tensor.backward``'s own argument, passed through).

        Raises:
            ValueError: the first-call checks above; ``weight`` given for only part of a
                window.
        """
        if not self._graph_checked:
            self._check_graph(loss)
        self._window.note_backward(weighted=weight is not None)
        raw = loss
        if weight is not None:
            loss = loss * weight
        elif self.accumulate != 1:
            loss = loss / self.accumulate
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        loss.backward(retain_graph=retain_graph)  # type: ignore[no-untyped-call]
        if self.scaler is None and self.skip_nonfinite is not NonFiniteCheck.NEVER:
            self._window.note_loss(raw)

    def grad(
        self, loss: torch.Tensor, inputs: Iterable[torch.Tensor], *, create_graph: bool = True
    ) -> tuple[torch.Tensor, ...]:
        """Unscaled gradients of ``loss`` for a term built from them (a gradient penalty).

        fp16: ``torch.autograd.grad`` of the scaled loss, each result times ``1 / scale``
        (PyTorch's "Automatic Mixed Precision examples" recipe), so a small gradient does
        not underflow; bf16/fp32: ``torch.autograd.grad`` of the loss. The result feeds
        a penalty added to the loss before `backward`; ``.grad`` is not touched.

        Args:
            loss: the loss whose gradients the penalty is made of.
            inputs: the tensors to differentiate by (e.g. ``list(model.parameters())``).
            create_graph: keep the graph of the gradients, so that the penalty can be
                differentiated in turn (the usual case; ``False`` for logging only).

        Returns:
            One gradient per input, unscaled.

        Raises:
            TypeError: ``inputs`` is not a sequence (or iterator) of tensors.
        """
        return _step.unscaled_grads(self.scaler, loss, inputs, create_graph=create_graph)

    def step(
        self,
        optimizers: Optimizers,
        *,
        scheduler: Schedulers | None = None,
        clip_grad_norm: float | None = None,
        flush: bool = False,
        before_step: Callable[[], object] | None = None,
    ) -> StepOutcome:
        """End a micro-batch; at the end of a window, step every optimizer (or skip all).

        Order at a boundary: ``unscale_`` each optimizer once (fp16); one inf/nan
        decision; ``before_step()``; clip the gradients of all the optimizers' parameters
        together to ``clip_grad_norm``; ``step`` each optimizer; one
        ``GradScaler.update``; step the schedulers; zero the gradients of every optimizer
        (``set_to_none=True``). A skipped step does all of that except ``before_step``,
        the clipping, the optimizer steps and the scheduler steps.

        Args:
            optimizers: one optimizer or several, sharing the one loss scale.
            scheduler: learning-rate scheduler(s) to advance after a real step only.
            clip_grad_norm: max 2-norm of all gradients together; None: no clipping.
            flush: step now although the window is short (end of an epoch); the
                gradient is rescaled to the mean of the micro-batches it holds.
            before_step: called with no arguments when the gradients are unscaled (and
                rescaled after a `flush`) and before clipping and the optimizer steps:
                the place for ``clip_grad_value_``, a custom norm, or logging the true
                gradients. Not called inside a window nor on a step already known to be
                skipped (inf/nan found by the scaler, or a non-finite loss).

        Returns:
            `StepOutcome.ACCUMULATED`, `StepOutcome.STEPPED` or `StepOutcome.SKIPPED`.

        Raises:
            RuntimeError: no `backward` since the last `step`.
            TypeError, ValueError: optimizers or schedulers it cannot drive (first step).
        """
        opts: list[torch.optim.Optimizer] = _step.as_list(optimizers)
        scheds: list[torch.optim.lr_scheduler.LRScheduler] = _step.as_list(scheduler, "scheduler")
        _step.check_step_options(optimizers, clip_grad_norm, flush, before_step)
        window = self._window
        if not window.pending:
            raise RuntimeError(
                "step() was called without a backward() since the last step(); call "
                "mp.backward(loss) once per micro-batch before mp.step(optimizer)"
            )
        micro = window.micro + 1
        if micro < self.accumulate and not flush:
            window.micro, window.pending = micro, False
            return StepOutcome.ACCUMULATED
        self._check_step_args(opts, scheds)  # raises before any state changes
        weighted = window.close()
        rescale = 1.0 if weighted or micro == self.accumulate else self.accumulate / micro
        skipped, norm = _step.boundary(
            opts,
            scheds,
            scaler=self.scaler,
            clip=clip_grad_norm,
            rescale=rescale,
            check=self.skip_nonfinite,
            loss_finite=window.losses_finite(),
            before_step=before_step,
        )
        if norm is not None:
            self.last_grad_norm = norm
        if self.scaler is not None:
            index = self.optimizer_steps + self.skipped_steps + 1
            self._scale.record(self.scaler, index, skipped=skipped)
        for optimizer in opts:
            optimizer.zero_grad(set_to_none=True)
        if skipped:
            self.skipped_steps += 1
            return StepOutcome.SKIPPED
        self.optimizer_steps += 1
        return StepOutcome.STEPPED

    # -- checks ---------------------------------------------------------------------------

    @checks.arguments(model=checks.model())
    def check(
        self,
        model: torch.nn.Module,
        optimizers: Optimizers = (),
        *,
        scheduler: Schedulers | None = None,
    ) -> None:
        """Check a model (and its optimizers, schedulers) before training; raise with the fix.

        Catches a model already halved (fp16 weights), a quantized model with nothing
        trainable, optimizers that unscale inside their own step, and metric-driven
        schedulers. `backward` and `step` run the same checks on first use; calling this
        up front only fails sooner and names parameters by their module path.

        Raises:
            ValueError, TypeError: what was found and how to fix it.

        Example:
            >>> import torch
            >>> MixedPrecision("fp16", device="cpu").check(torch.nn.Linear(2, 2).half())
            Traceback (most recent call last):
            ...
            ValueError: 2 trainable tensor(s) are float16 (weight, bias): the GradScaler ...
        """
        pitfalls.check_model(model, self.dtype)
        pitfalls.check_optimizers(_step.as_list(optimizers), scaler=self.scaler is not None)
        pitfalls.check_schedulers(_step.as_list(scheduler, "scheduler"))

    def _check_graph(self, loss: torch.Tensor) -> None:
        pitfalls.check_loss(loss, self.device, self.dtype)
        self._graph_checked = True

    def _check_step_args(
        self,
        opts: list[torch.optim.Optimizer],
        scheds: list[torch.optim.lr_scheduler.LRScheduler],
    ) -> None:
        key = tuple(map(id, opts))
        if key != self._checked_optimizers:
            pitfalls.check_optimizers(opts, scaler=self.scaler is not None)
            self._checked_optimizers = key
        key = tuple(map(id, scheds))
        if key != self._checked_schedulers:
            pitfalls.check_schedulers(scheds)
            self._checked_schedulers = key

    # -- checkpointing --------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The scaler state and the counters, to save beside the model and optimizer.

        Raises:
            RuntimeError: called inside an accumulation window, whose partial gradients
                no state dict holds; checkpoint right after a boundary `step`.
        """
        if self._window.micro or self._window.pending:
            raise RuntimeError(
                f"state_dict() was called after {self._window.micro} of {self.accumulate} "
                "micro-batches: the accumulated gradients are in no state dict, so a resumed "
                "run would lose them. Checkpoint right after step() returns STEPPED or SKIPPED."
            )
        counters = (self.optimizer_steps, self.skipped_steps)
        return make_state(
            precision=str(self.dtype), accumulate=self.accumulate, counters=counters,
            scale_log=self._scale, scaler=self.scaler,
        )  # fmt: skip

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what `state_dict` saved; a resumed run continues exactly.

        Raises:
            TypeError: ``state`` is not a dict (``None``, from a checkpoint saved without
                this state, included: skip the call then).
            ValueError: saved with another precision or accumulation, or not whole
                (GradScaler's own, keys missing, bad values); nothing is loaded.
        """
        state = check_state(
            state, precision=str(self.dtype), accumulate=self.accumulate,
            scaler=self.scaler is not None,
        )  # fmt: skip
        self.optimizer_steps = int(state["optimizer_steps"])
        self.skipped_steps = int(state["skipped_steps"])
        self._scale.load(state["scale_history"], state["scaler"])
        if self.scaler is not None:
            self.scaler.load_state_dict(state["scaler"])
