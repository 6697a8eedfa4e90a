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
from torchfit._core.units import format_bytes, parse_bytes

if TYPE_CHECKING:
    from torchfit.memory.gpus import GPU

__all__ = [
    "CONTEXT_ENV_VAR",
    "DEFAULT_CUDA_CONTEXT_BYTES",
    "EAGER_LIBRARY_BYTES",
    "LAZY_FIRST_USE_BYTES",
    "LAZY_LOADING_SINCE",
    "asks_to_measure",
    "bare_context_bytes",
    "check_context_size",
    "cuda_context_bytes",
    "given_context",
    "measure_cuda_context",
    "parse_cuda_version",
    "resolve_gpu",
]

MiB = 2**20

# The context is what the driver reserves when it is created, plus the kernel images the
# process has loaded since (the sources of every figure, and the fit, are in the docs:
# docs/memory.md, "The CUDA context").
#
# The bare context: a reservation per resident-thread slot (the local-memory stack of
# every thread the GPU can hold at once: SMs x max resident threads per SM x the
# per-thread size, NVIDIA developer forums "Local memory management" and "Memory required
# for kernel launch") plus a small constant. Fitted by least squares to bare contexts
# published for six cards from Volta to Blackwell (RTX 4060 Ti 107 MiB, RTX 3090 256,
# RTX 6000 Ada 426, RTX 5090 506, RTX PRO 6000 Blackwell 555, Titan V 319: llama.cpp
# PR 23604 and issue 20582, unsloth-zoo PR 1053, InvokeAI issue 9413, pytorch issue
# 28394): residuals -3.6..+6.1 MiB. 1982 bytes is the 1 KiB default stack
# (cudaLimitStackSize) and about 1 KiB of other per-thread reserve; an NVIDIA H200
# (132 x 2048 slots) gives 522.8 MiB, and 526.8 MiB was measured there before any kernel.
CONTEXT_PER_THREAD_SLOT = 1982
CONTEXT_FIXED_BYTES = round(11.9 * MiB)

#: Kernel images loaded on first use with lazy module loading, measured on an NVIDIA H200
#: (driver 580.159, torch 2.11.0+cu130, cuDNN 9.19) by ``benchmarks/gpu_check.py``: the
#: first tensor loads 96 MiB of PyTorch's own kernels (pytorch issue 175666 reports ~70
#: MiB more with 2.11+cu130 than before), the first matmul 66 MiB of cuBLAS/cuBLASLt, the
#: first convolution 18 MiB of cuDNN; a flash SDPA adds nothing. All three are counted:
#: a training step loads cuBLAS, and counting cuDNN for a model without convolutions
#: over-states the context by 18 MiB rather than under-stating a CNN's.
LAZY_FIRST_USE_BYTES = {"torch": 96 * MiB, "cublas": 66 * MiB, "cudnn": 18 * MiB}

#: With eager module loading (``CUDA_MODULE_LOADING=EAGER``, or a CUDA older than 11.7)
#: every kernel image of every loaded library is resident, for the device's architecture:
#: by CUDA major version, what published contexts hold above the bare one. CUDA 13: 2239
#: MiB measured on the H200 above (used for CUDA 12 too, unmeasured); CUDA 11.0-11.6:
#: 1236 MiB, the middle of 1020-1435 MiB (V100 in Hugging Face's model_memory_anatomy
#: page, RTX 3090 in pytorch issues 49877 and 55277); CUDA 10: 684 MiB, the middle of
#: 531-734 MiB (GTX 1080/1080 Ti, Titan V, RTX 2080 Ti: pytorch issues 28394, 49877,
#: 55277, tch-rs issue 81). Within one generation contexts spread by +-200 MiB.
EAGER_LIBRARY_BYTES = {10: 684 * MiB, 11: 1236 * MiB, 12: 2239 * MiB, 13: 2239 * MiB}

#: The bare context of a card whose SM count is unknown: pytorch PR #86509's lazy figure
#: (287,047,680 bytes after one tensor) less the 20 MiB segment that tensor took.
UNKNOWN_CARD_BARE_BYTES = 287_047_680 - 20 * MiB

#: The context of a card torchfit knows nothing of, with lazy loading (CUDA >= 11.7).
DEFAULT_CUDA_CONTEXT_BYTES = UNKNOWN_CARD_BARE_BYTES + sum(LAZY_FIRST_USE_BYTES.values())

#: Maximum resident threads per SM by compute capability major.minor (CUDA C++
#: Programming Guide, "Technical Specifications per Compute Capability").
_THREADS_PER_SM = {
    (3, 5): 2048, (3, 7): 2048, (5, 0): 2048, (5, 2): 2048, (5, 3): 2048,
    (6, 0): 2048, (6, 1): 2048, (6, 2): 2048, (7, 0): 2048, (7, 2): 2048, (7, 5): 1024,
    (8, 0): 2048, (8, 6): 1536, (8, 7): 2048, (8, 9): 1536, (9, 0): 2048,
    (10, 0): 2048, (10, 3): 2048, (11, 0): 1536, (12, 0): 1536, (12, 1): 1536,
}  # fmt: skip

#: The first CUDA version with lazy module loading (``CUDA_MODULE_LOADING=LAZY``; PyTorch
#: turns it on by default since 1.13, pytorch PR #86509).
LAZY_LOADING_SINCE = (11, 7)

#: The CUDA version assumed when none is given: PyTorch's current builds (CUDA 12.x-13.x).
ASSUMED_CUDA = (13, 0)

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


def threads_per_sm(compute_capability: tuple[int, int] | None) -> int | None:
    """Maximum resident threads per SM of a compute capability; None when unknown.

    Example:
        >>> threads_per_sm((9, 0)), threads_per_sm((8, 6)), threads_per_sm(None)
        (2048, 1536, None)
    """
    if compute_capability is None:
        return None
    return _THREADS_PER_SM.get(tuple(compute_capability))  # type: ignore[arg-type]


def bare_context_bytes(gpu: str | GPU | None = None) -> int:
    """The context a card's driver reserves before any kernel is loaded.

    ``CONTEXT_FIXED_BYTES + CONTEXT_PER_THREAD_SLOT x SMs x max resident threads per SM``:
    the per-thread stack reservation scales with the SM count, not the memory, which is
    why a 32 GB RTX 5090 (170 SMs) holds more than a 48 GB RTX 6000 Ada (142). A card
    without an SM count or a known compute capability gets `UNKNOWN_CARD_BARE_BYTES`.

    Example:
        >>> round(bare_context_bytes("H200") / 2**20)  # 132 SMs x 2048 threads
        523
        >>> round(bare_context_bytes("RTX 3060") / 2**20)  # 28 SMs x 1536 threads
        93
    """
    record = resolve_gpu(gpu)
    sms = getattr(record, "sm_count", None)
    threads = threads_per_sm(getattr(record, "compute_capability", None))
    if sms is None or threads is None:
        return UNKNOWN_CARD_BARE_BYTES
    return CONTEXT_FIXED_BYTES + CONTEXT_PER_THREAD_SLOT * int(sms) * threads


@checks.arguments(cuda_version=checks.parsed(parse_cuda_version))
def cuda_context_bytes(
    gpu: str | GPU | None = None,
    *,
    lazy_loading: bool | None = None,
    cuda_version: object = None,
) -> int:
    """Bytes a process's CUDA context takes on the device, outside the caching allocator.

    The context (driver state, per-thread stacks, loaded kernels) appears in ``nvidia-smi``
    but never in ``torch.cuda.memory_reserved``, and it cannot be released (pytorch issue
    20532). It is the card's bare context (`bare_context_bytes`: by SM count and threads
    per SM) plus the kernel images loaded: with lazy module loading (CUDA >= 11.7, the
    default) those PyTorch, cuBLAS and cuDNN load on first use (`LAZY_FIRST_USE_BYTES`);
    with eager loading (``CUDA_MODULE_LOADING=EAGER`` or CUDA < 11.7) every library's,
    by CUDA version (`EAGER_LIBRARY_BYTES`). The ``TORCHFIT_CUDA_CONTEXT_BYTES``
    environment variable (e.g. ``"512MiB"``) overrides all of it. `to_device`,
    `plan_device_map` and the batch-size margin take the context from here.

    Checked on an NVIDIA H200 (CUDA 13.0, torch 2.11): 702.8 MiB modelled and measured
    after a matmul and a convolution (684.8 MiB without cuDNN). Not modelled: NCCL's
    buffers (several GPUs), a kernel that grows the stack reservation, other processes.

    Args:
        gpu: A catalog name or `GPU` record; None for an unknown card.
        lazy_loading: False for ``CUDA_MODULE_LOADING=EAGER``; default: on from CUDA 11.7.
        cuda_version: The CUDA version PyTorch was built with (``torch.version.cuda``),
            e.g. ``"11.2"``: before 11.7 there is no lazy loading. Default: 13.0.

    Returns:
        The context size in bytes.

    Raises:
        ValueError: The environment variable is set to something that is not a size, or
            ``lazy_loading=True`` with a CUDA older than 11.7.

    Example:
        >>> round(cuda_context_bytes("H200", cuda_version="13.0") / 2**20, 1)  # 702.8 measured
        702.9
        >>> round(cuda_context_bytes("RTX 3060") / 2**20, 1)
        273.2
        >>> cuda_context_bytes() == DEFAULT_CUDA_CONTEXT_BYTES  # an unknown card
        True
    """
    record = resolve_gpu(gpu)
    return context_and_source(record, lazy_loading=lazy_loading, cuda_version=cuda_version)[0]


def context_and_source(
    record: GPU | None, *, lazy_loading: bool | None, cuda_version: object = None
) -> tuple[int, str]:
    """The context size and what it was made of, in words (printed in an estimate)."""
    override = os.environ.get(CONTEXT_ENV_VAR)
    if override is not None and override.strip():
        try:
            return parse_bytes(override), CONTEXT_ENV_VAR
        except ValueError as e:
            raise ValueError(
                f"{CONTEXT_ENV_VAR}={override!r} is not a size; set it like '300MB' or "
                f"'287047680', or unset it for the default ({e})"
            ) from e
    if lazy_loading is not None and not isinstance(lazy_loading, bool):
        raise TypeError(f"lazy_loading must be True, False or None; got {lazy_loading!r}")
    version = ASSUMED_CUDA if cuda_version is None else parse_cuda_version(cuda_version)
    if version < LAZY_LOADING_SINCE and lazy_loading:
        raise ValueError(
            f"lazy_loading=True with cuda_version={cuda_version!r}: lazy module loading "
            "arrived in CUDA 11.7; drop one of the two"
        )
    bare = bare_context_bytes(record)
    card = "unknown card" if record is None else record.name
    sms = getattr(record, "sm_count", None)
    card += ", SM count unknown" if bare == UNKNOWN_CARD_BARE_BYTES else f", {sms} SMs"
    cuda = f"CUDA {version[0]}.{version[1]}" + (" assumed" if cuda_version is None else "")
    if version < LAZY_LOADING_SINCE or lazy_loading is False:
        libraries = EAGER_LIBRARY_BYTES[min(max(version[0], 10), 13)]
        how = "eager module loading: every library's kernels"
    else:
        libraries = sum(LAZY_FIRST_USE_BYTES.values())
        how = "lazy loading: PyTorch, cuBLAS and cuDNN kernels"
    text = f"{card}, {cuda}; bare {format_bytes(bare)} + {how} {format_bytes(libraries)}"
    return bare + libraries, text


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
