"""The host's side of an eager step: dispatching each kernel costs CPU time.

Eager PyTorch launches every kernel from the host, and the GPU runs behind it
asynchronously (the CUDA semantics notes of PyTorch's docs: "GPU operations are
asynchronous"). While the host issues kernels faster than the GPU finishes them, the
GPU sets the pace; when kernels are small, the GPU waits for the next launch and the
host sets it. So each phase takes the larger of its GPU time and its host time, and a
step the sum over phases (the rule of H. He, "Making Deep Learning Go Brrrr From First
Principles", horace.io/brrr_intro.html, 2022: a step is compute-, memory- or
overhead-bound, whichever is largest).

Host time per kernel-launching ATen op, from PyTorch's issue tracker:

- **forward, issued from Python with autograd recording**: 6.8 µs (one million
  ``y = 2 * x`` with ``requires_grad=True`` took 6.8 s; github.com/pytorch/pytorch
  issue 41383, 2020); **without autograd** (inference) 5 µs, the same issue's figure;
- **backward and the optimizer, issued from C++** (the autograd engine, ``foreach``
  kernels): 4 µs, the overhead per CUDA op measured in github.com/pytorch/pytorch issue
  82793 (2022), near ngimel's "about a microsecond" of C++ dispatch in issue 41383 plus
  the launch itself.

A phase that mixes large and small kernels takes at least the larger of the two, so the
floor is a lower bound where the two overlap imperfectly.

**A step that waits for each kernel** overlaps nothing: bitsandbytes' optimizers update
one parameter at a time from Python and call ``torch.cuda.synchronize()`` after each
(``Optimizer8bit.step`` in ``bitsandbytes/optim/optimizer.py``, since 0.39.0 of May
2023 and still in 0.50), so each parameter costs its host work, a launch, the wait and
its kernel, one after the other. The host work is 25 µs: bitsandbytes 0.50.2's own step
loop, ``update_step``, wrapper and custom-op dispatch, with a kernel body that stops
before the foreign call, measured at 24.6 µs a parameter on a 2-core AMD EPYC under
Python 3.11 (``benchmarks/bnb_optimizer_host.py``); the launch and the synchronize take
the C++ rate each. Such kernels carry ``backend="synchronized"`` (`SYNCHRONIZED`).
"""

from __future__ import annotations

from collections.abc import Iterable

from torchfit.speed.ops import Op, OpKind, Phase

__all__ = [
    "HOST_OP_S",
    "SYNCHRONIZED",
    "SYNCHRONIZED_STEP_S",
    "host_seconds",
    "serial_host_seconds",
]

#: Host seconds per kernel-launching op, by where it is issued from (module notes).
HOST_OP_S = {
    "python-autograd": 6.8e-6,
    "python": 5.0e-6,
    "cpp": 4.0e-6,
}

#: The backend of a kernel the host waits for before it issues the next (module notes).
SYNCHRONIZED = "synchronized"

#: Host seconds around each synchronized kernel: the library's Python, the launch and
#: the synchronize (module notes).
SYNCHRONIZED_STEP_S = 25e-6 + 2 * HOST_OP_S["cpp"]


def host_seconds(ops: Iterable[Op], *, train: bool) -> dict[Phase, float]:
    """Host seconds spent dispatching each phase's kernels.

    Synchronized kernels are left out: their host time does not overlap
    (`serial_host_seconds`). A ``PYTHON`` row (a layer's own Python, no kernel) adds
    its ``host_s`` per call.

    Example:
        >>> from torchfit.speed.ops import OpKind
        >>> add = Op("add", OpKind.MEMORY, Phase.FORWARD, 0.0, 1e3, "fp32", count=1000)
        >>> round(host_seconds([add], train=True)[Phase.FORWARD] * 1e3, 2)  # ms
        6.8
    """
    forward = HOST_OP_S["python-autograd" if train else "python"]
    per_op = {Phase.FORWARD: forward, Phase.BACKWARD: HOST_OP_S["cpp"]}
    totals = dict.fromkeys(Phase, 0.0)
    for op in ops:
        if op.kind is OpKind.PYTHON:  # no kernel: the layer's own Python
            totals[op.phase] += op.count * op.host_s
        elif op.backend != SYNCHRONIZED:
            totals[op.phase] += op.count * per_op.get(op.phase, HOST_OP_S["cpp"])
    return totals


def serial_host_seconds(ops: Iterable[Op]) -> dict[Phase, float]:
    """Host seconds around each phase's synchronized kernels, which nothing overlaps.

    Example:
        >>> from torchfit.speed.ops import OpKind
        >>> update = Op("adamw_8bit", OpKind.MEMORY, Phase.OPTIMIZER, 0.0, 1e3, "fp32",
        ...             backend=SYNCHRONIZED, count=300)
        >>> round(serial_host_seconds([update])[Phase.OPTIMIZER] * 1e3, 2)  # ms
        9.9
    """
    totals = dict.fromkeys(Phase, 0.0)
    for op in ops:
        if op.backend == SYNCHRONIZED:
            totals[op.phase] += op.count * SYNCHRONIZED_STEP_S
    return totals
