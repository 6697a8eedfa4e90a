"""The optimizer step fused into backward: each parameter steps as soon as its gradient is ready.

torchtune's ``optimizer_in_bwd`` builds one optimizer per parameter and steps it from
the parameter's ``register_post_accumulate_grad_hook``, then frees the gradient, so no
moment of the step holds every gradient at once (PyTorch tutorial "How to save memory by
fusing the optimizer step into the backward pass",
``tutorials/intermediate_source/optimizer_step_in_backward_tutorial.py``).
`InBackward` does the same for a step that torchfit runs (`run_step`): from an optimizer
over all parameters it makes one per parameter, with that parameter's group settings.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator

import torch

__all__ = ["InBackward", "fused_if_asked"]


class InBackward:
    """One optimizer per trainable parameter, stepped from its post-accumulate-grad hook.

    Args:
        optimizer: An optimizer over the parameters; its class and each group's settings
            are used, and any state it already holds moves to the per-parameter copies.

    Raises:
        TypeError: The optimizer's class cannot be rebuilt from its group settings.

    Example:
        >>> net = torch.nn.Linear(4, 2)
        >>> fused = InBackward(torch.optim.SGD(net.parameters(), lr=0.1))
        >>> with fused.attached():
        ...     net(torch.ones(3, 4)).sum().backward()
        >>> net.weight.grad is None  # stepped and freed during backward
        True
    """

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                "optimizer_in_backward needs a torch.optim.Optimizer to split per parameter; "
                f"got {type(optimizer).__name__}"
            )
        self.name = type(optimizer).__name__
        self.per_parameter: dict[torch.Tensor, torch.optim.Optimizer] = {}
        # the group's settings that the constructor takes (AdamW's defaults also record
        # decoupled_weight_decay, which only Adam's constructor accepts)
        accepted = inspect.signature(type(optimizer)).parameters
        for group in optimizer.param_groups:
            settings = {k: v for k, v in group.items() if k in accepted and k != "params"}
            for param in group["params"]:
                if not param.requires_grad:
                    continue
                try:
                    single = type(optimizer)([param], **settings)
                except TypeError as error:
                    raise TypeError(
                        f"{self.name} cannot be rebuilt for one parameter from its settings "
                        f"({error}); use optimizer_in_backward=False for this optimizer"
                    ) from error
                if param in optimizer.state:
                    single.state[param] = optimizer.state[param]
                self.per_parameter[param] = single

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The per-parameter optimizers, in parameter order."""
        return list(self.per_parameter.values())

    @contextlib.contextmanager
    def attached(self) -> Iterator[None]:
        """Step and free each gradient from its hook while the block runs; hooks removed after."""

        def step(param: torch.Tensor) -> None:
            single = self.per_parameter[param]
            single.step()
            single.zero_grad(set_to_none=True)

        handles = [
            param.register_post_accumulate_grad_hook(step)  # type: ignore[no-untyped-call]
            for param in self.per_parameter
        ]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()


def fused_if_asked(
    optimizer: torch.optim.Optimizer | None, *, in_backward: bool, training: bool
) -> torch.optim.Optimizer | InBackward | None:
    """The optimizer a step runs: split per parameter when the loop steps in backward.

    Raises:
        ValueError: ``optimizer_in_backward=True`` for inference or without an optimizer.
    """
    if not in_backward:
        return optimizer
    if not training:
        raise ValueError(
            "optimizer_in_backward=True describes a training step; inference has no backward "
            "(drop it, or use mode='train')"
        )
    if optimizer is None:
        raise ValueError(
            "optimizer_in_backward=True needs an optimizer to step in backward; got "
            "optimizer=None (pass e.g. optimizer='adamw')"
        )
    return InBackward(optimizer)
