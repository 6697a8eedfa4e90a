"""What bitsandbytes' 4-bit matmul holds beside its operands: the weight it dequantizes.

A 4-bit weight remembers the dtype it was quantized from (``quant_state.dtype``), and
``dequantize_4bit`` gives that dtype back. The rules, read from bitsandbytes' sources
(``nn/modules.py``, ``autograd/_functions.py``, ``backends/cuda/ops.py`` at the tags
named below):

- **The dtype quantized from.** Before 0.43.0 ``Params4bit.cuda`` converted every weight
  to float16 first (``self.data.contiguous().half().cuda(device)``), so a 4-bit weight
  always dequantized to float16; 0.43.0 keeps the weight's own dtype (PR #970). Lightning
  Fabric's ``BitsandbytesPrecision`` still quantizes from float16 itself.
- **Backward** (every version): ``dequantize_4bit(B, state).to(grad_output.dtype)``, so a
  copy in the dtype quantized from and, when the compute dtype differs, a second one in
  the compute dtype, both alive while ``.to`` runs.
- **Forward before 0.50**: the same expression with the input's dtype, except one row
  without gradient (``gemv_4bit``: no copy).
- **Forward from 0.50**: ``bitsandbytes::gemm_4bit``. Up to 4 rows its fused kernel reads
  the 4-bit weight directly; past 1536 rows it dequantizes straight into the input's
  dtype (one copy); in between the card's architecture picks, and the copy is counted.
"""

from __future__ import annotations

from torchfit._bnb.layout import _version
from torchfit._core.units import DType

__all__ = [
    "FUSED_GEMM_FROM",
    "FUSED_ROWS",
    "QUANTIZES_FROM_FP16_BEFORE",
    "dequantized_bytes_per_weight",
    "quantized_from",
]

#: ``Params4bit._quantize`` keeps the weight's dtype from 0.43.0 (before: ``.half()``).
QUANTIZES_FROM_FP16_BEFORE = (0, 43, 0)
#: ``MatMul4Bit.forward`` calls the ``gemm_4bit`` op from 0.50.0.
FUSED_GEMM_FROM = (0, 50, 0)
#: Rows the fused kernel always takes (``_GEMM_4BIT_CUSTOM_FLOOR_M`` in 0.50.0).
FUSED_ROWS = 4


def quantized_from(base: DType, version: str | None = None) -> DType:
    """The dtype a 4-bit weight loaded in ``base`` dequantizes to, with bitsandbytes ``version``.

    ``None`` reads the installed version (with none installed, today's rule).

    Example:
        >>> quantized_from(DType.BF16, "0.41.1").value, quantized_from(DType.BF16, "0.43.0").value
        ('fp16', 'bf16')
    """
    numbers = _version(version)
    old = numbers is not None and numbers < QUANTIZES_FROM_FP16_BEFORE
    return DType.FP16 if old else base


def dequantized_bytes_per_weight(
    *, source: DType, compute: DType, rows: int | None, version: str | None = None
) -> int:
    """Bytes per weight that one 4-bit matmul holds as its dequantized weight.

    Args:
        source: The dtype the weight was quantized from (`quantized_from`).
        compute: The dtype of the matmul's input.
        rows: Rows of the forward's input (tokens); ``None`` for backward (training).
        version: bitsandbytes' version (``None``: the installed one).

    Example:
        >>> f16, b16 = DType.FP16, DType.BF16
        >>> dequantized_bytes_per_weight(source=f16, compute=b16, rows=None)  # backward
        4
        >>> dequantized_bytes_per_weight(source=f16, compute=b16, rows=300, version="0.41.1")
        4
        >>> dequantized_bytes_per_weight(source=f16, compute=b16, rows=300, version="0.50.0")
        2
        >>> dequantized_bytes_per_weight(source=b16, compute=b16, rows=3, version="0.50.0")
        0
    """
    both = int(source.itemsize) + (0 if source is compute else int(compute.itemsize))
    if rows is None:
        return both
    numbers = _version(version)
    if numbers is None or numbers >= FUSED_GEMM_FROM:
        return 0 if rows <= FUSED_ROWS else int(compute.itemsize)
    return 0 if rows == 1 else both
