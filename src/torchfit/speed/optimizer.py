"""The optimizer step's kernels, in closed form: bytes read and written per parameter.

An optimizer step is memory-bound: each kernel streams the parameters, gradients and
state it touches. The element counts per kernel below follow the implementations:

- ``torch.optim.AdamW`` foreach (PyTorch's default on CUDA; ``_multi_tensor_adam`` in
  ``torch/optim/adam.py``, which AdamW shares since torch 2.6): ``_foreach_mul_`` (weight decay,
  param r+w), ``_foreach_lerp_`` (exp_avg r+w, grad r), ``_foreach_mul_`` (exp_avg_sq
  r+w), ``_foreach_addcmul_`` (exp_avg_sq r+w, grad r), ``_foreach_sqrt`` (exp_avg_sq
  r, new list w), ``_foreach_div_`` and ``_foreach_add_`` (that list r+w each),
  ``_foreach_addcdiv_`` (param r+w, exp_avg r, list r): 4 parameter, 2 gradient and
  14 state-sized passes. Adam leaves out the weight-decay multiply.
- AdamW ``fused=True`` (``_fused_adamw_``): one pass reading parameter, gradient and
  both moments and writing parameter and moments (4 + 3). ``foreach=False``: the same
  passes as foreach, one parameter at a time (one launch per kernel per parameter).
- SGD with momentum foreach (``_multi_tensor_sgd``): ``_foreach_mul_`` (buffer r+w),
  ``_foreach_add_`` (buffer r+w, grad r), ``_foreach_add_`` (param r+w, buffer r).
  Plain SGD: one ``_foreach_add_`` (param r+w, grad r).
- bitsandbytes' optimizers run one kernel per parameter, and the host waits for each
  (``torch.cuda.synchronize()`` after every parameter: `torchfit.speed.dispatch`):
  8-bit AdamW (``optimizer_update_8bit_blockwise``) reads parameter, gradient and two
  uint8 moments and writes parameter and moments, tensors under 4096 elements keeping
  32-bit state (``min_8bit_size``); paged 32-bit AdamW (``optimizer_update_32bit``) the
  same with two fp32 moments; Lion (one fp32 moment) parameter r+w, gradient r, moment
  r+w. Adafactor (``torch.optim.Adafactor``): parameter r+w, gradient r twice (the
  square and the update), factored state negligible.

Multi-tensor kernels launch once per 320 chunks of 65,536 elements, or per list of at
most 36 tensors for four lists (``multi_tensor_apply.cuh``: ``depth_to_max_blocks`` and
``depth_to_max_tensors``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torchfit._core.optimizers import BITSANDBYTES_OPTIMIZERS, AdamImplementation
from torchfit._core.step import OptimizerName
from torchfit.speed.dispatch import SYNCHRONIZED
from torchfit.speed.ops import Op, OpKind, Phase

__all__ = ["OPTIMIZER_IMPLEMENTATIONS", "implementation_of", "optimizer_ops"]

#: How torch.optim runs a step: multi-tensor (CUDA's default), one fused kernel, a loop.
OPTIMIZER_IMPLEMENTATIONS = ("foreach", "fused", "loop")

_CHUNK = 65536  # elements per block (multi_tensor_apply.cuh, kChunkSize)
_BLOCKS_PER_LAUNCH = 320  # depth_to_max_blocks
_TENSORS_PER_LAUNCH = 36  # depth_to_max_tensors at depth 4
_MIN_8BIT_SIZE = 4096  # bitsandbytes keeps 32-bit state below this many elements

# (parameter, gradient, state) passes of each kernel, per optimizer (module docstring).
_PASSES: dict[OptimizerName, tuple[tuple[str, int, int, int], ...]] = {
    OptimizerName.ADAMW: (
        ("weight_decay", 2, 0, 0),
        ("lerp_exp_avg", 0, 1, 2),
        ("mul_exp_avg_sq", 0, 0, 2),
        ("addcmul_exp_avg_sq", 0, 1, 2),
        ("sqrt", 0, 0, 2),
        ("div", 0, 0, 2),
        ("add_eps", 0, 0, 2),
        ("addcdiv", 2, 0, 2),
    ),
    OptimizerName.SGD_MOMENTUM: (
        ("mul_buffer", 0, 0, 2),
        ("add_buffer", 0, 1, 2),
        ("add_param", 2, 0, 1),
    ),
    OptimizerName.SGD: (("add_param", 2, 1, 0),),
    OptimizerName.ADAFACTOR: (("adafactor", 2, 2, 0),),
}
_PASSES[OptimizerName.ADAM] = _PASSES[OptimizerName.ADAMW][1:]
_FUSED_ADAMW = (("fused_adamw", 2, 1, 4),)


#: This module's word for each implementation an optimizer's name can carry.
_NAMED = {
    AdamImplementation.FOREACH: "foreach",
    AdamImplementation.FUSED: "fused",
    AdamImplementation.FOR_LOOP: "loop",
}


def implementation_of(optimizer: OptimizerName | None, implementation: str) -> str:
    """The implementation a step runs: the name's own (``"adamw-fused"``), or ``implementation``.

    Example:
        >>> implementation_of(OptimizerName.ADAMW_FOR_LOOP, "foreach")
        'loop'
        >>> implementation_of(OptimizerName.ADAMW, "fused")
        'fused'
    """
    if optimizer is None:
        return implementation
    return _NAMED.get(optimizer.implementation, implementation)


def _launches(elements: int, tensors: int) -> int:
    """Kernel launches of one multi-tensor op over ``tensors`` tensors of ``elements``."""
    blocks = math.ceil(elements / _CHUNK)
    return max(1, math.ceil(blocks / _BLOCKS_PER_LAUNCH), math.ceil(tensors / _TENSORS_PER_LAUNCH))


def optimizer_ops(
    optimizer: OptimizerName | None,
    sizes: Sequence[int],
    *,
    param_bytes: int,
    state_bytes: int,
    implementation: str = "foreach",
) -> tuple[Op, ...]:
    """The kernels of one optimizer step over trainable tensors of ``sizes`` elements.

    Args:
        optimizer: Which optimizer (None or ``NONE``: no step).
        sizes: Elements of each trainable parameter tensor.
        param_bytes: Bytes per element of the parameters and gradients (2 or 4).
        state_bytes: Bytes per element of 32-bit-style state (the parameter dtype in
            ``torch.optim``: 2 for ``*-true`` 16-bit training, else 4).
        implementation: ``"foreach"``, ``"fused"`` (AdamW/Adam only) or ``"loop"``; a
            name that carries one (``"adamw-fused"``) overrides it (`implementation_of`).

    Returns:
        Memory-bound `Op` rows of the optimizer phase (one per kernel and launch shape).

    Example:
        >>> ops = optimizer_ops(OptimizerName.ADAMW, [1000] * 4, param_bytes=4, state_bytes=4)
        >>> len(ops), sum(op.bytes * op.count for op in ops) / 4000  # bytes per parameter
        (8, 80.0)
    """
    if optimizer is None or optimizer is OptimizerName.NONE or not sizes:
        return ()
    implementation = implementation_of(optimizer, implementation)
    optimizer = optimizer.base
    total = int(sum(sizes))
    ops: list[Op] = []
    if optimizer in BITSANDBYTES_OPTIMIZERS:
        return tuple(_bitsandbytes_ops(optimizer, sizes, param_bytes))
    fused = implementation == "fused" and optimizer in {OptimizerName.ADAMW, OptimizerName.ADAM}
    passes = _FUSED_ADAMW if fused else _PASSES[optimizer]
    for name, p, g, s in passes:
        per_element = p * param_bytes + g * param_bytes + s * state_bytes
        if implementation == "loop" and not fused:
            ops.extend(
                Op(name, OpKind.MEMORY, Phase.OPTIMIZER, 0.0, size * per_element, "fp32")
                for size in sizes
            )
            continue
        launches = _launches(total, len(sizes))
        moved = total * per_element / launches
        ops.append(Op(name, OpKind.MEMORY, Phase.OPTIMIZER, 0.0, moved, "fp32").times(launches))
    return tuple(ops)


def _bitsandbytes_ops(optimizer: OptimizerName, sizes: Sequence[int], param_bytes: int) -> list[Op]:
    """One synchronized kernel per parameter, its bytes those it streams (module notes)."""
    eight_bit = optimizer in {OptimizerName.ADAMW_8BIT, OptimizerName.PAGED_ADAMW_8BIT}
    moments = 1 if optimizer is OptimizerName.LION else 2
    name = {OptimizerName.LION: "lion"}.get(optimizer, "adamw_8bit" if eight_bit else "adamw")
    ops = []
    for size in sizes:
        state = 1 if eight_bit and size >= _MIN_8BIT_SIZE else 4
        moved = float(size * (3 * param_bytes + 2 * moments * state))
        ops.append(
            Op(name, OpKind.MEMORY, Phase.OPTIMIZER, 0.0, moved, "fp32", backend=SYNCHRONIZED)
        )
    return ops
