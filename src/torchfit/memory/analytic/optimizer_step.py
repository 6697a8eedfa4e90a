"""The optimizer step's temporaries: what ``torch.optim``'s Adam allocates beside its state.

One rule for every closed form (the transformer's in `torchfit.memory.analytic.training`,
any module's in `torchfit.memory.modules.peak`), from torch 2.13's torch/optim/adam.py
(`torchfit._core.optimizers.AdamImplementation` has the line-by-line reading):

================  ===================================  ================================
implementation    a whole step                         one parameter stepped alone
================  ===================================  ================================
foreach           the denominators of every parameter  that parameter's denominators
for-loop          the largest parameter, twice         that parameter, twice
fused             nothing parameter-sized              nothing parameter-sized
================  ===================================  ================================

All in the state's dtype (the parameters'). Measured on CPU, where all three run
(``foreach=True`` takes the same path as CUDA's default, one tensor op at a time): a
4.2M-parameter Llama with a 2.05M-element embedding held 1.000, 0.982 (= 2 x 2.05M /
4.17M) and 0.0003 times its parameters' bytes above its states at the step (torch 2.13
CPU; tests/memory/analytic/test_adam_implementations.py holds each within 6%).
"""

from __future__ import annotations

import math

from torchfit._core.optimizers import AdamImplementation, OptimizerName, adam_implementation

__all__ = ["adam_step_temporaries"]


def adam_step_temporaries(
    optimizer: OptimizerName,
    *,
    device: str,
    trainable: int,
    largest: int,
    elem: float,
    per_parameter: bool = False,
    notes: list[str] | None = None,
) -> int:
    """Bytes of the temporaries of Adam's step (0 for other optimizers).

    Args:
        optimizer: The optimizer; its implementation, or torch's default on ``device``.
        device: ``"cuda"`` or ``"cpu"`` (torch's default: foreach, or the for-loop).
        trainable: Trained parameters (elements).
        largest: Elements of the largest trained parameter tensor.
        elem: Bytes per element of the state (the parameters' dtype).
        per_parameter: Each parameter is stepped alone (the step in backward), so a
            foreach list holds one parameter.
        notes: Where to say which implementation was counted.

    Example:
        >>> adam_step_temporaries(OptimizerName.ADAMW, device="cuda", trainable=10, largest=6,
        ...                       elem=4)
        40
        >>> adam_step_temporaries(OptimizerName.ADAMW_FOR_LOOP, device="cuda", trainable=10,
        ...                       largest=6, elem=4)
        48
    """
    implementation = adam_implementation(optimizer, device)
    if implementation is None:
        return 0
    largest = min(largest, trainable)
    elements = {
        AdamImplementation.FOREACH: largest if per_parameter else trainable,
        AdamImplementation.FOR_LOOP: 2 * largest,
        AdamImplementation.FUSED: 0,
    }[implementation]
    if notes is not None:
        notes.append(_NOTES[implementation, optimizer is optimizer.base])
    return math.ceil(elements * elem)


# What the estimate's notes say of each implementation, named or torch's default.
_NOTES = {
    (AdamImplementation.FOREACH, True): "optimizer step: foreach temporaries (CUDA default)",
    (AdamImplementation.FOR_LOOP, True): "optimizer step: one tensor at a time (CPU default)",
    (AdamImplementation.FOREACH, False): "optimizer step: foreach temporaries (foreach=True)",
    (AdamImplementation.FOR_LOOP, False): "optimizer step: one tensor at a time (foreach=False)",
    (
        AdamImplementation.FUSED,
        False,
    ): "optimizer step: one fused kernel, no temporaries (fused=True)",
}
