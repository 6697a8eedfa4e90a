"""The CUDA context: device memory a process holds outside the caching allocator.

`cuda_context_bytes` is the one context figure of torchfit (`to_device`, the device-map
planner and the batch-size margin take it from here); `parse_cuda_version` reads the
CUDA version it depends on.
"""

from __future__ import annotations

import math
import os
import re
from typing import TYPE_CHECKING

from torchfit._core import checks
from torchfit._core.units import parse_bytes

if TYPE_CHECKING:
    from torchfit.memory.gpus import GPU

__all__ = [
    "CONTEXT_ENV_VAR",
    "DEFAULT_CUDA_CONTEXT_BYTES",
    "EAGER_CUDA_CONTEXT_BYTES",
    "LAZY_LOADING_SINCE",
    "PRE_LAZY_CUDA_CONTEXT_BYTES",
    "asks_to_measure",
    "check_context_size",
    "cuda_context_bytes",
    "given_context",
    "measure_cuda_context",
    "parse_cuda_version",
    "resolve_gpu",
]

#: CUDA context of one process with lazy module loading (CUDA >= 11.7, PyTorch's default
#: since 1.13): 287,047,680 bytes, measured as ``total - free`` after creating one tensor
#: in pytorch PR #86509. That figure includes the tensor's 20 MiB segment, so the bare
#: context was about 266 MB; the remainder stands in for the kernels cuBLAS and cuDNN
#: load on first use. Real contexts vary with GPU, driver and libraries: ptrblck reports
#: ~300 MB (pytorch #107667) and ~400 MB (#109888). Override with ``context_bytes=`` or
#: the ``TORCHFIT_CUDA_CONTEXT_BYTES`` environment variable.
DEFAULT_CUDA_CONTEXT_BYTES = 287_047_680

#: The same measurement with eager module loading (``CUDA_MODULE_LOADING=EAGER``, or
#: CUDA < 11.7): 666,632,192 bytes (pytorch PR #86509); older stacks reach 1 GB+.
EAGER_CUDA_CONTEXT_BYTES = 666_632_192

#: The context of a CUDA stack older than lazy module loading (CUDA < 11.7, e.g. the CUDA
#: 11.x builds of PyTorch 1.x): nvidia-smi showed 1343 MiB after ``torch.ones((1, 1))
#: .to("cuda")`` on a V100 with CUDA 11.2 (Hugging Face's "Model training anatomy" page,
#: transformers docs/source/en/model_memory_anatomy.md); less the 2 MiB small-pool segment
#: that tensor took, 1341 MiB. Every kernel of every loaded library is resident.
PRE_LAZY_CUDA_CONTEXT_BYTES = 1341 * 2**20

#: The first CUDA version with lazy module loading (``CUDA_MODULE_LOADING=LAZY``; PyTorch
#: turns it on by default since 1.13, pytorch PR #86509).
LAZY_LOADING_SINCE = (11, 7)

#: The environment variable that overrides the CUDA context size (any `parse_bytes` form).
CONTEXT_ENV_VAR = "TORCHFIT_CUDA_CONTEXT_BYTES"


def resolve_gpu(gpu: str | GPU | None) -> GPU | None:
    """The `GPU` record for a catalog name; a record or None passes through."""
    if isinstance(gpu, str):
        from torchfit.memory.gpus import gpu as lookup  # noqa: PLC0415 - catalog loads on use

        return lookup(gpu)
    return gpu


def parse_cuda_version(value: object) -> tuple[int, int]:
    """A CUDA version as ``(major, minor)``: ``"12.1"``, ``"11.2"``, ``(11, 8)`` or ``12.4``.

    Raises:
        TypeError, ValueError: anything else; the message shows the accepted forms.

    Example:
        >>> parse_cuda_version("11.2"), parse_cuda_version((12, 4))
        ((11, 2), (12, 4))
    """
    if (
        isinstance(value, tuple | list)
        and len(value) == 2
        and all(
            isinstance(part, int) and not isinstance(part, bool) and part >= 0 for part in value
        )
    ):
        return int(value[0]), int(value[1])
    if isinstance(value, float) and math.isfinite(value) and value > 0:
        value = f"{value:g}"
    if isinstance(value, str):
        match = re.fullmatch(r"\s*(?:cuda\s*)?(\d+)\.(\d+)(?:\.\d+)?\s*", value.lower())
        if match:
            return int(match.group(1)), int(match.group(2))
    raise (ValueError if isinstance(value, str | float | tuple | list) else TypeError)(
        f"cannot read the CUDA version {value!r}; pass it like '12.1' or (12, 1) "
        "(torch.version.cuda on the machine that runs the job)"
    )


@checks.arguments(cuda_version=checks.parsed(parse_cuda_version))
def cuda_context_bytes(
    gpu: str | GPU | None = None,
    *,
    lazy_loading: bool | None = None,
    cuda_version: object = None,
) -> int:
    """Bytes a process's CUDA context takes on the device, outside the caching allocator.

    The context (driver state, loaded kernels, per-SM stacks) appears in ``nvidia-smi``
    but never in ``torch.cuda.memory_reserved``, and it cannot be released (pytorch issue
    20532). Resolution order: the ``TORCHFIT_CUDA_CONTEXT_BYTES`` environment variable
    (e.g. ``"512MiB"``), then a ``cuda_context_bytes`` field of the GPU record when the
    catalog has a measured one, then `DEFAULT_CUDA_CONTEXT_BYTES` (lazy module loading)
    or `EAGER_CUDA_CONTEXT_BYTES` (``CUDA_MODULE_LOADING=EAGER``), or, for a CUDA older
    than 11.7 (no lazy loading at all), `PRE_LAZY_CUDA_CONTEXT_BYTES`. The one context
    figure of torchfit: `to_device`, `plan_device_map` and the batch-size margin
    (`max_batch_size`, `find_batch_size` with a card as the budget) all take it from here.

    What is not modelled: how the context grows with the SM count (per-SM stacks) and
    the driver, and the kernels cuDNN and NCCL load on first use with lazy loading;
    measured contexts of 300-400 MB are reported with lazy loading (pytorch issues
    #107667, #109888). Pass the figure you measured (``context_bytes=`` in `to_device`,
    or ``TORCHFIT_CUDA_CONTEXT_BYTES``) when it matters.

    Args:
        gpu: A catalog name or `GPU` record; None for the generic default.
        lazy_loading: False for ``CUDA_MODULE_LOADING=EAGER``; default: on from CUDA 11.7.
        cuda_version: The CUDA version PyTorch was built with (``torch.version.cuda``),
            e.g. ``"11.2"``: before 11.7 there is no lazy loading.

    Returns:
        The context size in bytes.

    Raises:
        ValueError: The environment variable is set to something that is not a size.

    Example:
        >>> cuda_context_bytes() == DEFAULT_CUDA_CONTEXT_BYTES  # env var not set
        True
        >>> cuda_context_bytes(lazy_loading=False)
        666632192
        >>> cuda_context_bytes(cuda_version="11.2") // 2**20
        1341
    """
    record = resolve_gpu(gpu)
    return context_and_source(record, lazy_loading=lazy_loading, cuda_version=cuda_version)[0]


def context_and_source(
    record: GPU | None, *, lazy_loading: bool | None, cuda_version: object = None
) -> tuple[int, str]:
    """The context size and where it came from, in words."""
    override = os.environ.get(CONTEXT_ENV_VAR)
    if override is not None and override.strip():
        try:
            return parse_bytes(override), CONTEXT_ENV_VAR
        except ValueError as e:
            raise ValueError(
                f"{CONTEXT_ENV_VAR}={override!r} is not a size; set it like '300MB' or "
                f"'287047680', or unset it for the default ({e})"
            ) from e
    measured = getattr(record, "cuda_context_bytes", None)
    if isinstance(measured, int) and not isinstance(measured, bool) and measured >= 0:
        return measured, "measured for this GPU"
    if lazy_loading is not None and not isinstance(lazy_loading, bool):
        raise TypeError(f"lazy_loading must be True, False or None; got {lazy_loading!r}")
    if cuda_version is not None and parse_cuda_version(cuda_version) < LAZY_LOADING_SINCE:
        if lazy_loading:
            raise ValueError(
                f"lazy_loading=True with cuda_version={cuda_version!r}: lazy module loading "
                "arrived in CUDA 11.7; drop one of the two"
            )
        return PRE_LAZY_CUDA_CONTEXT_BYTES, f"CUDA {cuda_version}: no lazy module loading"
    if lazy_loading is None or lazy_loading:
        return DEFAULT_CUDA_CONTEXT_BYTES, "default with lazy module loading"
    return EAGER_CUDA_CONTEXT_BYTES, "default with eager module loading"


@checks.arguments(device=checks.whole(at_least=0))
def measure_cuda_context(device: int | str | None = None) -> int:
    """The CUDA context this process holds on ``device``, measured: for ``context_bytes=``.

    Creates the context if it does not exist yet (one 1-element tensor and a cuBLAS handle
    by a tiny matmul, as the first training step would), then takes the device's used
    memory (``torch.cuda.mem_get_info``: total - free, the figure ``nvidia-smi`` shows)
    less what this process's caching allocator reserved. On a GPU that other processes use
    too, their memory is counted as well: measure on an idle card.

    Args:
        device: The CUDA device (index, ``"cuda:1"``); the current one by default.

    Returns:
        The context's bytes.

    Raises:
        ValueError: ``device`` is not a CUDA device.
        RuntimeError: No CUDA GPU is visible; pass the figure measured on the training
            machine instead (``context_bytes=`` or ``--context``).

    Example:
        >>> measure_cuda_context()  # doctest: +SKIP
        287047680
    """
    import torch  # noqa: PLC0415 - imported on use: this module is light otherwise

    named = None
    if isinstance(device, str):
        try:
            parsed = torch.device(device)
        except (RuntimeError, ValueError):
            parsed = None
        if parsed is None or parsed.type != "cuda":
            raise ValueError(
                f"device must be a CUDA device such as 'cuda' or 'cuda:1', or its index; "
                f"got {device!r}"
            )
        named = parsed.index
    if not torch.cuda.is_available():
        raise RuntimeError(
            "measure_cuda_context needs a CUDA GPU and none is visible here; measure on the "
            "training machine, or pass the size (context_bytes='420MiB', --context 420MiB)"
        )
    if isinstance(device, int):
        index = device
    else:
        index = torch.cuda.current_device() if named is None else named
    with torch.cuda.device(index):
        a = torch.ones((8, 8), device="cuda")
        (a @ a).sum().item()  # cuBLAS loads its kernels and its handle
        del a
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        return int(total - free - torch.cuda.memory_reserved())


def asks_to_measure(value: object) -> bool:
    """Whether a context size given by the user is the word ``"measure"`` (any case)."""
    return isinstance(value, str) and value.strip().lower() == "measure"


def check_context_size(value: object) -> None:
    """Refuse what `given_context` cannot read (without measuring anything).

    Example:
        >>> check_context_size("measure"), check_context_size("420MiB")
        (None, None)
    """
    if asks_to_measure(value):
        return
    parse_bytes(value)  # type: ignore[arg-type]


def given_context(value: int | str | None) -> int | None:
    """A context size the user gave: bytes, a size string, ``"measure"``, or None.

    Example:
        >>> given_context("420MiB") // 2**20, given_context(None)
        (420, None)
    """
    if value is None:
        return None
    if asks_to_measure(value):
        return measure_cuda_context()
    return parse_bytes(value)
