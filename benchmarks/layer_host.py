"""Host time a PEFT LoRA layer and a bitsandbytes 4-bit Linear spend beyond their ATen ops.

`torchfit.speed` counts the host's time per kernel-launching ATen op. Some layers run
more Python than their ops: PEFT's LoRA layer (its adapter dict, dropout and dtype
checks, three submodule calls) and bitsandbytes' ``Linear4bit`` (its quant-state
handling, ``MatMul4Bit``, an ``autograd.Function`` whose backward is Python, and
custom-op calls for the dequantizations). This script times each layer's forward and
backward on the CPU with tiny tensors (so kernels take next to nothing; bitsandbytes'
dequantize kernels are replaced by a body that builds the foreign call's arguments and
returns an empty tensor), counts the ATen ops each dispatches, and prints what the layer
costs beyond ``ops x`` the time of one op measured the same way (a chain of ``add``).

    python benchmarks/layer_host.py

`torchfit.speed.python_cost.LAYER_PYTHON_S` holds its last lines' figures, rounded (they
vary by about 10 µs between runs).
"""

from __future__ import annotations

import ctypes as ct
import statistics
import time
import warnings
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

WIDTH, LAYERS, REPEATS = 64, 32, 25


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def _stub_bitsandbytes_kernels() -> None:
    def dequantize_4bit(A, absmax, blocksize, *rest):  # noqa: N803 - the op's schema names
        _quant_type, shape, dtype = rest
        [ct.c_void_p(t.data_ptr()) for t in (A, absmax)] + [ct.c_int(blocksize)]
        return torch.empty(shape, dtype=dtype)

    def dequantize_blockwise(A, absmax, code, blocksize, dtype):  # noqa: N803
        [ct.c_void_p(t.data_ptr()) for t in (A, absmax, code)] + [ct.c_int(blocksize)]
        return torch.empty(A.shape, dtype=dtype)

    with warnings.catch_warnings():  # replacing bitsandbytes' CPU kernels, on purpose
        warnings.simplefilter("ignore")
        torch.library.impl("bitsandbytes::dequantize_4bit", "CPU")(dequantize_4bit)
        torch.library.impl("bitsandbytes::dequantize_blockwise", "CPU")(dequantize_blockwise)


def _layers(kind: str) -> torch.nn.Module:
    import bitsandbytes as bnb  # noqa: PLC0415
    import peft  # noqa: PLC0415

    four_bit = kind.startswith("4bit")

    def make() -> torch.nn.Module:
        if four_bit:
            return bnb.nn.Linear4bit(
                WIDTH, WIDTH, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4"
            )
        return torch.nn.Linear(WIDTH, WIDTH, bias=False, dtype=torch.bfloat16)

    chain = torch.nn.Sequential(*[make() for _ in range(LAYERS)]).to("cpu")  # quantizes
    chain.requires_grad_(requires_grad=False)
    if kind.endswith("lora"):
        config = peft.LoraConfig(
            r=16, lora_alpha=32, lora_dropout=0.05, target_modules=[str(i) for i in range(LAYERS)]
        )
        chain = peft.get_peft_model(chain, config)
    return chain


def _per_layer(forward: Callable[[], torch.Tensor]) -> tuple[float, float, int, int]:
    """Seconds per layer forward and backward (medians), ATen ops per layer each way."""
    for _ in range(3):
        forward().float().sum().backward()
    fwd, bwd = [], []
    for _ in range(REPEATS):
        start = time.perf_counter()
        out = forward()
        middle = time.perf_counter()
        out.float().sum().backward()
        fwd.append(middle - start)
        bwd.append(time.perf_counter() - middle)
    counting = _Count()
    with counting:
        out = forward()
    ops_forward = counting.ops
    counting = _Count()
    with counting:
        out.float().sum().backward()
    return (
        statistics.median(fwd) / LAYERS,
        statistics.median(bwd) / LAYERS,
        ops_forward // LAYERS,
        counting.ops // LAYERS,
    )


def main() -> None:
    import bitsandbytes as bnb  # noqa: PLC0415
    import peft  # noqa: PLC0415

    _stub_bitsandbytes_kernels()
    x = torch.randn(2, WIDTH, dtype=torch.bfloat16, requires_grad=True)

    def adds() -> torch.Tensor:
        y = x
        for _ in range(LAYERS):
            y = y + 1
        return y

    add_f, add_b, _, _ = _per_layer(adds)
    print(f"torch {torch.__version__}, peft {peft.__version__}, bitsandbytes {bnb.__version__}")
    print(f"one add: {add_f * 1e6:.1f} us forward, {add_b * 1e6:.1f} us backward")
    beyond = {}
    for kind in ("16bit", "16bit+lora", "4bit", "4bit+lora"):
        chain = _layers(kind)

        def run(chain: torch.nn.Module = chain) -> torch.Tensor:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return chain(x)

        f, b, ops_f, ops_b = _per_layer(run)
        beyond[kind] = (f - ops_f * add_f, b - ops_b * add_b)
        print(
            f"{kind:11} forward {f * 1e6:6.1f} us ({ops_f} ops; beyond them "
            f"{beyond[kind][0] * 1e6:6.1f} us), backward {b * 1e6:6.1f} us ({ops_b} ops; "
            f"beyond them {beyond[kind][1] * 1e6:6.1f} us)"
        )
    layers = {  # each beyond what the layer it wraps (or a plain Linear) costs already
        "bitsandbytes-4bit": ("4bit", "16bit"),
        "peft-lora": ("16bit+lora", "16bit"),
        "peft-lora-over-4bit": ("4bit+lora", "4bit"),
    }
    for name, (kind, under) in layers.items():
        f, b = (beyond[kind][i] - beyond[under][i] for i in (0, 1))
        print(f"LAYER_PYTHON_S[{name!r}]: {f * 1e6:.0f} us forward, {b * 1e6:.0f} us backward")


if __name__ == "__main__":
    main()
