"""Host time per parameter of a bitsandbytes optimizer step, the kernel left out.

bitsandbytes' optimizers (``Optimizer8bit.step`` in ``bitsandbytes/optim/optimizer.py``)
update one parameter at a time from Python and call ``torch.cuda.synchronize()`` after
each (since 0.39, May 2023), so on a GPU the host's work for a parameter and that
parameter's kernel run one after the other. This script measures the host's part on the
CPU: bitsandbytes' own step loop (``step``, ``update_step``, the ``functional`` wrapper)
over many small parameters, with the update going through bitsandbytes' own op into a stand-in CPU
kernel that does what bitsandbytes' CUDA registration
(``backends/cuda/ops.py``) does before its foreign call: look the kernel up, branch on
the gradient's dtype, take eight pointers and convert the scalars to ctypes values.

    python benchmarks/bnb_optimizer_host.py

Prints microseconds per parameter (median of repeats); `torchfit.speed.dispatch`'s
``SYNCHRONIZED_STEP_S`` is this figure rounded, plus one launch.
"""

from __future__ import annotations

import contextlib
import ctypes as ct
import statistics
import time
import warnings

import torch

REPEATS = 7


def _stand_in_kernel() -> None:
    """Route bitsandbytes' own op to a kernel body that stops before the foreign call."""
    kernels = {"adam": (None, None, "bf16")}

    def update(name, g, p, s1, s2, b1, b2, b3, alpha, eps, step, lr, q1, q2, m1, m2, wd, gs, *rest):  # noqa: PLR0917
        skip = rest[0] if rest else False  # the schema's default is left out of the call
        fns = kernels.get(name)
        fn = fns[0] if g.dtype == torch.float32 else fns[1] if g.dtype == torch.float16 else fns[2]
        with contextlib.nullcontext():
            args = [ct.c_void_p(t.data_ptr()) for t in (p, g, s1, s2, q1, q2, m1, m2)]
            args += [ct.c_float(x) for x in (b1, b2, b3, alpha, eps, lr, wd, gs)]
            args += [ct.c_int32(step), ct.c_bool(skip), ct.c_int32(g.numel()), fn]

    with warnings.catch_warnings():  # it replaces bitsandbytes' CPU kernel, on purpose
        warnings.simplefilter("ignore")
        torch.library.impl("bitsandbytes::optimizer_update_8bit_blockwise", "CPU")(update)


def main() -> None:
    import bitsandbytes as bnb  # noqa: PLC0415

    params = [torch.nn.Parameter(torch.zeros(4096, dtype=torch.bfloat16)) for _ in range(400)]
    for p in params:
        p.grad = torch.zeros_like(p)
    opt = bnb.optim.AdamW8bit(params, lr=1e-3)
    opt.step()  # creates the state (with bitsandbytes' own kernel)
    _stand_in_kernel()
    seconds = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        opt.step()
        seconds.append((time.perf_counter() - start) / len(params))
    print(
        f"bitsandbytes {bnb.__version__}, torch {torch.__version__}: "
        f"{statistics.median(seconds) * 1e6:.1f} us of host time per parameter "
        f"(median of {REPEATS} steps over {len(params)} parameters, kernel left out)"
    )


if __name__ == "__main__":
    main()
