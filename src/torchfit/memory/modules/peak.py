"""The peak of a step from one meta-device pass: a backward sweep over the layers.

`estimate_module` turns `activation_bytes` into the peak of a training step: layers
release their saved tensors in reverse order while gradients appear, and each layer's
backward holds its gradients and its kernel's scratch. `inference_peak` is the peak of
live tensors in a no-grad forward.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils._pytree import tree_map

from torchfit._core.step import Mode, OptimizerName, parse_mode, parse_optimizer
from torchfit._core.tensors import check_materialized
from torchfit._core.units import DType, parse_dtype
from torchfit.memory.analytic.formulas import FP32, model_state_bytes
from torchfit.memory.modules.live import LiveBytes
from torchfit.memory.modules.meta import sdpa_as_on_device, split_inputs, to_meta, training_flags
from torchfit.memory.modules.saved import LayerRecord, activation_bytes
from torchfit.memory.result import MemoryEstimate

__all__ = ["estimate_module", "inference_peak"]


_ONEDNN_SCRATCHPAD = 24 * 1024
_CONVS = {"Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d"}


def _backward_transient(record: LayerRecord, device: str) -> int:
    """Bytes a layer's backward holds beyond what is saved: gradients and scratch.

    The output gradient, the input gradient (only when the input requires grad), and for
    convolutions the kernel's own scratch, which no dispatch-level tracker sees. Measured
    on CPU (torch 2.13, x86 with AVX-512), single convolutions of 3-64 channels: oneDNN
    reorders the output gradient into a blocked layout padded to 16 channels, and the
    input into one padded to 8 (to 16 below 8 channels; not at all for a k>1 first layer
    of fewer than 8 channels): one output and one input more at 32 channels (FACTS.md),
    4x the output at 4 channels. ATen's im2col path (``slow_conv2d``) instead unfolds the
    input into (C_in/groups)·k·k·H_out·W_out columns.
    On CUDA, cuDNN's workspace depends on the algorithm; the oneDNN allowance is used.
    """
    grads = record.output_bytes + (record.input_bytes if record.input_requires_grad else 0)
    if record.kind not in _CONVS:
        return grads
    if device == "cpu" and _uses_im2col(record):
        columns = 0
        if math.prod(record.kernel) > 1:
            # one sample (the path is only taken for batch 1): C_in/g * k*k * H_out*W_out
            positions = record.output_bytes // max(1, record.out_channels)
            columns = record.input_shape[1] // record.groups * math.prod(record.kernel) * positions
        return grads + columns
    c_in = record.input_shape[1] if len(record.input_shape) > 1 else 1
    output = _blocked(record.output_bytes, record.out_channels, 16) + _ONEDNN_SCRATCHPAD
    if c_in < 8 and math.prod(record.kernel) > 1:
        return grads + output  # a first layer (RGB): oneDNN reads the plain input
    return grads + output + _blocked(record.input_bytes, c_in, 16 if c_in < 8 else 8)


def _blocked(nbytes: int, channels: int, block: int) -> int:
    """Bytes of a oneDNN blocked copy (nChw16c / nChw8c): channels padded to ``block``."""
    if channels <= 0:
        return nbytes
    return nbytes * (-(-channels // block) * block) // channels


def _uses_im2col(record: LayerRecord) -> bool:
    """ATen's CPU backend choice (``use_mkldnn`` in ConvUtils.h), for float convolutions.

    oneDNN runs with more than one thread unless the input is a single small sample
    with a kernel of at most 3x3 and no groups; that case takes the im2col path.
    """
    shape = record.input_shape
    if len(shape) != 4 or not record.kernel:
        return False
    big_kernel = all(k > 3 for k in record.kernel)
    return not (record.groups > 1 or big_kernel or shape[0] > 1 or math.prod(shape) > 20480)


def inference_peak(
    model: nn.Module,
    example_input: object,
    *,
    dtype: str | DType | None = None,
    device: str = "cuda",
) -> int:
    """Peak bytes of tensors alive at once during a no-grad forward, on the meta device.

    The input and the parameters are not counted (they exist before the call); the
    output is (it is alive when the forward returns).
    """
    check_materialized(model, what="the estimate")
    torch_dtype = None if dtype is None else parse_dtype(dtype).torch_dtype
    convert = to_meta(torch_dtype)
    made: dict[int, torch.Tensor] = {}  # tied weights: one meta tensor for all their names
    tensors = {
        n: made.setdefault(id(p), convert(p.detach()))
        for n, p in model.named_parameters(remove_duplicate=False)
    }
    tensors.update({n: convert(b) for n, b in model.named_buffers(remove_duplicate=False)})
    inputs = tree_map(convert, example_input)
    args, kwargs = split_inputs(inputs)
    counter = LiveBytes()
    counter.exclude((tensors, inputs))
    sdpa = sdpa_as_on_device(device=device, training=False)
    with training_flags(model, training=False), torch.no_grad(), sdpa, counter:
        output = torch.func.functional_call(model, tensors, args, kwargs, strict=False)
        del output
    return counter.peak


def estimate_module(
    model: nn.Module,
    *,
    batch_size: int,
    input_shape: tuple[int, ...] = (),
    dtype: str | DType = "fp32",
    mode: str = "train",
    optimizer: str | OptimizerName | None = "adamw",
    mixed_precision: bool | None = None,
    device: str = "cuda",
    example_inputs: object = None,
) -> MemoryEstimate:
    """`estimate` for any ``nn.Module`` taking one float tensor of ``(batch, *input_shape)``.

    ``example_inputs`` (meta tensors: a tensor, a tuple or a dict of keyword arguments,
    such as int64 ``input_ids`` and ``labels`` of ``(batch, seq)`` for a text model)
    replaces that tensor when given; ``input_shape`` is then not used.

    Training peak: a backward sweep over the layers in reverse order. At layer k, the
    saved tensors of layers before k are still alive, the gradients of the layers after
    k exist, and the layer holds its output gradient and its new input gradient; the
    optimizer step holds all gradients plus its temporaries.
    """
    compute = parse_dtype(dtype)
    step = parse_mode(mode)
    training = step is Mode.TRAIN
    mixed = training and compute.bits == 16 if mixed_precision is None else mixed_precision
    example = (
        torch.empty((batch_size, *input_shape), device="meta")
        if example_inputs is None
        else example_inputs
    )
    report = activation_bytes(model, example, dtype=compute, training=training, device=device)
    params = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    states = model_state_bytes(
        params=params,
        trainable=trainable,
        dtype=compute,
        mixed_precision=mixed,
        optimizer=parse_optimizer(optimizer) if training else None,
        training=training,
        num_tensors=sum(1 for p in model.parameters() if p.requires_grad),
    )
    inputs = report.input_bytes
    if not training:
        return MemoryEstimate(
            weights=states.weights,
            activations=inference_peak(model, example, dtype=compute, device=device),
            overhead=inputs,
            device=device,
            notes=(states.note, "inference: peak of live tensors in a meta-device forward"),
            peak_at="forward",
        )
    remaining = report.total
    grads = 0
    scale = FP32 / compute.itemsize if mixed else 1.0
    best = (remaining + report.output_bytes, grads, "start of backward")
    for record in reversed(report.records):
        transient = _backward_transient(record, device)
        live = remaining + grads + transient
        if live > best[0] + best[1]:
            best = (remaining + transient, grads, record.name)
        remaining -= record.saved
        grads += math.ceil(record.param_bytes * scale)
    largest = max((p.numel() for p in model.parameters()), default=0) * FP32
    step_temp = 0
    if parse_optimizer(optimizer) in {OptimizerName.ADAM, OptimizerName.ADAMW}:
        step_temp = states.gradients if device == "cuda" else 2 * largest
    if states.gradients + step_temp > best[0] + best[1]:
        best = (0, states.gradients, "optimizer step")
        workspace = step_temp
    else:
        workspace = 0
    activations, gradients, where = best
    return MemoryEstimate(
        weights=states.weights,
        gradients=gradients,
        optimizer=states.optimizer,
        activations=activations,
        workspace=workspace,
        overhead=inputs + states.autocast_copies,
        device=device,
        notes=(states.note, "activations from a meta-device pass (saved_tensors_hooks)"),
        layers=report.layers,
        peak_at=where,
    )
