"""What a batch-size probe needs around each trial step: state snapshots, meters, agreement.

* `Snapshot` copies what the user named (modules, optimizers, tensors, anything with
  ``state_dict``/``load_state_dict``) and every RNG (torch CPU and CUDA, ``random``,
  numpy) to host memory, and writes it back bitwise, in place where it can, after each
  trial; a module's training modes and its parameters' ``requires_grad`` too. Copies
  are taken with simulated cards paused: on a real GPU they live in host memory, so
  they must not eat the simulated card.
* `Meter` reads the memory a trial used: the innermost `simulate_gpu` if one is active,
  else CUDA's allocator statistics, else nothing.
* `agree_min` makes every rank of an initialized process group take the same value.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from torchfit._core.rng import rng_snapshot
from torchfit._core.units import parse_bytes
from torchfit.memory.batch.simulate import active_simulator, paused

__all__ = ["Meter", "Snapshot", "agree_min", "cuda_ready"]


def cuda_ready() -> bool:
    """True when CUDA is available and already initialized (never initializes it)."""
    return torch.cuda.is_available() and bool(torch.cuda.is_initialized())  # type: ignore[no-untyped-call]


def _host(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to("cpu", copy=True)


def _put(target: torch.Tensor | None, saved: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Write ``saved`` into ``target`` in place when shapes agree, else a copy on ``device``."""
    if (
        target is not None
        and target.shape == saved.shape
        and target.dtype == saved.dtype
        and target.device == device
    ):
        with torch.no_grad():
            target.copy_(saved)
        return target
    return saved.to(device, copy=True)


def _host_tree(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (_host(value), value.device)
    if isinstance(value, dict):
        return {key: _host_tree(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_host_tree(item) for item in value)
    return copy.deepcopy(value)


def _device_tree(value: Any) -> Any:
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], torch.device):
        return value[0].to(value[1], copy=True)
    if isinstance(value, dict):
        return {key: _device_tree(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_device_tree(item) for item in value)
    return copy.deepcopy(value)


def _snap_module(module: nn.Module) -> Callable[[], None]:
    tensors = [(t, _host(t)) for t in (*module.parameters(), *module.buffers())]
    grads = [(p, None if p.grad is None else _host(p.grad)) for p in module.parameters()]
    frozen = [(p, p.requires_grad) for p in module.parameters()]
    modes = [(m, m.training) for m in module.modules()]

    def restore() -> None:
        for tensor, saved in tensors:
            with torch.no_grad():
                tensor.copy_(saved)
        for param, requires_grad in frozen:
            param.requires_grad_(requires_grad)
        for param, grad in grads:
            param.grad = None if grad is None else _put(param.grad, grad, param.device)
        for sub, training in modes:
            sub.training = training

    return restore


def _snap_optimizer(optimizer: torch.optim.Optimizer) -> Callable[[], None]:
    state = {
        param: {key: _host_tree(value) for key, value in entry.items()}
        for param, entry in optimizer.state.items()
    }
    groups = [
        {key: copy.deepcopy(value) for key, value in group.items() if key != "params"}
        for group in optimizer.param_groups
    ]

    def restore() -> None:
        for param in [p for p in optimizer.state if p not in state]:
            del optimizer.state[param]  # state the trial created
        for param, saved in state.items():
            current = optimizer.state[param]
            for key in [k for k in current if k not in saved]:
                del current[key]
            for key, value in saved.items():
                if (
                    isinstance(value, tuple)
                    and len(value) == 2
                    and isinstance(value[1], torch.device)
                ):
                    old = current.get(key)
                    old = old if isinstance(old, torch.Tensor) else None
                    current[key] = _put(old, value[0], value[1])
                else:
                    current[key] = _device_tree(value)
        for group, saved_group in zip(optimizer.param_groups, groups, strict=True):
            group.update(copy.deepcopy(saved_group))

    return restore


def _snap_tensor(tensor: torch.Tensor) -> Callable[[], None]:
    saved = _host(tensor)
    grad = None if tensor.grad is None else _host(tensor.grad)
    requires_grad = tensor.requires_grad

    def restore() -> None:
        with torch.no_grad():
            tensor.copy_(saved)
        if tensor.is_leaf:
            tensor.requires_grad_(requires_grad)
        if tensor.is_leaf or grad is not None:  # a non-leaf's .grad warns when read
            tensor.grad = None if grad is None else _put(tensor.grad, grad, tensor.device)

    return restore


def _snap_stateful(obj: Any) -> Callable[[], None]:
    saved = _host_tree(obj.state_dict())

    def restore() -> None:
        obj.load_state_dict(_device_tree(saved))

    return restore


class Snapshot:
    """Host copies of user-owned state and RNGs, restored bitwise after each trial.

    Example:
        >>> net = torch.nn.Linear(4, 4)
        >>> before = net.weight.clone()
        >>> snap = Snapshot((net,))
        >>> with torch.no_grad():
        ...     _ = net.weight.add_(1.0)
        >>> snap.restore()
        >>> torch.equal(net.weight, before)
        True
    """

    def __init__(self, objects: tuple[object, ...]) -> None:
        """Snapshot ``objects`` and the RNG states now (host copies, not counted on a simulator)."""
        self.objects = objects
        with paused():
            self._restorers = [*(_snapshot_one(obj) for obj in objects), rng_snapshot()]

    def restore(self) -> None:
        """Write every saved value back (parameters in place, so optimizers keep them)."""
        for restore in self._restorers:
            restore()

    @property
    def has_fresh_optimizer(self) -> bool:
        """True when a named optimizer has no state yet (its first step will create it)."""
        return any(isinstance(obj, torch.optim.Optimizer) and not obj.state for obj in self.objects)


def _snapshot_one(obj: object) -> Callable[[], None]:
    if isinstance(obj, nn.Module):
        return _snap_module(obj)
    if isinstance(obj, torch.optim.Optimizer):
        return _snap_optimizer(obj)
    if isinstance(obj, torch.Tensor):
        return _snap_tensor(obj)
    if callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    ):
        return _snap_stateful(obj)
    raise TypeError(
        f"restore= got a {type(obj).__name__}, which torchfit cannot snapshot; pass modules, "
        "optimizers, tensors, or objects with state_dict()/load_state_dict() "
        "(LR schedulers, GradScaler)"
    )


_TRIED = re.compile(r"Tried to allocate ([0-9.]+ ?[KMGT]?i?B)")


class Meter:
    """Bytes resident before a trial, its peak, and on OOM a lower bound of its demand."""

    def __init__(self) -> None:
        """Read peaks from the active simulator, else from CUDA when it is ready."""
        self.card = active_simulator()
        self.cuda = self.card is None and cuda_ready()

    @property
    def measures(self) -> bool:
        """True when trials can be measured (a simulated card or CUDA)."""
        return self.card is not None or self.cuda

    def start(self) -> int | None:
        """Reset the peak; return the bytes resident now."""
        if self.card is not None:
            self.card.reset_peak()
            return self.card.live
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            return int(torch.cuda.memory_allocated())
        return None

    def live(self) -> int | None:
        """Bytes allocated now."""
        if self.card is not None:
            return self.card.live
        if self.cuda:
            return int(torch.cuda.memory_allocated())
        return None

    def peak(self) -> int | None:
        """Peak of allocated bytes since `start`."""
        if self.card is not None:
            return self.card.peak
        if self.cuda:
            torch.cuda.synchronize()
            return int(torch.cuda.max_memory_allocated())
        return None

    def demand(self, message: str) -> int | None:
        """After an OOM: bytes held plus the refused request, a lower bound on the need.

        The request is the card's own (a `simulate_gpu` refusal) or, for an error raised
        elsewhere, the ``Tried to allocate`` of its message.
        """
        found = _TRIED.search(message)
        tried = parse_bytes(found.group(1)) if found else 0
        if self.card is not None:
            return max(self.card.demand, self.card.peak + tried)
        if self.cuda:
            return int(torch.cuda.max_memory_allocated()) + tried
        return None


def agree_min(value: int) -> int:
    """The minimum of ``value`` over the ranks of the default process group (if any)."""
    import torch.distributed as dist  # noqa: PLC0415 - only when distributed is in use

    if not (dist.is_available() and dist.is_initialized()):
        return value
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if dist.get_backend() == "nccl"
        else torch.device("cpu")
    )
    with paused():
        agreed = torch.tensor([value], dtype=torch.int64, device=device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
        return int(agreed.item())
