"""transformers: `fit_batch_size` sets a ``Trainer``'s batch size by prediction, before ``train()``.

``TrainingArguments(auto_find_batch_size=True)`` wraps the whole training loop in
accelerate's ``find_executable_batch_size``: it starts at ``per_device_train_batch_size``,
and after every out-of-memory error restarts training at 0.9 times the size. It never
goes above the size it starts from. `fit_batch_size` instead traces the trainer's own
step on fake tensors (``compute_loss`` on a batch from its data collator, the optimizer
``create_optimizer`` builds, fp16/bf16 autocast, gradient clipping, gradient
checkpointing), solves the largest batch within a budget, verifies it with one real step
and sets ``per_device_train_batch_size`` (and the copy the ``Trainer`` made of it).

Needs transformers (``pip install 'torchfit[hf]'``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch

from torchfit._core.imports import require
from torchfit.integrations.search import (
    Samples,
    SearchPlan,
    check_search_options,
    move_to,
    run_search,
)
from torchfit.memory import GPU, MemoryEstimate, trace_step
from torchfit.memory.batch import BatchSizeResult, Margin, SimulatedGPU

__all__ = ["fit_batch_size"]

log = logging.getLogger(__name__)


def fit_batch_size(
    trainer: Any,
    *,
    budget: int | str | GPU | SimulatedGPU | None = None,
    margin: float | Margin | None = None,
    keep_effective_batch: bool = False,
) -> BatchSizeResult:
    """Set a transformers ``Trainer``'s batch size to the largest that fits, before ``train()``.

    The step traced (on fake tensors: no memory used) and then run once for real is the
    Trainer's: ``model.train()``, ``compute_loss`` (yours, if you override it) under
    the autocast of ``fp16``/``bf16``, the loss divided by the accumulation steps,
    ``backward``, gradient clipping at ``max_grad_norm``, the optimizer's step (the one
    ``create_optimizer`` builds from ``optim``, or the one you passed), ``zero_grad``
    (kept while accumulating gradients, so the gradients stay alive through the next
    forward). With ``activation_checkpointing`` (``gradient_checkpointing``) set, the
    model is checkpointed during the search, as ``train()`` will do. Batches are the
    trainer's data collator applied to the training set's first samples (the largest
    of the first 1024 first, so that padding sees the longest), with the columns the
    model does not take removed, as the Trainer does.

    Afterwards ``args.per_device_train_batch_size`` and the Trainer's own copy of it
    are the chosen size; with ``keep_effective_batch``, ``gradient_accumulation_steps``
    is set so that ``per_device_train_batch_size * gradient_accumulation_steps`` stays
    what it was (exactly, when a step count divides it; else the smallest cover above
    it). Nothing else changes: model weights, training flags and checkpointing, any
    optimizer you passed, and all RNGs are put back; an optimizer the search built is
    dropped again, so ``train()`` builds its own as usual.

    Args:
        trainer: A ``transformers.Trainer`` (or subclass) with a ``train_dataset``.
        budget: Memory the step may use: bytes, a size such as ``"24GiB"``, a GPU name
            or a torchfit ``GPU``, or a ``SimulatedGPU``. By default the CUDA device
            training runs on (free + reserved bytes), or the active ``simulate_gpu``
            card; on a CPU one of them is required.
        margin: A fraction of the budget to keep free, or a `Margin` (default: 7% on
            a card, 2% on a simulated one).
        keep_effective_batch: Keep the effective batch by changing
            ``gradient_accumulation_steps`` too; the per-device batch is then at most
            the effective batch.

    Returns:
        The `BatchSizeResult`: the size, the prediction, and every real step run.

    Raises:
        TypeError: ``trainer`` is not a transformers ``Trainer``, or a bad option type.
        ValueError: A bad budget or margin, no ``train_dataset``, or no budget on a CPU.
        torch.OutOfMemoryError: Not even a batch of 1 fits.

    Example:
        >>> from transformers import (GPT2Config, GPT2LMHeadModel, Trainer,
        ...                           TrainingArguments, default_data_collator)
        >>> from torchfit.memory import simulate_gpu
        >>> config = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=256,
        ...                     n_positions=32, bos_token_id=0, eos_token_id=0)
        >>> model = GPT2LMHeadModel(config)
        >>> ids = torch.randint(0, 256, (512, 32))
        >>> data = [{"input_ids": row, "labels": row} for row in ids]
        >>> args = TrainingArguments("out", max_steps=1, report_to=[], use_cpu=True)
        >>> trainer = Trainer(model=model, args=args, train_dataset=data,
        ...                   data_collator=default_data_collator)
        >>> with simulate_gpu("8MiB", track=model):  # on a GPU: fit_batch_size(trainer)
        ...     result = fit_batch_size(trainer)
        >>> args.per_device_train_batch_size == result.batch_size > 8, result.ooms
        (True, 0)
    """
    transformers = require("transformers", feature="torchfit.integrations.transformers")
    if not isinstance(trainer, transformers.Trainer):
        raise TypeError(
            f"fit_batch_size(trainer=...) needs a transformers.Trainer (or a subclass); got "
            f"{type(trainer).__name__}. Build one with Trainer(model=..., args=..., "
            "train_dataset=...) and call fit_batch_size before trainer.train()"
        )
    check_search_options("fit_batch_size", budget=budget, margin=margin)
    if not isinstance(keep_effective_batch, bool):
        raise TypeError(
            f"fit_batch_size(keep_effective_batch={keep_effective_batch!r}): expected True or False"
        )
    if trainer.train_dataset is None:
        raise ValueError(
            "fit_batch_size: the trainer has no train_dataset to draw a batch from; pass "
            "train_dataset= to the Trainer"
        )
    args = trainer.args
    original = int(args.per_device_train_batch_size)
    accumulation = int(args.gradient_accumulation_steps)
    probe = _Probe(trainer, original * accumulation if keep_effective_batch else None)
    with probe.prepared():
        plan = SearchPlan(
            owner="fit_batch_size",
            step=probe.step,
            trace=probe.trace,
            restore=(trainer.model, probe.optimizer),
            device=probe.device,
            start=original,
            cap=probe.samples.length,
            effective=probe.effective,
        )
        result = run_search(plan, budget=budget, margin=margin)
    args.per_device_train_batch_size = result.batch_size
    if keep_effective_batch:
        args.gradient_accumulation_steps = result.accumulation_steps
    # Trainer.__init__ copied the size (accelerate's find_executable_batch_size changes the copy)
    trainer._train_batch_size = args.train_batch_size  # noqa: SLF001
    log.info(
        "fit_batch_size: per_device_train_batch_size = %d, gradient_accumulation_steps = %d "
        "(predicted %s, %d real steps, %d out of memory)",
        result.batch_size,
        args.gradient_accumulation_steps,
        result.predicted,
        result.real_steps,
        result.ooms,
    )
    return result


def _checkpointing(model: Any) -> bool:
    flag = getattr(type(model), "is_activation_checkpointing", None)
    if flag is not None:
        return bool(model.is_activation_checkpointing)
    return bool(getattr(model, "is_gradient_checkpointing", False))


class _Probe:
    """The Trainer's step, its batches, and what the search borrows from the Trainer."""

    def __init__(self, trainer: Any, effective: int | None) -> None:
        self.trainer = trainer
        self.effective = effective
        self.args = trainer.args
        self.device = torch.device(self.args.device)
        self.passed_optimizer = trainer.optimizer
        self.optimizer: torch.optim.Optimizer = trainer.optimizer
        dataset, collate = trainer.train_dataset, trainer.data_collator
        if self.args.remove_unused_columns:  # what Trainer._get_dataloader does
            remove = getattr(trainer, "_remove_unused_columns", None)
            wrap = getattr(trainer, "_get_collator_with_removed_columns", None)
            if hasattr(dataset, "column_names") and remove is not None:  # a datasets.Dataset
                dataset = remove(dataset, description="training")
            elif wrap is not None:
                collate = wrap(collate, description="training")
        self.samples = Samples(dataset, collate)
        self.autocast_dtype = (
            torch.bfloat16 if self.args.bf16 else torch.float16 if self.args.fp16 else None
        )

    @contextlib.contextmanager
    def prepared(self) -> Iterator[None]:
        """The optimizer ``train()`` would build, and checkpointing as ``train()`` sets it."""
        model = self.trainer.model
        wanted = bool(
            getattr(self.args, "activation_checkpointing", None)
            or getattr(self.args, "gradient_checkpointing", False)
        )
        enabled = wanted and not _checkpointing(model)
        hooked = hasattr(model, "_require_grads_hook")
        if self.passed_optimizer is None:
            self.optimizer = self.trainer.create_optimizer()
        try:
            if enabled:
                self._enable_checkpointing(model)
            yield
        finally:
            if enabled:
                disable = getattr(model, "activation_checkpointing_disable", None)
                (disable or model.gradient_checkpointing_disable)()
                if not hooked and hasattr(model, "_require_grads_hook"):
                    model.disable_input_require_grads()
            if self.passed_optimizer is None:
                self.trainer.optimizer = None

    def _enable_checkpointing(self, model: Any) -> None:
        kwargs = getattr(self.args, "activation_checkpointing_kwargs", None)
        if kwargs is None:
            kwargs = getattr(self.args, "gradient_checkpointing_kwargs", None)
        kwargs = dict(kwargs or {})
        every, offload = kwargs.pop("every_n_layers", 1), kwargs.pop("offload", False)
        enable = getattr(model, "activation_checkpointing_enable", None)
        if enable is not None:
            enable(
                activation_checkpointing_kwargs=kwargs or None,
                every_n_layers=every,
                offload=offload,
            )
        else:  # transformers < 5
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs or None)

    def _context(self, *, fake: bool) -> contextlib.AbstractContextManager[Any]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        if fake:  # fake tensors are CPU tensors: CUDA autocast would not touch them
            return torch.autocast("cpu", dtype=self.autocast_dtype)
        return self.trainer.accelerator.autocast()  # type: ignore[no-any-return]

    def _run(
        self, model: Any, optimizer: Any, inputs: Any, *, accumulating: bool, fake: bool
    ) -> None:
        model.train()
        with self._context(fake=fake):
            loss = self.trainer.compute_loss(model, inputs)
        loss.backward()
        if self.args.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), self.args.max_grad_norm)
        optimizer.step()
        if not accumulating:  # accumulating: the gradients live on into the next forward
            optimizer.zero_grad(set_to_none=True)

    def step(self, batch_size: int, accumulation_steps: int = 1) -> None:
        """One real step at ``batch_size`` on the training device."""
        inputs = move_to(self.samples.batch(batch_size), self.device)
        accumulating = (
            accumulation_steps > 1
            if self.effective is not None
            else self.args.gradient_accumulation_steps > 1
        )
        self._run(self.trainer.model, self.optimizer, inputs, accumulating=accumulating, fake=False)

    def trace(self, batch_size: int) -> MemoryEstimate:
        """The step's peak at ``batch_size``, traced on fake copies."""
        inputs = move_to(self.samples.batch(batch_size), torch.device("cpu"))
        accumulating = (
            batch_size < self.effective
            if self.effective is not None
            else self.args.gradient_accumulation_steps > 1
        )

        def fake_step(model: Any, optimizer: Any, inputs: Any) -> None:
            self._run(model, optimizer, inputs, accumulating=accumulating, fake=True)

        device = "cuda" if self.device.type == "cuda" else "cpu"
        return trace_step(
            fake_step, self.trainer.model, self.optimizer, inputs, device=device
        ).estimate
