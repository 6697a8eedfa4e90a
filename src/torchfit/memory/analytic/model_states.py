"""Closed forms in bytes of the model states: weights, gradients, optimizer state.

Pure functions of parameter counts, dtypes and the optimizer's name: what each optimizer
keeps per parameter (torch.optim, bitsandbytes, the factored Adafactor), master weights
under mixed precision, and the autocast copies. Checked against real optimizers' state in
``tests/memory/analytic/test_formulas.py``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from torchfit._core import checks
from torchfit._core.step import OptimizerName, parse_optimizer
from torchfit._core.units import DType, parse_dtype
from torchfit.memory.analytic.formulas import FP32

__all__ = ["ModelStates", "factored_state_bytes", "model_state_bytes", "optimizer_state_bytes"]


@dataclasses.dataclass(frozen=True)
class ModelStates:
    """Weights, gradients and optimizer state in bytes, with the rule that produced them."""

    weights: int
    gradients: int
    optimizer: int
    autocast_copies: int
    note: str


def factored_state_bytes(shapes: Sequence[tuple[int, ...]], *, itemsize: float) -> int:
    """Adafactor's second moment: a row and a column vector per matrix, the full vector else.

    ``torch.optim.Adafactor`` keeps ``row_var`` of ``shape[:-1]`` and ``col_var`` of
    ``shape[:-2] + shape[-1:]`` for a tensor of two or more dimensions, ``variance`` of the
    whole shape for a vector, each in the parameter's dtype, plus a float32 ``step``
    (torch/optim/_adafactor.py, ``_init_group``).

    Example:
        >>> factored_state_bytes([(4096, 4096), (4096,)], itemsize=4)  # 2 x 4096 + 4096 + 2 steps
        49160
    """
    total = 0
    for shape in shapes:
        if len(shape) >= 2:
            rows = math.prod(shape[:-1])
            cols = math.prod(shape[:-2]) * shape[-1]
            total += math.ceil((rows + cols) * itemsize)
        else:
            total += math.ceil(math.prod(shape) * itemsize)
        total += FP32
    return total


@checks.arguments(shapes=checks.each(checks.shape(at_least=0)))
def optimizer_state_bytes(
    optimizer: str | OptimizerName | None,
    *,
    trainable: int,
    param_dtype: DType,
    num_tensors: int = 0,
    large_tensor_params: int | None = None,
    shapes: Sequence[tuple[int, ...]] | None = None,
) -> int:
    """Optimizer state for ``trainable`` parameters held in ``param_dtype``.

    SGD keeps nothing; momentum one buffer; Adam/AdamW two moments in the parameter's
    dtype plus a 4-byte ``step`` tensor per parameter tensor (torch.optim keeps ``step``
    as a float32 scalar tensor). bitsandbytes' 8-bit AdamW (paged or not) keeps two uint8
    moments with an fp32 absmax per 256-element block, for tensors of at least 4096
    elements (``min_8bit_size``); smaller ones get fp32 moments. bitsandbytes' 32-bit
    optimizers (``PagedAdamW``, ``Lion``) keep their moments in fp32 whatever the
    parameter's dtype (two for AdamW, one for Lion). Adafactor needs the tensors'
    ``shapes`` (see `factored_state_bytes`); without them every tensor is taken as a
    square matrix of ``trainable / num_tensors`` elements.

    Example:
        >>> optimizer_state_bytes("adamw", trainable=10**6, param_dtype=DType.BF16)
        4000000
        >>> optimizer_state_bytes("paged-adamw", trainable=10**6, param_dtype=DType.BF16)
        8000000
    """
    name = parse_optimizer(optimizer).base  # the implementation keeps the same state
    per_element = {
        OptimizerName.NONE: 0.0,
        OptimizerName.SGD: 0.0,
        OptimizerName.SGD_MOMENTUM: param_dtype.itemsize,
        OptimizerName.PAGED_ADAMW: 2.0 * FP32,
        OptimizerName.LION: 1.0 * FP32,
    }
    if name in per_element:
        return math.ceil(trainable * per_element[name])
    if name in {OptimizerName.ADAM, OptimizerName.ADAMW}:
        return math.ceil(2 * trainable * param_dtype.itemsize) + FP32 * num_tensors
    if name is OptimizerName.ADAFACTOR:
        if shapes is None:
            count = max(num_tensors, 1)
            side = math.isqrt(max(trainable // count, 1))
            shapes = [(side, side)] * count
        return factored_state_bytes(shapes, itemsize=param_dtype.itemsize)
    big = trainable if large_tensor_params is None else large_tensor_params
    small = trainable - big
    blockwise = 2 * (big + FP32 * math.ceil(big / 256))
    return blockwise + 2 * small * FP32 + FP32 * num_tensors


@checks.arguments(shapes=checks.each(checks.shape(at_least=0)))
def model_state_bytes(
    *,
    params: int,
    trainable: int | None = None,
    dtype: str | DType = "fp32",
    mixed_precision: bool = False,
    optimizer: str | OptimizerName | None = "adamw",
    training: bool = True,
    num_tensors: int = 0,
    autocast_params: int = 0,
    shapes: Sequence[tuple[int, ...]] | None = None,
) -> ModelStates:
    """Weights, gradients and optimizer state of a model.

    Args:
        params: All parameters (frozen included).
        trainable: Parameters that get gradients and optimizer state (all by default;
            fewer with frozen layers or LoRA).
        dtype: The compute dtype.
        mixed_precision: Autocast training with fp32 weights (``torch.autocast``): weights,
            gradients and state stay fp32, and the forward keeps a 16-bit copy of the
            weights autocast casts (``autocast_params`` of them). ``False`` with a 16-bit
            dtype means the model itself is 16-bit ("pure" bf16/fp16).
        optimizer: An optimizer name (see `OptimizerName`).
        training: ``False`` counts weights only.
        num_tensors: Number of trainable parameter tensors (for per-tensor state).
        autocast_params: Parameters that autocast casts to 16 bits (Linear/conv weights).
        shapes: Shapes of the trainable tensors (Adafactor's factored state needs them).

    Example:
        >>> s = model_state_bytes(params=10**9, dtype="fp32", optimizer="adamw")
        >>> (s.weights + s.gradients + s.optimizer) / 10**9  # 16 bytes per parameter
        16.0
    """
    if params < 0:
        raise ValueError(f"params must be >= 0; got {params}")
    train = params if trainable is None else trainable
    if not 0 <= train <= params:
        raise ValueError(f"trainable must be between 0 and params={params}; got {train}")
    compute = parse_dtype(dtype)
    if compute.is_quantized:
        raise ValueError(
            f"dtype {compute.value!r} is a weight format, not a compute dtype; quantized "
            "weights are counted by torchfit.quantize.quantized_footprint"
        )
    master = mixed_precision and compute.bits == 16
    param_dtype = compute.master(mixed=mixed_precision)
    weights = math.ceil(params * param_dtype.itemsize)
    if not training:
        return ModelStates(weights, 0, 0, 0, f"weights in {param_dtype.value}")
    gradients = math.ceil(train * param_dtype.itemsize)
    state = optimizer_state_bytes(
        optimizer, trainable=train, param_dtype=param_dtype, num_tensors=num_tensors, shapes=shapes
    )
    copies = math.ceil(autocast_params * compute.itemsize) if master else 0
    note = (
        f"mixed precision: fp32 weights, gradients and state; {compute.value} autocast copies"
        if master
        else f"weights, gradients and optimizer state in {param_dtype.value}"
    )
    return ModelStates(weights, gradients, state, copies, note)
