"""Bytes of bitsandbytes-quantized layers, from the layout rules.

Everything here is pure arithmetic on shapes and dtypes: no bitsandbytes, no transformers.
The rules are read from bitsandbytes 0.50 (``functional.py``, ``_ops.py``, ``nn/modules.py``)
and checked to the byte against loaded models in the quantize tests. Both
`torchfit.memory` (device maps, quantized plans) and `torchfit.quantize` use them.
"""

from __future__ import annotations

import importlib.metadata
import re

from torchfit._core.ledger import CUDA_BLOCK, cuda_block_bytes

__all__ = [
    "INT8_TRANSPOSED_COPY_BEFORE",
    "KEEPS_4BIT_INPUT_BEFORE",
    "int8_load_copies_transposed",
    "keeps_4bit_input",
    "BLOCKSIZE",
    "CUDA_BLOCK",
    "NESTED_BLOCKSIZE",
    "held_bytes",
    "linear4bit_bytes",
    "linear4bit_tensors",
    "linear8bit_bytes",
    "quantized_linear_bytes",
]

#: Weights per 4-bit block: bitsandbytes ``quantize_4bit`` uses 64 when no blocksize is
#: given, and transformers' ``Linear4bit`` never passes one (functional.py, nn/modules.py).
BLOCKSIZE = 64
#: Double quantization quantizes the fp32 absmax values again in blocks of 256
#: (``quantize_4bit(compress_statistics=True)`` calls ``quantize_blockwise(..., blocksize=256)``).
NESTED_BLOCKSIZE = 256
_FP32 = 4
_BF16 = 2
#: The 4-bit code book (``get_4bit_type``): 16 fp32 values, a fresh tensor for every layer.
_CODE_4BIT = 16 * _FP32
#: The nested code book: the 256-value dynamic map, copied for every layer
#: (``quantize_blockwise`` stores ``code.to(device, copy=True)``).
_CODE_NESTED = 256 * _FP32


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def held_bytes(nbytes: int, device: str) -> int:
    """Bytes a tensor of ``nbytes`` really holds on ``device`` (``"cuda"`` rounds to 512).

    The CUDA caching allocator hands out multiples of `CUDA_BLOCK` (512) bytes, so a
    4-byte offset holds 512 bytes of GPU memory.

    Example:
        >>> held_bytes(4, "cuda"), held_bytes(4, "cpu"), held_bytes(0, "cuda")
        (512, 4, 0)
    """
    return cuda_block_bytes(nbytes) if device == "cuda" else nbytes


def linear4bit_tensors(
    numel: int,
    *,
    double_quant: bool,
    blocksize: int = BLOCKSIZE,
    cpu_packed: bool = False,
) -> tuple[int, tuple[int, ...]]:
    """Bytes of one 4-bit weight (NF4 or FP4) and of each tensor of its ``quant_state``.

    The packed weight holds two 4-bit codes per byte, the last byte padded when ``numel``
    is odd: ``(numel + 1) // 2`` bytes (bitsandbytes ``_ops.py``, fake ``quantize_4bit``).
    The flattened weight is cut into ``ceil(numel / blocksize)`` blocks, the last one
    padded, each with an fp32 absmax. Double quantization stores instead one uint8 per
    block, an fp32 offset (their mean), an fp32 absmax per 256 blocks and the 256-entry
    nested code book. Every layer also keeps its own 16-entry fp32 code book.

    ``cpu_packed`` is the layout after the first inference forward on a CPU with
    AVX512-BF16, where bitsandbytes repacks the layer for its fused kernel
    (``functional._convert_weight_packed_for_cpu``): the absmax is dequantized to one
    bf16 per block and the nested statistics are dropped; the offset stays referenced.

    Returns:
        ``(packed weight bytes, bytes of each quant_state tensor)``.

    Example:
        >>> linear4bit_tensors(65, double_quant=False)  # 33 bytes; 2 blocks, the last padded
        (33, (8, 64))
        >>> linear4bit_tensors(64 * 256, double_quant=True)
        (8192, (256, 4, 4, 1024, 64))
    """
    if numel < 0 or blocksize <= 0:
        raise ValueError(f"numel must be >= 0 and blocksize > 0; got {numel}, {blocksize}")
    weight = (numel + 1) // 2
    blocks = _ceil_div(numel, blocksize)
    if cpu_packed:
        offset = (_FP32,) if double_quant else ()
        return weight, (blocks * _BF16, _CODE_4BIT, *offset)
    if not double_quant:
        return weight, (blocks * _FP32, _CODE_4BIT)
    nested = _ceil_div(blocks, NESTED_BLOCKSIZE)
    return weight, (blocks, _FP32, nested * _FP32, _CODE_NESTED, _CODE_4BIT)


def linear4bit_bytes(
    numel: int,
    *,
    double_quant: bool,
    blocksize: int = BLOCKSIZE,
    cpu_packed: bool = False,
) -> tuple[int, int]:
    """Bytes of one 4-bit weight: ``(packed weight, scales)``; see `linear4bit_tensors`.

    Example:
        >>> linear4bit_bytes(4096 * 4096, double_quant=False)  # 4.5 bits per weight
        (8388608, 1048640)
        >>> weight, scales = linear4bit_bytes(4096 * 4096, double_quant=True)
        >>> round((weight + scales) * 8 / (4096 * 4096), 3)
        4.127
    """
    weight, scales = linear4bit_tensors(
        numel, double_quant=double_quant, blocksize=blocksize, cpu_packed=cpu_packed
    )
    return weight, sum(scales)


def linear8bit_bytes(out_features: int, in_features: int) -> tuple[int, int]:
    """Bytes of one LLM.int8 weight: ``(int8 weight, scales)``.

    One int8 per weight and one fp32 absmax per output row (``SCB``), from
    ``int8_vectorwise_quant`` (bitsandbytes ``_ops.py``: ``row_stats`` has
    ``numel // shape[-1]`` fp32 entries).

    Example:
        >>> linear8bit_bytes(4096, 4096)
        (16777216, 16384)
    """
    if out_features < 0 or in_features < 0:
        raise ValueError(f"a layer shape must be >= 0; got {out_features} x {in_features}")
    return out_features * in_features, out_features * _FP32


def quantized_linear_bytes(
    out_features: int,
    in_features: int,
    *,
    bits: int,
    double_quant: bool,
    device: str,
    cpu_packed: bool = False,
) -> tuple[int, int]:
    """Bytes one bitsandbytes weight holds on ``device``: ``(packed weight, its scales)``.

    The one per-tensor rule behind the quantized footprints and the device maps: LLM.int8
    (``bits=8``, `linear8bit_bytes`) or 4-bit (`linear4bit_tensors`), each tensor (the
    weight, every ``quant_state`` tensor) rounded on its own as ``device`` holds it
    (`held_bytes`).

    Example:
        >>> quantized_linear_bytes(64, 64, bits=4, double_quant=False, device="cpu")
        (2048, 320)
        >>> quantized_linear_bytes(64, 64, bits=4, double_quant=False, device="cuda")
        (2048, 1024)
        >>> quantized_linear_bytes(64, 64, bits=8, double_quant=False, device="cuda")
        (4096, 512)
    """
    if bits == 8:
        weight, row_scales = linear8bit_bytes(out_features, in_features)
        parts: tuple[int, ...] = (row_scales,)
    elif bits == 4:
        weight, parts = linear4bit_tensors(
            out_features * in_features, double_quant=double_quant, cpu_packed=cpu_packed
        )
    else:
        raise ValueError(f"bitsandbytes weights have 4 or 8 bits; got bits={bits!r}")
    return held_bytes(weight, device), sum(held_bytes(part, device) for part in parts)


#: bitsandbytes stopped keeping a 4-bit layer's input for backward in 0.43.2 (PR #1270,
#: "fix QLoRA mem bug: delete useless buffered activation": ``MatMul4Bit.forward`` saved
#: ``ctx.tensors = (A, B)`` before, ``(None, B)`` since). A frozen 4-bit Linear needs only
#: its weight to pass the gradient on, so newer versions keep nothing of its input.
KEEPS_4BIT_INPUT_BEFORE = (0, 43, 2)


def keeps_4bit_input(version: str | None = None) -> bool:
    """Whether bitsandbytes ``version`` keeps every 4-bit Linear's input for backward.

    ``None`` reads the installed version (without importing bitsandbytes); with none
    installed, today's behaviour (False) is assumed.

    Example:
        >>> keeps_4bit_input("0.41.1"), keeps_4bit_input("0.43.2"), keeps_4bit_input("0.50.2")
        (True, False, False)
    """
    numbers = _version(version)
    return numbers is not None and numbers < KEEPS_4BIT_INPUT_BEFORE


#: bitsandbytes 0.45.0 quantizes an int8 weight with ``int8_vectorwise_quant``; before,
#: ``Int8Params.cuda`` called ``double_quant``, which also made a transposed int8 copy.
INT8_TRANSPOSED_COPY_BEFORE = (0, 45, 0)


def int8_load_copies_transposed(version: str | None = None) -> bool:
    """Whether loading an int8 weight with bitsandbytes ``version`` makes a transposed copy.

    Example:
        >>> int8_load_copies_transposed("0.41.1"), int8_load_copies_transposed("0.45.0")
        (True, False)
    """
    numbers = _version(version)
    return numbers is not None and numbers < INT8_TRANSPOSED_COPY_BEFORE


def _version(version: str | None) -> tuple[int, ...] | None:
    """``(major, minor, patch)`` of ``version``, or of the installed bitsandbytes (None: none)."""
    if version is None:
        try:
            version = importlib.metadata.version("bitsandbytes")
        except importlib.metadata.PackageNotFoundError:
            return None
    if not isinstance(version, str):
        raise TypeError(f"bitsandbytes_version must be a string like '0.41.1'; got {version!r}")
    found = re.match(r"v?(\d+)(?:\.(\d+))?(?:\.(\d+))?(?!\d|\.\d)", version.strip())
    parts = [p for p in found.groups() if p is not None] if found else []
    if not parts:
        raise ValueError(f"cannot read the bitsandbytes version {version!r}; pass it like '0.41.1'")
    return tuple(int(p) for p in parts) + (0,) * (3 - len(parts))
