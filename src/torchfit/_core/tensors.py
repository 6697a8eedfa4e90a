"""Every tensor reachable from a user's objects: one walk shared by measure, trace, batch.

`reachable_tensors` is that walk. `own_tensors` is one step of it for a single module,
for counters that report module by module (the quantized footprints, device maps).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch
from torch import nn

__all__ = ["check_materialized", "own_tensors", "reachable_tensors"]


def _children(obj: object) -> list[object]:
    """What `reachable_tensors` looks into, one level down."""
    if isinstance(obj, nn.Module):
        return [*obj.parameters(), *obj.buffers()]
    if isinstance(obj, torch.optim.Optimizer):
        return [group["params"] for group in obj.param_groups] + list(obj.state.values())
    if isinstance(obj, Mapping):
        return list(obj.values())
    if isinstance(obj, list | tuple | set | frozenset):
        return list(obj)
    return []


def reachable_tensors(obj: object, seen: set[int] | None = None) -> Iterator[torch.Tensor]:
    """Every tensor reachable from ``obj`` through modules, optimizers and containers.

    Modules give their parameters and buffers, optimizers their parameters and state,
    mappings and sequences their items, and tensors their ``.grad`` too. Each tensor
    object is yielded once.

    Example:
        >>> net = torch.nn.Linear(2, 2)
        >>> len(list(reachable_tensors([net, {"w": net.weight}])))
        2
    """
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield obj
        if obj.grad is not None:
            yield from reachable_tensors(obj.grad, seen)
        return
    for child in _children(obj):
        yield from reachable_tensors(child, seen)


def own_tensors(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for the parameters, then the buffers, registered on ``module`` itself.

    Example:
        >>> [name for name, _ in own_tensors(torch.nn.BatchNorm1d(2))][:3]
        ['weight', 'bias', 'running_mean']
    """
    yield from module.named_parameters(recurse=False)
    yield from module.named_buffers(recurse=False)


def check_materialized(model: nn.Module, *, what: str = "torchfit") -> None:
    """Refuse a model whose lazy modules (``nn.LazyLinear``, ...) have no shapes yet.

    Raises:
        ValueError: naming the first uninitialized parameter and the fix.

    Example:
        >>> check_materialized(torch.nn.Sequential(torch.nn.LazyLinear(4)))
        Traceback (most recent call last):
        ...
        ValueError: parameter '0.weight' of LazyLinear is not initialized yet ...
    """
    for name, param in model.named_parameters():
        if isinstance(param, nn.parameter.UninitializedParameter):
            owner = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
            raise ValueError(  # noqa: TRY004 - a value (the model) not ready, not a wrong type
                f"parameter {name!r} of {type(owner).__name__} is not initialized yet (a lazy "
                f"module): its shape comes from the first forward, so {what} cannot size it. "
                "Run the model once on a real batch (model(x)) before estimating it"
            )
