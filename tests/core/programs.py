"""Random tensor programs for the differential tests: one generator, one interpreter.

A program is a list of instructions on a list of named tensors (``env``): create, view,
compute, grow in place, tie, delete, plus the tracker-only instructions (``tag``,
``scratch``, ``start``, ``stop``). The same program runs once under the legacy counter
and once under the ledger-based one, on fresh tensors each time; `run` hands each
instruction that is not a tensor operation to a callback.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

CATEGORIES = ("weights", "gradients", "optimizer", "activations", "workspace")

_INDEX = st.integers(0, 63)

#: Tensor operations every counter sees through dispatch.
TENSOR_OPS = [
    st.tuples(st.just("new"), st.integers(0, 3000)),
    st.tuples(st.just("view"), _INDEX, st.sampled_from(["slice", "step", "detach", "2d", "0"])),
    st.tuples(st.just("inplace"), _INDEX),
    st.tuples(st.just("del"), _INDEX),
    st.tuples(st.just("tie"), _INDEX),
    st.tuples(st.just("compute"), _INDEX, _INDEX, st.sampled_from(["cat", "mul", "clone", "sum"])),
]
#: Growth in place: ``resize_`` of a tensor or view, and an ``out=`` argument filled.
GROWTH_OPS = [
    st.tuples(st.just("resize"), _INDEX, st.integers(0, 4000)),
    st.tuples(st.just("out"), _INDEX),
]
#: The trace tracker's own calls, made outside dispatch.
TRACKER_OPS = [
    st.tuples(st.just("tag"), _INDEX, st.sampled_from(CATEGORIES)),
    st.tuples(st.just("scratch"), st.integers(0, 5000)),
    st.tuples(st.just("check")),
]


def programs(*groups, size: int = 60, min_size: int = 0):
    """Lists of ``min_size`` to ``size`` instructions drawn from ``groups``."""
    ops = [op for group in groups for op in group]
    return st.lists(st.one_of(*ops), min_size=min_size, max_size=size)


@st.composite
def traced_programs(draw):
    """A warm-up, ``start``, the recorded step (sometimes restarted), ``stop``, a tail."""
    warm = draw(programs(TENSOR_OPS, GROWTH_OPS, size=15))
    step = draw(programs(TENSOR_OPS, GROWTH_OPS, TRACKER_OPS, min_size=20, size=80))
    if draw(st.booleans()):  # start again in the middle of the step
        cut = draw(st.integers(0, len(step)))
        step = [*step[:cut], ("start",), *step[cut:]]
    tail = draw(programs(TENSOR_OPS, TRACKER_OPS, size=5))
    return [*warm, ("start",), *step, ("stop",), *tail]


def _pick(env: list[torch.Tensor | None], index: object) -> torch.Tensor | None:
    alive = [t for t in env if t is not None]
    return alive[int(index) % len(alive)] if alive else None  # type: ignore[call-overload]


def _view(tensor: torch.Tensor, kind: object) -> torch.Tensor:
    flat = tensor.reshape(-1) if tensor.is_contiguous() else tensor
    if kind == "slice":
        return flat[1:]
    if kind == "step":
        return flat[::2]
    if kind == "2d" and flat.dim() == 1 and flat.numel() % 2 == 0:
        return flat.view(2, -1)
    if kind == "0":
        return tensor.unsqueeze(0)
    return tensor.detach()


def _compute(a: torch.Tensor, b: torch.Tensor, kind: object) -> torch.Tensor:
    if kind == "cat":
        return torch.cat([a.reshape(-1), b.reshape(-1)])
    if kind == "mul":
        return a * 2
    if kind == "clone":
        return b.clone()
    return a.sum()


def run(program, env: list[torch.Tensor | None], other) -> None:
    """Run ``program`` on ``env``; ``other(instruction, env)`` does the rest."""
    for instruction in program:
        name, *args = instruction
        target = _pick(env, args[0]) if args and name not in {"new", "scratch"} else None
        if name == "new":
            env.append(torch.ones(args[0]))
        elif name == "view" and target is not None:
            env.append(_view(target, args[1]))
        elif name == "inplace" and target is not None:
            target.mul_(2)
        elif name == "del" and target is not None:
            env[next(i for i, t in enumerate(env) if t is target)] = None
        elif name == "tie" and target is not None:
            env.append(target)
        elif name == "compute" and target is not None:
            env.append(_compute(target, _pick(env, args[1]), args[2]))  # type: ignore[arg-type]
        elif name == "resize" and target is not None:
            if not target.requires_grad:
                target.resize_(args[1])
        elif name == "out" and target is not None:
            out = torch.empty(0)  # an empty out= tensor is resized without a warning
            torch.mul(target, 3, out=out)
            env.append(out)
        elif name in {"tag", "scratch", "start", "stop", "check"}:
            other(instruction, env, target)
        del target
