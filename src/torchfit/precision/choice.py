"""Which precision to train in, decided from what the hardware really does.

`choose_precision` is a pure decision over torch's own capability checks
(``torch.cuda.get_device_capability``, ``torch.cuda.is_bf16_supported``,
``torch.cpu._is_avx512_bf16_supported`` ...), so tests fake a GPU or a CPU by
monkeypatching those checks. Native bf16 on CUDA and the meaning of ``device=None`` are
`torchfit._core.hardware`'s rules, shared with the GPU catalog and torchfit.quantize.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import torch

from torchfit._core import checks, hardware
from torchfit._core.hardware import parse_device
from torchfit._core.units import DType, parse_dtype

__all__ = ["Precision", "PrecisionChoice", "choose_precision", "parse_precision", "resolve_device"]


class Precision(enum.StrEnum):
    """The math a training step runs in: ``auto`` is resolved to one of the other three."""

    AUTO = "auto"
    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"

    @property
    def torch_dtype(self) -> torch.dtype:
        """The autocast dtype (``float32`` for fp32, which runs without autocast)."""
        if self is Precision.AUTO:
            raise ValueError("Precision.AUTO has no dtype until choose_precision() resolves it")
        return {
            Precision.BF16: torch.bfloat16,
            Precision.FP16: torch.float16,
            Precision.FP32: torch.float32,
        }[self]


_FROM_DTYPE = {DType.BF16: Precision.BF16, DType.FP16: Precision.FP16, DType.FP32: Precision.FP32}


def parse_precision(value: str | torch.dtype | DType | Precision) -> Precision:
    """``"auto"``, ``"bf16"`` (or ``"bfloat16"``, ``torch.bfloat16``), ``"fp16"``, ``"fp32"``.

    Raises:
        ValueError: any other value; the message lists the choices.

    Example:
        >>> parse_precision("bfloat16")
        <Precision.BF16: 'bf16'>
        >>> parse_precision(torch.float16)
        <Precision.FP16: 'fp16'>
    """
    if isinstance(value, Precision):
        return value
    if isinstance(value, str) and value.strip().lower() == "auto":
        return Precision.AUTO
    choices = "'auto', 'bf16', 'fp16' or 'fp32' (or torch.bfloat16 / torch.float16 / torch.float32)"
    try:
        dtype = parse_dtype(value)
    except (TypeError, ValueError):
        raise ValueError(f"unknown precision {value!r}; expected {choices}") from None
    found = _FROM_DTYPE.get(dtype)
    if found is None:
        raise ValueError(
            f"precision {value!r} cannot drive mixed-precision training; expected {choices}. "
            "Quantized weights (int8/4-bit) are loaded with torchfit.quantize, not trained here."
        )
    return found


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The device a run trains on: ``None`` means CUDA when available, else the CPU.

    `torchfit._core.hardware.parse_device` reads it; training, unlike loading batches,
    cannot go ahead on a CUDA device torch does not see, so that is refused here.

    Raises:
        ValueError: a CUDA device was asked for and torch sees no GPU, or ``device`` is
            not a device.

    Example:
        >>> resolve_device("cpu")
        device(type='cpu')
    """
    resolved = hardware.parse_device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device={str(device)!r} but torch.cuda.is_available() is False (a CPU-only torch "
            "build or no visible GPU); pass device='cpu', or install a CUDA build of torch"
        )
    return resolved


@dataclasses.dataclass(frozen=True)
class PrecisionChoice:
    """The precision a run uses, whether it needs a loss scaler, and why.

    Attributes:
        precision: bf16, fp16 or fp32 (never ``auto``).
        requested: what was asked for (``auto`` or the explicit precision).
        device: the device the decision is for, e.g. ``"cuda:0"`` or ``"cpu"``.
        scaler: True when fp16 gradients need a ``torch.amp.GradScaler``.
        reason: one sentence on what the hardware does that led to the choice.
    """

    precision: Precision
    requested: Precision
    device: str
    scaler: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """Plain types only (for logs and JSON)."""
        data = dataclasses.asdict(self)
        data["precision"] = str(self.precision)
        data["requested"] = str(self.requested)
        return data

    def __str__(self) -> str:
        """A small table: precision, scaler, device, reason."""
        rows = [
            ("precision", f"{self.precision} (requested: {self.requested})"),
            ("loss scaler", "GradScaler" if self.scaler else "none"),
            ("device", self.device),
            ("reason", self.reason),
        ]
        return "\n".join(["PrecisionChoice"] + [f"  {name:<11}  {value}" for name, value in rows])


@checks.arguments(
    dtype=checks.parsed(parse_precision), device=checks.parsed(parse_device, kinds=(str,))
)
def choose_precision(
    dtype: str | torch.dtype | DType | Precision = "auto",
    *,
    device: str | torch.device | None = None,
) -> PrecisionChoice:
    """Resolve ``dtype`` (``"auto"`` or explicit) for ``device``, with the reason.

    ``"auto"`` on CUDA: bf16 on compute capability >= 8.0 where torch reports native
    (not emulated) bf16; fp16 with a GradScaler where fp16 arithmetic is fast (tensor
    cores from sm_70, and sm_53/60/62); fp32 where fp16 is slow (sm_61: GTX 10xx).
    On a CPU: bf16 where the CPU has AVX512-BF16 or AMX (oneDNN runs bf16 natively),
    fp32 otherwise. Other devices: fp32 (pass an explicit dtype). An explicit dtype is
    always honoured; fp16 always gets a scaler.

    Raises:
        ValueError: unknown ``dtype``; a CUDA device without a GPU; a device type that
            torch cannot autocast.

    Example:
        >>> choice = choose_precision("fp16", device="cpu")
        >>> choice.precision, choice.scaler
        (<Precision.FP16: 'fp16'>, True)
        >>> choose_precision("fp32", device="cpu").reason
        'requested explicitly'
    """
    requested = parse_precision(dtype)
    target = resolve_device(device)
    if requested is Precision.AUTO:
        precision, reason = _auto(target)
    else:
        if requested is not Precision.FP32 and not torch.amp.is_autocast_available(target.type):
            raise ValueError(
                f"torch cannot autocast on device type {target.type!r}; use dtype='fp32' there, "
                "or train on 'cuda' or 'cpu'"
            )
        precision, reason = requested, "requested explicitly"
    return PrecisionChoice(
        precision=precision,
        requested=requested,
        device=str(target),
        scaler=precision is Precision.FP16,
        reason=reason,
    )


def _auto(device: torch.device) -> tuple[Precision, str]:
    if device.type == "cuda":
        return _auto_cuda(device)
    if device.type == "cpu":
        return _auto_cpu()
    return Precision.FP32, (
        f"no hardware rule for device type {device.type!r}; pass dtype='bf16' or 'fp16' "
        "explicitly if it computes those natively"
    )


# Compute capabilities with fast fp16 arithmetic but no tensor cores. The CUDA C++
# Programming Guide's "Arithmetic Instructions" throughput table gives 16-bit add/multiply
# at twice the fp32 rate on sm_53/60/62, but 2 results per clock per SM on sm_61 (vs 128
# for fp32): GTX 10xx cards run fp16 math ~64x slower than fp32.
_FAST_FP16_PRE_VOLTA = frozenset({(5, 3), (6, 0), (6, 2)})


def _auto_cuda(device: torch.device) -> tuple[Precision, str]:
    major, minor = torch.cuda.get_device_capability(device)
    where = f"{device} (compute capability {major}.{minor})"
    if hardware.cuda_native_bf16(device):
        return Precision.BF16, (
            f"{where} has native bf16 tensor cores (capability >= 8.0): bf16 keeps fp32's "
            "range, so no loss scaling is needed"
        )
    if major >= 7 or (major, minor) in _FAST_FP16_PRE_VOLTA:
        # torch >= 2.4 reports bf16 as supported on e.g. a T4 (sm_75) because it can be
        # emulated: is_bf16_supported's including_emulation defaults to True
        # (torch/cuda/__init__.py). cuDNN has no bf16 convolutions below capability 8.0.
        cores = "fp16 tensor cores" if major >= 7 else "fast fp16 arithmetic"
        return Precision.FP16, (
            f"{where} has {cores} but no native bf16 (capability < 8.0: bf16 would be "
            "emulated): fp16 with a GradScaler"
        )
    return Precision.FP32, (
        f"{where} runs fp16 arithmetic far slower than fp32 and has no bf16: fp32"
    )


def _auto_cpu() -> tuple[Precision, str]:
    if not torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]
        return Precision.FP32, "this torch build has no oneDNN, so CPU bf16 is not native: fp32"
    feature = _cpu_bf16_feature()
    if feature is None:
        return Precision.FP32, (
            "the CPU reports neither AVX512-BF16 nor AMX (torch.cpu checks), so bf16 would be "
            "emulated and slower than fp32: fp32 (ARM CPUs with the BF16 extension are not "
            "detected; pass dtype='bf16' there)"
        )
    return Precision.BF16, (
        f"the CPU has {feature}: oneDNN runs bf16 matmuls and convolutions natively, no loss "
        "scaling needed"
    )


def _cpu_bf16_feature() -> str | None:
    """The CPU feature that makes bf16 native, from torch's own checks (x86 only)."""
    # torch.cpu exposes these private probes (torch 2.13); getattr keeps older builds working.
    checks = (
        ("AMX (AMX-BF16 tiles)", "_is_amx_tile_supported"),
        ("AVX512-BF16", "_is_avx512_bf16_supported"),
    )
    for name, attribute in checks:
        probe = getattr(torch.cpu, attribute, None)
        if probe is not None and probe():
            return name
    return None
