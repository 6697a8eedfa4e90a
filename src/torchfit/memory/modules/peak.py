"""The peak of a step from one pass on data-free tensors: a backward sweep over the layers.

`estimate_module` turns `activation_bytes` into the peak of a training step: layers
release their saved tensors in reverse order while gradients appear, and each layer's
backward holds its gradients and its kernels' scratch, asked of the rules the tracer
uses (`torchfit.memory.kernels`) for the very calls the layer makes. `inference_peak` is
the peak of live tensors in a no-grad forward, with each op's scratch at the op.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from torchfit._core.step import Loop, Mode, OptimizerName, parse_mode, parse_optimizer
from torchfit._core.tensors import check_materialized
from torchfit._core.units import DType, parse_dtype
from torchfit.memory.analytic.formulas import FP32
from torchfit.memory.analytic.model_states import model_state_bytes
from torchfit.memory.analytic.optimizer_step import adam_step_temporaries
from torchfit.memory.kernels.calls import scratch_of
from torchfit.memory.kernels.cpu import CpuRules, workspace_rules
from torchfit.memory.kernels.layout import cpu_layout
from torchfit.memory.modules.adapters import frozen_base_weights
from torchfit.memory.modules.live import LiveBytes
from torchfit.memory.modules.meta import sdpa_as_on_device, split_inputs, training_flags, twins
from torchfit.memory.modules.saved import LayerRecord, activation_bytes
from torchfit.memory.result import MemoryEstimate

__all__ = ["estimate_module", "inference_peak", "loop_notes"]


def _backward_transient(record: LayerRecord, device: str, *, scale: float) -> int:
    """Bytes a layer's backward holds beyond what is saved: gradients and kernel scratch.

    The output gradient, the input gradient (only when the input requires grad), the
    layer's parameter gradients, and the largest scratch of its backward calls under the
    kernel rules of ``device`` (`torchfit.memory.kernels`), the rules the tracer applies
    to the same calls. Each rule gives the bytes above the call's outputs, which are the
    gradients counted here.
    """
    grads = record.output_bytes + (record.input_bytes if record.input_requires_grad else 0)
    grads += math.ceil(record.param_bytes * scale)
    return grads + scratch_of(record.backward_calls, device)


def loop_notes(loop: Loop) -> tuple[str, ...]:
    """What the loop changes in a step's peak, in words (for the estimate's notes)."""
    notes = []
    if loop.accumulation_steps > 1:
        notes.append(
            f"gradients alive through forward and backward ({loop.accumulation_steps} "
            "accumulation steps)"
        )
    elif not loop.set_to_none:
        notes.append("gradients alive through forward and backward (zero_grad(set_to_none=False))")
    if loop.keep_output:
        notes.append("the forward's output is kept through backward")
    if loop.optimizer_in_backward:
        notes.append("optimizer step in backward: one parameter's gradient and update at a time")
    return tuple(notes)


class _LiveWithScratch(LiveBytes):  # type: ignore[no-untyped-call]
    """`LiveBytes` that also counts each op's kernel scratch at the op, for ``device``.

    Outputs take the layout the CPU kernel gives them (`cpu_layout`).
    """

    def __init__(self, device: str) -> None:
        super().__init__()
        self.rules = workspace_rules(device)

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            return cpu_layout(func, args, func(*args, **kwargs))

        out = super().__torch_dispatch__(run, types, args, kwargs)
        if self.rules is not None:
            scratch = self.rules(func, args, dict(kwargs or {}), out)
            if scratch > 0:
                self.ledger.transient(scratch)  # allocated and freed within the op
        return out


def inference_peak(
    model: nn.Module,
    example_input: object,
    *,
    dtype: str | DType | None = None,
    device: str = "cuda",
) -> int:
    """Peak bytes of tensors alive at once during a no-grad forward, on the meta device.

    The input and the parameters are not counted (they exist before the call); the
    output is (it is alive when the forward returns). Each op's kernel scratch under the
    rules of ``device`` counts at the op (`torchfit.memory.kernels`).
    """
    check_materialized(model, what="the estimate")
    torch_dtype = None if dtype is None else parse_dtype(dtype).torch_dtype
    with twins(torch_dtype, device=device) as convert:
        made: dict[int, torch.Tensor] = {}  # tied weights: one twin for all their names
        tensors = {
            n: made.setdefault(id(p), convert(p.detach()))
            for n, p in model.named_parameters(remove_duplicate=False)
        }
        tensors.update({n: convert(b) for n, b in model.named_buffers(remove_duplicate=False)})
        inputs = tree_map(convert, example_input)
        args, kwargs = split_inputs(inputs)
        counter = _LiveWithScratch(device)
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
    loop: Loop | None = None,
    frozen_dtype: str | DType | None = None,
) -> MemoryEstimate:
    """`estimate` for any ``nn.Module`` taking one float tensor of ``(batch, *input_shape)``.

    ``example_inputs`` (meta tensors: a tensor, a tuple or a dict of keyword arguments,
    such as int64 ``input_ids`` and ``labels`` of ``(batch, seq)`` for a text model)
    replaces that tensor when given; ``input_shape`` is then not used.

    Training peak: a backward sweep over the layers in reverse order. At layer k, the
    saved tensors of layers before k are still alive, the gradients of the layers after
    k exist, and the layer holds its output gradient and its new input gradient; the
    optimizer step holds all gradients plus its temporaries.

    ``loop`` (default: one micro-batch, ``set_to_none=True``, the output dropped before
    backward, as the Hugging Face Trainer and Lightning run it) changes what overlaps:
    accumulated or kept gradients are alive through the whole sweep, a kept output stays
    until backward ends, and with the optimizer step in backward each layer's gradients
    are freed as soon as they are stepped, so there is no optimizer-step peak.

    ``frozen_dtype``: the dtype frozen parameters stay in (a LoRA base under mixed
    precision keeps its checkpoint's dtype); by default that of the trained ones.
    """
    loop = Loop(keep_output=False) if loop is None else loop
    compute = parse_dtype(dtype)
    step = parse_mode(mode)
    training = step is Mode.TRAIN
    mixed = compute.autocasts(mixed=mixed_precision, training=training)
    example = (
        torch.empty((batch_size, *input_shape), device="meta")
        if example_inputs is None
        else example_inputs
    )
    rules = isinstance(workspace_rules(device), CpuRules)  # the calls CPU rules look at
    report = activation_bytes(
        model, example, dtype=compute, training=training, device=device, kernel_calls=rules
    )
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
    if frozen_dtype is not None and trainable < params:
        master = compute.master(mixed=mixed)
        base = parse_dtype(frozen_dtype)
        weights = frozen_base_weights(model, trainable=master, frozen=base)
        note = f"{states.note}; the frozen base in {base.value}"
        states = dataclasses.replace(states, weights=weights, note=note)
    inputs = report.input_bytes
    if not training:
        return MemoryEstimate(
            weights=states.weights,
            activations=inference_peak(model, example, dtype=compute, device=device),
            overhead=inputs,
            device=device,
            notes=(states.note, "inference: peak of live tensors in a data-free forward"),
            peak_at="forward",
        )
    remaining = report.total
    scale = FP32 / compute.itemsize if mixed else 1.0
    largest = max((p.numel() for p in model.parameters()), default=0) * FP32
    name = parse_optimizer(optimizer)
    adam = name.is_torch_adam
    # accumulated or kept gradients: all of them exist while the next micro-batch runs;
    # each layer's new gradient is a transient added into them in place
    kept = states.gradients if loop.gradients_during_forward else 0
    # the caller's reference keeps the output alive until backward ends
    output = report.output_bytes if loop.keep_output else 0
    # optimizer step in backward: once a layer's backward is done, its parameter gradient
    # and the input gradient it passes on meet Adam's update temporaries (two tensors of
    # the parameter's size on one tensor at a time; the largest parameter, to be safe)
    in_step = 0
    if loop.optimizer_in_backward and adam:
        in_step = adam_step_temporaries(
            name, device=device, trainable=largest, largest=largest, elem=1, per_parameter=True
        )
    grads = 0
    best = (remaining + report.output_bytes, kept, "start of backward")
    for record in reversed(report.records):
        transient = _backward_transient(record, device, scale=scale) + output
        if loop.optimizer_in_backward:
            passed_on = record.input_bytes if record.input_requires_grad else 0
            stepping = math.ceil(record.param_bytes * scale) + passed_on + output + in_step
            transient = max(transient, stepping)
        held = kept if loop.gradients_during_forward or loop.optimizer_in_backward else grads
        if remaining + held + transient > best[0] + best[1]:
            best = (remaining + transient, held, record.name)
        remaining -= record.saved
        grads += math.ceil(record.param_bytes * scale)
    # Adam's temporaries, in the state's dtype (that of the gradients), in bytes
    step_temp = adam_step_temporaries(
        name, device=device, trainable=states.gradients, largest=largest, elem=1
    )
    workspace = 0
    if not loop.optimizer_in_backward and states.gradients + step_temp > best[0] + best[1]:
        best = (0, states.gradients, "optimizer step")
        workspace = step_temp
    activations, gradients, where = best
    return MemoryEstimate(
        weights=states.weights,
        gradients=gradients,
        optimizer=states.optimizer,
        activations=activations,
        workspace=workspace,
        overhead=inputs + states.autocast_copies,
        device=device,
        notes=(
            states.note,
            "activations from a pass on data-free tensors (saved_tensors_hooks)",
            *(
                ("CPU kernel scratch per layer from torchfit.memory.kernels (the trace's rules)",)
                if rules
                else ()
            ),
            *loop_notes(loop),
        ),
        layers=report.layers,
        peak_at=where,
    )
