"""Lightning: a `BatchSizeFinder` callback that predicts the batch size instead of crashing into it.

Lightning's own ``BatchSizeFinder`` doubles the batch until a step runs out of memory
(then halves, or bisects) and shaves a margin. This callback traces the module's real
step on fake tensors (``training_step``, the optimizer from ``configure_optimizers``,
the trainer's precision and gradient clipping), solves the largest batch within the
budget, verifies it with one real step, and sets the batch-size attribute where
Lightning's finder would (the module, its ``hparams``, the datamodule). Model,
optimizer, LR scheduler and RNG states are left as they were.

Needs ``lightning`` (``pip install 'torchfit[lightning]'``); the callback is also a
``pytorch_lightning.Callback`` when that package is installed.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Callable, Iterator
from types import ModuleType
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

__all__ = ["BatchSizeFinder"]

log = logging.getLogger(__name__)

_MIXED = {"16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}


def _callback_base() -> type:
    """``lightning.pytorch.Callback``, plus ``pytorch_lightning.Callback`` where installed."""
    bases = []
    for package in ("lightning.pytorch", "pytorch_lightning"):
        try:
            bases.append(importlib.import_module(package).Callback)
        except ImportError:
            continue
    if not bases:
        require("lightning", feature="torchfit.integrations.lightning.BatchSizeFinder")
    return type("_Callback", tuple(bases), {"__module__": __name__})


_Callback: Any = _callback_base()


def _package(trainer: Any) -> str:
    """``lightning.pytorch`` or ``pytorch_lightning``: the package ``trainer`` comes from."""
    root = type(trainer).__module__.split(".", 1)[0]
    return "pytorch_lightning" if root == "pytorch_lightning" else "lightning.pytorch"


def _utilities(trainer: Any, name: str) -> ModuleType:
    return importlib.import_module(f"{_package(trainer)}.utilities.{name}")


def _noop(*_args: object, **_kwargs: object) -> None:
    return None


@contextlib.contextmanager
def _probing(module: Any, optimizers: list[Any], schedulers: list[Any]) -> Iterator[None]:
    """Run ``training_step`` outside the loop: logging off, manual optimization on raw objects.

    ``self.log`` would write into the loop's results (and needs the loop running);
    ``self.optimizers()`` / ``manual_backward`` would go through the trainer's wrappers
    and count optimizer steps. For the probe they are plain: the optimizers given, and
    ``loss.backward()``. Instance attributes are set and removed again.
    """
    patches: dict[str, object] = {
        "log": _noop,
        "log_dict": _noop,
        "optimizers": lambda use_pl_optimizer=True: (  # noqa: ARG005 - Lightning's signature
            optimizers[0] if len(optimizers) == 1 else list(optimizers)
        ),
        "lr_schedulers": lambda: (
            None if not schedulers else schedulers[0] if len(schedulers) == 1 else schedulers
        ),
        "manual_backward": lambda loss, *args, **kwargs: loss.backward(*args, **kwargs),
        "toggle_optimizer": _noop,
        "untoggle_optimizer": _noop,
    }
    for name, value in patches.items():
        object.__setattr__(module, name, value)
    try:
        yield
    finally:
        for name in patches:
            module.__dict__.pop(name, None)


def _loss(output: object) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, dict):
        return output.get("loss")
    return None


class BatchSizeFinder(_Callback):  # type: ignore[misc]  # the base is Lightning's Callback
    """A Lightning callback that picks the largest batch size by prediction, then checks it.

    Before training starts (``on_fit_start``) it traces one training step on fake
    tensors at a few batch sizes (no memory used), solves the largest batch whose step
    fits the budget minus the margin (`torchfit.memory.find_batch_size`), verifies it
    with one real step (after one warm-up step at batch 2 that creates the optimizer
    state), backs off if that step runs out of memory, and sets ``batch_arg_name``
    exactly where Lightning's ``BatchSizeFinder`` would: on the module, its ``hparams``
    and the datamodule, wherever it is defined. Dataloaders built before the search are
    rebuilt, so training runs at the chosen size.

    The traced step is Lightning's automatic optimization: ``training_step`` under the
    trainer's precision, ``zero_grad`` (after the forward, as Lightning does; skipped
    while accumulating gradients), ``backward``, gradient clipping when the trainer
    clips, ``optimizer.step``. With manual optimization, ``training_step`` runs with
    ``self.optimizers()`` giving the raw optimizers. ``self.log`` does nothing during
    the probe. Batches come from the training dataloader's own dataset and
    ``collate_fn`` (its largest early sample first), moved with the trainer's
    batch-transfer hooks.

    Args:
        budget: Memory the step may use: bytes, a size such as ``"8GiB"``, a GPU name
            or a torchfit ``GPU``, or a ``SimulatedGPU``. By default the trainer's CUDA
            device (free + reserved bytes), or the active ``simulate_gpu`` card; on a
            CPU one of them is required.
        margin: A fraction of the budget to keep free, or a `Margin` (default: 7% on
            a card, 2% on a simulated one).
        batch_arg_name: The attribute that holds the batch size.
        batch_limit: Never choose more (the dataset's length is a cap too).

    Attributes:
        result: The `BatchSizeResult` of the last search (``None`` before one ran).

    Raises:
        ValueError, TypeError: at construction, for a bad budget, margin or limit; at
            setup, when the module and datamodule have no ``batch_arg_name``, when the
            training dataloader was passed to ``fit`` directly, or under a distributed
            strategy.

    Example:
        >>> import lightning.pytorch as pl
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> from torchfit.memory import simulate_gpu
        >>> data = TensorDataset(torch.randn(4096, 256))
        >>> class Model(pl.LightningModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.batch_size = 8
        ...         self.net = torch.nn.Linear(256, 256)
        ...     def training_step(self, batch, batch_idx):
        ...         return self.net(batch[0]).square().mean()
        ...     def configure_optimizers(self):
        ...         return torch.optim.SGD(self.parameters(), lr=0.1)
        ...     def train_dataloader(self):
        ...         return DataLoader(data, batch_size=self.batch_size)
        >>> model, finder = Model(), BatchSizeFinder()
        >>> trainer = pl.Trainer(max_steps=1, callbacks=[finder], logger=False,
        ...                      enable_checkpointing=False, enable_progress_bar=False,
        ...                      enable_model_summary=False)
        >>> import warnings  # Lightning 2.6 warns about torch's pytree API under torch 2.13
        >>> warnings.filterwarnings("ignore", ".*LeafSpec", FutureWarning)
        >>> with simulate_gpu("4MiB", track=model):  # on a GPU: trainer.fit(model)
        ...     trainer.fit(model)
        >>> model.batch_size == finder.result.batch_size > 8, finder.result.ooms
        (True, 0)
    """

    def __init__(
        self,
        budget: int | str | GPU | SimulatedGPU | None = None,
        *,
        margin: float | Margin | None = None,
        batch_arg_name: str = "batch_size",
        batch_limit: int | None = None,
    ) -> None:
        """Check the options; the search runs when ``trainer.fit`` starts."""
        super().__init__()
        check_search_options(
            "BatchSizeFinder", budget=budget, margin=margin, batch_limit=batch_limit
        )
        if not isinstance(batch_arg_name, str) or not batch_arg_name.isidentifier():
            raise TypeError(
                f"BatchSizeFinder(batch_arg_name={batch_arg_name!r}): expected the name of "
                "the attribute that holds the batch size, e.g. 'batch_size'"
            )
        self.budget = budget
        self.margin = margin
        self.batch_arg_name = batch_arg_name
        self.batch_limit = batch_limit
        self.result: BatchSizeResult | None = None

    def setup(self, trainer: Any, pl_module: Any, stage: str | None = None) -> None:
        """Refuse what the search cannot handle, before the model is set up."""
        if stage not in (None, "fit"):
            return
        name = self.batch_arg_name
        if trainer.world_size > 1:
            raise ValueError(
                f"BatchSizeFinder: the trainer runs {trainer.world_size} processes "
                f"({type(trainer.strategy).__name__}); the search runs on one device. Find "
                "the batch size in a single-device run first, then pass it to the module"
            )
        source = getattr(trainer.fit_loop, "_data_source", None)
        if source is not None and not source.is_module():
            raise ValueError(
                "BatchSizeFinder: the training dataloader was passed to trainer.fit(...) "
                "already built, so its batch size cannot change; build it in the "
                f"LightningModule's or LightningDataModule's train_dataloader() from self.{name}"
            )
        if not _utilities(trainer, "parsing").lightning_hasattr(pl_module, name):
            raise ValueError(
                f"BatchSizeFinder(batch_arg_name={name!r}): {type(pl_module).__name__} has no "
                f"attribute {name!r}, nor its hparams, nor the datamodule; set "
                f"self.{name} = ... in __init__ (or save_hyperparameters() with a {name} "
                "argument) and build the train_dataloader() from it, or pass the attribute's "
                "name as batch_arg_name="
            )

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """Search, set the batch size where it is read, and rebuild the dataloaders."""
        probe = _Probe(trainer, pl_module, self.batch_arg_name)
        plan = SearchPlan(
            owner="BatchSizeFinder",
            step=probe.step,
            trace=probe.trace,
            restore=(pl_module, *probe.optimizers, *probe.schedulers),
            device=probe.device,
            start=probe.original,
            cap=min((c for c in (self.batch_limit, probe.samples.length) if c), default=None),
        )
        result = run_search(plan, budget=self.budget, margin=self.margin)
        probe.set_batch_size(result.batch_size)
        probe.reset_dataloaders()
        self.result = result
        log.info(
            "BatchSizeFinder: %s = %d (predicted %s, %d real steps, %d out of memory)",
            self.batch_arg_name,
            result.batch_size,
            result.predicted,
            result.real_steps,
            result.ooms,
        )


class _Probe:
    """One module's step, its batches, and where its batch size lives."""

    def __init__(self, trainer: Any, module: Any, name: str) -> None:
        self.trainer = trainer
        self.module = module
        self.name = name
        self.parsing = _utilities(trainer, "parsing")
        value = self.parsing.lightning_getattr(module, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f"BatchSizeFinder: {name} is {value!r}; expected a whole number >= 1, the "
                f"batch size train_dataloader() reads (set self.{name} = 32, say, in __init__)"
            )
        self.original = value
        self.optimizers = list(trainer.optimizers)
        self.schedulers = [config.scheduler for config in trainer.lr_scheduler_configs]
        self.device = torch.device(trainer.strategy.root_device)
        self.samples = self._samples()

    # -- batches --------------------------------------------------------------------

    def _loader(self) -> Any:
        source = getattr(self.trainer.fit_loop, "_data_source", None)
        owner = getattr(source, "instance", None)
        if owner is None:
            owner = self.trainer.datamodule or self.module
        return owner.train_dataloader()

    def _samples(self) -> Samples:
        loader = self._loader()
        if not isinstance(loader, torch.utils.data.DataLoader):
            raise TypeError(
                "BatchSizeFinder: train_dataloader() returned a "
                f"{type(loader).__name__}; torchfit needs a single torch DataLoader to draw "
                "batches of any size from (several training loaders are not supported)"
            )
        if loader.batch_size is not None and loader.batch_size != self.original:
            raise ValueError(
                f"BatchSizeFinder: train_dataloader() built a DataLoader with batch_size="
                f"{loader.batch_size} while {self.name} is {self.original}; the loader must "
                f"read it (DataLoader(..., batch_size=self.{self.name})) for a new size to "
                "take effect"
            )
        collate = loader.collate_fn or torch.utils.data.default_collate
        return Samples(loader.dataset, collate)

    def set_batch_size(self, batch_size: int) -> None:
        """Set the attribute on every holder, as Lightning's finder does."""
        self.parsing.lightning_setattr(self.module, self.name, batch_size)

    def reset_dataloaders(self) -> None:
        """Drop loaders built at the old size; the loops rebuild them when they run."""
        loops = (self.trainer.fit_loop, self.trainer.fit_loop.epoch_loop.val_loop)
        for loop in loops:
            if getattr(loop, "_combined_loader", None) is not None:
                loop._combined_loader = None  # noqa: SLF001 - Lightning's own finder does this

    # -- the step ---------------------------------------------------------------------

    def _context(self, *, fake: bool) -> Callable[[], contextlib.AbstractContextManager[Any]]:
        dtype = _MIXED.get(str(self.trainer.precision))
        if fake and dtype is not None:
            # Fake tensors are CPU tensors: CUDA autocast would not touch them.
            return lambda: torch.autocast("cpu", dtype=dtype)
        return self.trainer.precision_plugin.train_step_context  # type: ignore[no-any-return]

    def _run(
        self, module: Any, optimizers: list[Any], schedulers: list[Any], batch: Any, *, fake: bool
    ) -> None:
        context = self._context(fake=fake)
        trainer = self.trainer
        with _probing(module, optimizers, schedulers):
            if not module.automatic_optimization:
                with context():
                    module.training_step(batch, 0)
                return
            optimizer = optimizers[0] if optimizers else None
            accumulating = trainer.accumulate_grad_batches > 1

            def closure() -> torch.Tensor | None:
                with context():
                    loss = _loss(module.training_step(batch, 0))
                if optimizer is not None and not accumulating:
                    optimizer.zero_grad()  # after the forward: Lightning's order
                if loss is not None:
                    module.backward(loss)
                    self._clip(module)
                return loss

            if optimizer is None:
                closure()
            else:
                optimizer.step(closure)

    def _clip(self, module: Any) -> None:
        value = self.trainer.gradient_clip_val
        if not value:
            return
        params = [p for p in module.parameters() if p.grad is not None]
        if str(self.trainer.gradient_clip_algorithm) in ("value", "GradClipAlgorithmType.VALUE"):
            torch.nn.utils.clip_grad_value_(params, value)
        else:
            torch.nn.utils.clip_grad_norm_(params, value)

    def step(self, batch_size: int, _accumulation_steps: int = 1) -> None:
        """One real step at ``batch_size`` on the device, through the transfer hooks."""
        batch = self.trainer.strategy.batch_to_device(self.samples.batch(batch_size))
        self._run(self.module, self.optimizers, self.schedulers, batch, fake=False)

    def trace(self, batch_size: int) -> MemoryEstimate:
        """The step's peak at ``batch_size``, traced on fake copies."""
        batch = self.samples.batch(batch_size)
        try:  # the transfer hooks, on meta tensors: no memory, no device
            batch = self.trainer.strategy.batch_to_device(batch, torch.device("meta"))
        except (RuntimeError, NotImplementedError, TypeError):
            batch = move_to(batch, torch.device("cpu"))
        trainer = self.trainer

        def fake_step(
            module: Any, optimizers: list[Any], schedulers: list[Any], batch: Any
        ) -> None:
            module.trainer = trainer  # the deep copy drops it; training_step may read it
            if hasattr(module, "_device"):
                module._device = torch.device("cpu")  # noqa: SLF001 - fake tensors live on the CPU
            self._run(module, optimizers, schedulers, batch, fake=True)

        device = "cuda" if self.device.type == "cuda" else "cpu"
        traced = trace_step(
            fake_step, self.module, self.optimizers, self.schedulers, batch, device=device
        )
        return traced.estimate
