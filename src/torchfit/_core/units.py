"""Parsing and formatting of byte sizes and data types.

Every public function that takes a size or a dtype goes through here, so that
"12GB", "12 GiB", 12884901888, "bf16" and ``torch.bfloat16`` all mean one thing and
nonsense ("-3GB", "twelve", "int3") fails at the door with the fix in the message.
"""

from __future__ import annotations

import enum
import math
import numbers
import re
from fractions import Fraction

import torch

from torchfit._core import checks

__all__ = ["DType", "format_bytes", "parse_bytes", "parse_dtype"]

_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: float | str) -> int:
    """Turn a size into a whole number of bytes.

    Decimal units (KB, MB, GB, TB) are powers of 1000, binary units (KiB, MiB, GiB, TiB)
    powers of 1024; a bare ``K``/``M``/``G``/``T`` is binary, as in ``ulimit`` and
    ``torch.cuda`` tooling.

    Args:
        value: A byte count (``int`` or whole ``float``) or a string such as ``"12GB"``,
            ``"12 GiB"`` or ``"512MiB"``.

    Returns:
        The size in bytes, rounded down to a whole byte.

    Raises:
        TypeError: ``value`` is neither a number nor a string.
        ValueError: ``value`` is negative, not a number, or has an unknown unit.

    Example:
        >>> parse_bytes("12GB")
        12000000000
        >>> parse_bytes("1.5 GiB")
        1610612736
        >>> parse_bytes(4096)
        4096
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real | str):
        raise TypeError(
            f"a size must be a number of bytes or a string like '12GB'; got {value!r} "
            f"of type {type(value).__name__}"
        )
    if isinstance(value, str):
        match = _SIZE_RE.match(value)
        if match is None:
            raise ValueError(
                f"cannot read {value!r} as a size; expected a non-negative number with an "
                "optional unit, e.g. '12GB', '12 GiB', '512MiB' or 12884901888"
            )
        number, unit = match.groups()
        factor = _UNITS.get(unit.lower())
        if factor is None:
            raise ValueError(
                f"unknown size unit {unit!r} in {value!r}; use one of "
                "B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024)"
            )
        return int(Fraction(number) * factor)  # exact: no float rounding of big sizes
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"a size must be a finite number of bytes >= 0; got {value!r}")
    return int(value)  # numpy integers too


def format_bytes(num_bytes: float) -> str:
    """Format a byte count in binary units, the way ``nvidia-smi`` and PyTorch report memory.

    Example:
        >>> format_bytes(12884901888)
        '12.00 GiB'
        >>> format_bytes(1536)
        '1.50 KiB'
        >>> format_bytes(-2 * 2**20)
        '-2.00 MiB'
        >>> format_bytes(float("nan"))
        Traceback (most recent call last):
        ValueError: num_bytes must be a finite number; got nan
    """
    # Checked here rather than by `checks.arguments`: tables and messages call this often.
    if isinstance(num_bytes, bool) or not isinstance(num_bytes, numbers.Real):
        raise checks.fail("num_bytes", "a number of bytes", num_bytes, kind=TypeError)
    if not math.isfinite(num_bytes):
        raise checks.fail("num_bytes", "a finite number", num_bytes)
    sign = "-" if num_bytes < 0 else ""
    size = abs(float(num_bytes))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{sign}{size:.0f} {unit}" if unit == "B" else f"{sign}{size:.2f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


class DType(enum.Enum):
    """A storage type for weights, activations or caches, with its size in bits.

    Covers torch's floating types and the quantized formats that have no
    ``torch.dtype`` of their own (``int4``/``nf4``/``fp4`` weights).
    """

    FP64 = "fp64"
    FP32 = "fp32"
    TF32 = "tf32"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"
    INT8 = "int8"
    INT4 = "int4"
    NF4 = "nf4"
    FP4 = "fp4"

    @property
    def bits(self) -> int:
        """Bits per element as stored (a 4-bit format packs two elements per byte)."""
        return _BITS[self]

    @property
    def itemsize(self) -> float:
        """Bytes per element as stored; 0.5 for the 4-bit formats."""
        return self.bits / 8

    def autocasts(self, *, mixed: bool | None, training: bool = True) -> bool:
        """Whether a step computing in this dtype is mixed precision (fp32 masters).

        ``mixed`` as given; left out (``None``), a 16-bit compute dtype trains under
        autocast, the estimators' default, and inference is never mixed.

        Example:
            >>> DType.BF16.autocasts(mixed=None), DType.FP32.autocasts(mixed=None)
            (True, False)
            >>> DType.BF16.autocasts(mixed=None, training=False), DType.BF16.autocasts(mixed=False)
            (False, False)
        """
        if mixed is None:
            return training and self.bits == 16
        return bool(mixed)

    def master(self, *, mixed: bool) -> DType:
        """The dtype parameters that train in this compute dtype (and their gradients) keep.

        fp32 under autocast of a 16-bit dtype (fp32 masters) and for TF32 (fp32 storage);
        otherwise this dtype itself (pure 16-bit training).

        Example:
            >>> DType.BF16.master(mixed=True), DType.BF16.master(mixed=False)
            (<DType.FP32: 'fp32'>, <DType.BF16: 'bf16'>)
        """
        if (mixed and self.bits == 16) or self is DType.TF32:
            return DType.FP32
        return self

    @property
    def is_quantized(self) -> bool:
        """True for int8 and the 4-bit formats, which need scales beside the weights."""
        return self in {DType.INT8, DType.INT4, DType.NF4, DType.FP4}

    @property
    def torch_dtype(self) -> torch.dtype:
        """The ``torch.dtype`` that holds this format (``uint8`` for packed 4-bit)."""
        return _TORCH[self]


_BITS: dict[DType, int] = {
    DType.FP64: 64,
    DType.FP32: 32,
    DType.TF32: 32,  # TF32 is a compute mode; tensors are stored as fp32
    DType.FP16: 16,
    DType.BF16: 16,
    DType.FP8: 8,
    DType.INT8: 8,
    DType.INT4: 4,
    DType.NF4: 4,
    DType.FP4: 4,
}
_TORCH: dict[DType, torch.dtype] = {
    DType.FP64: torch.float64,
    DType.FP32: torch.float32,
    DType.TF32: torch.float32,
    DType.FP16: torch.float16,
    DType.BF16: torch.bfloat16,
    DType.FP8: torch.float8_e4m3fn,
    DType.INT8: torch.int8,
    DType.INT4: torch.uint8,
    DType.NF4: torch.uint8,
    DType.FP4: torch.uint8,
}
_ALIASES: dict[str, DType] = {
    "fp64": DType.FP64,
    "float64": DType.FP64,
    "double": DType.FP64,
    "fp32": DType.FP32,
    "float32": DType.FP32,
    "float": DType.FP32,
    "32": DType.FP32,
    "tf32": DType.TF32,
    "fp16": DType.FP16,
    "float16": DType.FP16,
    "half": DType.FP16,
    "16": DType.FP16,
    "bf16": DType.BF16,
    "bfloat16": DType.BF16,
    "fp8": DType.FP8,
    "float8": DType.FP8,
    "e4m3": DType.FP8,
    "e5m2": DType.FP8,
    "int8": DType.INT8,
    "8bit": DType.INT8,
    "llm.int8": DType.INT8,
    "int4": DType.INT4,
    "4bit": DType.INT4,
    "nf4": DType.NF4,
    "fp4": DType.FP4,
}
_FROM_TORCH: dict[torch.dtype, DType] = {
    torch.float64: DType.FP64,
    torch.float32: DType.FP32,
    torch.float16: DType.FP16,
    torch.bfloat16: DType.BF16,
    torch.float8_e4m3fn: DType.FP8,
    torch.float8_e5m2: DType.FP8,
    torch.int8: DType.INT8,
    torch.uint8: DType.INT8,
}


def parse_dtype(value: str | torch.dtype | DType) -> DType:
    """Turn ``"bf16"``, ``"bfloat16"``, ``torch.bfloat16`` or ``DType.BF16`` into a `DType`.

    Raises:
        TypeError: ``value`` is not a string, ``torch.dtype`` or `DType`.
        ValueError: the name is unknown; the message lists the accepted names.

    Example:
        >>> parse_dtype("bf16")
        <DType.BF16: 'bf16'>
        >>> import torch
        >>> parse_dtype(torch.float16).bits
        16
        >>> parse_dtype("nf4").itemsize
        0.5
    """
    if isinstance(value, DType):
        return value
    if isinstance(value, torch.dtype):
        found = _FROM_TORCH.get(value)
        if found is None:
            raise ValueError(
                f"torch dtype {value} has no memory model in torchfit; use one of "
                f"{', '.join(str(d) for d in _FROM_TORCH)}"
            )
        return found
    if not isinstance(value, str):
        raise TypeError(
            f"a dtype must be a string like 'bf16' or a torch.dtype; got {value!r} "
            f"of type {type(value).__name__}"
        )
    key = value.strip().lower().removeprefix("torch.")
    found = _ALIASES.get(key)
    if found is None:
        names = ", ".join(d.value for d in DType)
        raise ValueError(f"unknown dtype {value!r}; expected one of {names} (or a torch.dtype)")
    return found
