"""The host's time in some layers' own Python, beyond the ATen ops they dispatch.

`torchfit.speed.dispatch` charges the host per kernel-launching op. Two layers of the
recipes people run do much more Python than their ops show, and a step of many of them
at a small batch is bound by it:

- **bitsandbytes' ``Linear4bit``**: the quant-state checks, the input cast, ``MatMul4Bit``
  (an ``autograd.Function``, so its backward runs in Python too) and two custom-op calls
  into ctypes for the double-quantized dequantization, forward and again in backward;
- **PEFT's LoRA layer**: the active-adapter loop, dtype checks and three submodule calls
  (dropout, ``lora_A``, ``lora_B``); over a 4-bit base (``peft/tuners/lora/bnb.py``) its
  own path with the defensive ``clone`` and casts.

Measured by ``benchmarks/layer_host.py``: each layer's forward and backward timed on the
CPU with tiny tensors (bitsandbytes' dequantize kernels replaced by their argument
marshalling), less its ATen ops at the time one op takes there, and less a plain frozen
``nn.Linear``'s own (15 µs each way, which every module call costs and this model does
not count). torch 2.13, PEFT 0.21.2, bitsandbytes 0.50.2, Python 3.11, a 2-core AMD EPYC:
a 4-bit Linear 90 µs forward and 41 µs backward, a LoRA layer 39 and 0 over a 16-bit base
and 71 and 22 over a 4-bit one (beyond the base's). A QLoRA Linear's host time is then
about 0.45 ms a step with its ops, 0.7 ms with checkpointing's second forward: next to the GPU's
time for the same layer only at a few hundred tokens per step.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from torchfit.speed.ops import Op, OpKind, Phase
from torchfit.speed.record import OpRecorder

__all__ = ["LAYER_PYTHON_S", "python_hooks"]

#: Host seconds of a layer's own Python per call, (forward, backward) (module notes).
LAYER_PYTHON_S: dict[str, tuple[float, float]] = {
    "bitsandbytes-4bit": (90e-6, 41e-6),
    "peft-lora": (39e-6, 0.0),
    "peft-lora-over-4bit": (71e-6, 22e-6),
}


def _hooks(layer: nn.Module, kind: str, recorder: OpRecorder, backward: set[int]) -> list[Any]:
    """Charge ``layer``'s forward as it runs, and its backward where one will run.

    Its Python runs in backward only where the gradient flows back through its input
    (``MatMul4Bit.backward`` is skipped when neither its input nor its weight needs one),
    charged once per layer: at the forward, or at checkpointing's recomputation when the
    first forward ran without grad.
    """
    forward_s, backward_s = LAYER_PYTHON_S[kind]

    def charge(seconds: float, phase: Phase) -> None:
        recorder.add(Op(kind, OpKind.PYTHON, phase, 0.0, 0.0, "", host_s=seconds))

    def forward(_: nn.Module, args: tuple[Any, ...]) -> None:
        charge(forward_s, recorder.phase)
        x = args[0] if args else None
        flows = torch.is_grad_enabled() and isinstance(x, torch.Tensor) and x.requires_grad
        if backward_s and flows and id(layer) not in backward:
            backward.add(id(layer))
            charge(backward_s, Phase.BACKWARD)

    return [layer.register_forward_pre_hook(forward)]


def python_hooks(
    module: nn.Module, recorder: OpRecorder, quantized: Iterable[nn.Module]
) -> list[Any]:
    """Charge each PEFT LoRA layer and each ``quantized`` Linear's Python as it runs.

    Returns the hook handles (remove them when the step is recorded).
    """
    four_bit = {id(linear) for linear in quantized}
    backward: set[int] = set()  # the layers whose backward is charged
    handles = []
    for layer in module.modules():
        base = getattr(layer, "base_layer", None)
        if hasattr(layer, "lora_A") and base is not None:
            kind = "peft-lora-over-4bit" if id(base) in four_bit else "peft-lora"
            handles += _hooks(layer, kind, recorder, backward)
        elif id(layer) in four_bit:
            handles += _hooks(layer, "bitsandbytes-4bit", recorder, backward)
    return handles
