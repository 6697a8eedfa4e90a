"""What the hardware does natively, and which device a run means: one rule each.

Native bf16 and fp8 follow the CUDA compute capability (CUDA C++ Programming Guide,
"Compute Capabilities"): bf16 tensor cores from 8.0 (Ampere), fp8 from 8.9 (Ada).
``torch.cuda.is_bf16_supported()`` alone does not tell: its default
``including_emulation=True`` (``torch/cuda/__init__.py``, PyTorch >= 2.4) answers True on
a T4 (7.5), where bf16 is emulated and cuDNN has no bf16 convolutions below sm_80. The
GPU catalog (`torchfit.memory.gpus`), the precision choice (`torchfit.precision`) and
the 4-bit compute dtype (`torchfit.quantize`) all ask this module.

A device given as ``None`` means CUDA when torch sees a GPU, else the CPU, everywhere.
"""

from __future__ import annotations

import torch

__all__ = [
    "BF16_CAPABILITY",
    "FP8_CAPABILITY",
    "cuda_native_bf16",
    "default_device",
    "native_bf16",
    "native_fp8",
    "parse_device",
]

#: First compute capability with native bf16 tensor-core math (Ampere).
BF16_CAPABILITY = (8, 0)
#: First compute capability with native fp8 tensor-core math (Ada Lovelace).
FP8_CAPABILITY = (8, 9)


def native_bf16(capability: tuple[int, int] | None) -> bool:
    """Whether a CUDA compute capability runs bf16 natively (8.0 and later).

    ``None`` (unknown, or an AMD card, which reports none) is not native.

    Example:
        >>> native_bf16((8, 0)), native_bf16((7, 5)), native_bf16(None)
        (True, False, False)
    """
    return capability is not None and tuple(capability) >= BF16_CAPABILITY


def native_fp8(capability: tuple[int, int] | None) -> bool:
    """Whether a CUDA compute capability runs fp8 natively (8.9 and later).

    Example:
        >>> native_fp8((8, 9)), native_fp8((8, 6)), native_fp8(None)
        (True, False, False)
    """
    return capability is not None and tuple(capability) >= FP8_CAPABILITY


def cuda_native_bf16(device: torch.device | str | int | None = None) -> bool:
    """Whether torch's CUDA ``device`` (the current one by default) runs bf16 natively.

    The capability decides (`native_bf16`), and torch must agree that bf16 is not
    emulated: ``torch.cuda.is_bf16_supported(including_emulation=False)`` where this
    torch has the keyword. False without a CUDA device.

    Example:
        >>> cuda_native_bf16() if not torch.cuda.is_available() else False
        False
    """
    if not torch.cuda.is_available():
        return False
    if not native_bf16(tuple(torch.cuda.get_device_capability(device))):  # type: ignore[arg-type]
        return False
    try:
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # a torch without the keyword (< 2.4): the capability decides
        return True


def default_device() -> torch.device:
    """CUDA when torch sees a GPU, else the CPU: what ``device=None`` means in torchfit.

    Example:
        >>> default_device().type in {"cuda", "cpu"}
        True
    """
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def parse_device(device: torch.device | str | int | None) -> torch.device:
    """A ``torch.device`` from ``device``; ``None`` means `default_device`.

    Raises:
        ValueError: ``device`` is not something ``torch.device`` reads; the message
            names it and shows the accepted forms.

    Example:
        >>> parse_device("cpu")
        device(type='cpu')
        >>> parse_device("gpu")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ValueError: device must be a torch.device or a string such as 'cuda:0' or 'cpu'; ...
    """
    if device is None:
        return default_device()
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(
            f"device must be a torch.device or a string such as 'cuda:0' or 'cpu'; got {device!r}"
        ) from exc
