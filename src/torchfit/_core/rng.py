"""Every global random stream a step may draw from, put back as it was.

A probe (a trace, a measured step, a batch-size trial, a loader probe) runs user code
that may draw from torch's generators, Python's ``random`` or NumPy's global
generator; `kept_rng` restores all of them, so the caller's next draw is the one it
would have been without the probe.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator

import numpy as np
import torch

__all__ = ["kept_rng", "rng_snapshot"]


def rng_snapshot(*, cuda: bool = False) -> Callable[[], None]:
    """Save every global random stream now; the returned function puts them back (any times).

    Args:
        cuda: As in `kept_rng`.

    Example:
        >>> restore = rng_snapshot()
        >>> first = random.random()
        >>> restore()
        >>> random.random() == first
        True
    """
    initialized = torch.cuda.is_available() and (
        cuda or bool(torch.cuda.is_initialized())  # type: ignore[no-untyped-call]
    )
    cpu = torch.get_rng_state()
    gpus = torch.cuda.get_rng_state_all() if initialized else None
    python = random.getstate()
    legacy = np.random.get_state()  # noqa: NPY002 - the legacy global generator is user state

    def restore() -> None:
        torch.set_rng_state(cpu)
        if gpus is not None:
            torch.cuda.set_rng_state_all(gpus)
        random.setstate(python)
        np.random.set_state(legacy)  # noqa: NPY002

    return restore


@contextlib.contextmanager
def kept_rng(*, cuda: bool = False) -> Iterator[None]:
    """Restore torch's CPU and CUDA, Python's ``random`` and NumPy's global RNG on exit.

    Args:
        cuda: Also save the CUDA generators when CUDA is not initialized yet (this
            initializes it); by default they are kept only when CUDA already is.

    Example:
        >>> state, first = random.getstate(), torch.rand(1)
        >>> with kept_rng():
        ...     _ = random.random(), np.random.rand(), torch.rand(1)
        >>> random.getstate() == state, bool(torch.rand(1) != first)
        (True, True)
    """
    restore = rng_snapshot(cuda=cuda)
    try:
        yield
    finally:
        restore()
