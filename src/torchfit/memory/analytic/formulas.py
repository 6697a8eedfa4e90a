"""Closed forms in bytes: attention, KV cache, transformer activations.

Pure functions of a few integers: no model is built, so they answer "what if seq_len
were 8192?" for a 175B model in microseconds. Every count here was derived from the
tensors autograd really saves (``torch.autograd.graph.saved_tensors_hooks`` on
transformers' GPT-2, Llama and BERT blocks, torch 2.13) and is checked against real
allocations in ``tests/memory/test_estimator.py``; the comments name what each term is.
"""

from __future__ import annotations

import enum
import math

from torchfit._core import checks
from torchfit._core.units import DType, parse_dtype
from torchfit.memory.analytic.arch import TransformerSpec, spec_from_config
from torchfit.memory.catalog.resolve import model_config

__all__ = [
    "AttentionImpl",
    "attention_bytes",
    "dropout_mask_bytes",
    "kv_cache_bytes",
    "kv_cache_bytes_for",
    "spec_kv_bytes",
]

FP32 = 4  # bytes of an fp32 element: statistics, loss logits, master weights
INT64 = 8  # bytes of an index (token ids, labels, max-pool indices)


class AttentionImpl(enum.StrEnum):
    """How attention is computed, which decides whether the s x s matrix is kept."""

    EAGER = "eager"  # explicit softmax(QK^T) V: scores and probabilities materialized
    SDPA = "sdpa"  # torch's scaled_dot_product_attention: the backend depends on device/dropout
    FLASH = "flash"  # flash / memory-efficient kernels: O(s) state (output + log-sum-exp)


def parse_attention(value: str | AttentionImpl) -> AttentionImpl:
    """``"eager"``, ``"sdpa"`` or ``"flash"`` (``"flash_attention_2"`` is ``"flash"``)."""
    key = str(value).strip().lower()
    key = {"flash_attention_2": "flash", "flash_attention_3": "flash", "math": "eager"}.get(
        key, key
    )
    try:
        return AttentionImpl(key)
    except ValueError:
        raise ValueError(
            f"unknown attention implementation {value!r}; expected 'eager', 'sdpa' or 'flash'"
        ) from None


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive integer; got {value!r}")


def dropout_mask_bytes(dtype: DType, device: str) -> float:
    """Bytes per element of a dropout mask that autograd keeps.

    On CUDA ``native_dropout`` keeps a bool mask (1 byte). On CPU ATen's non-fused
    path multiplies by a noise tensor of the input's dtype and keeps that
    (``aten/src/ATen/native/Dropout.cpp``: ``is_fused_kernel_acceptable`` is CUDA-only).
    """
    return 1.0 if device == "cuda" else dtype.itemsize


def sdpa_is_flash(
    *, device: str, training: bool, dropout: float, fp32_grouped: bool = False
) -> bool:
    """Whether ``scaled_dot_product_attention`` runs a kernel that keeps O(s) state.

    CPU (torch 2.13): the flash kernel ``_scaled_dot_product_flash_attention_for_cpu``
    has no dropout, so training with dropout falls back to the math path, which keeps
    the probabilities and the dropout mask like eager attention (measured here, torch 2.13
    CPU, a 4-layer GPT-2 at batch 4 x seq 256, training: with ``attn_pdrop=0.1`` SDPA
    peaks exactly like eager; with dropout 0 it peaks 8.3 MB lower). It takes grouped
    key/value heads (``enable_gqa``) in any dtype.
    CUDA: flash and memory-efficient kernels support dropout, but flash takes fp16/bf16
    only and the memory-efficient kernel no grouped heads
    (``check_batch_size_and_num_heads_dense<false>`` in its constraints,
    aten/src/ATen/native/transformers/cuda/sdp_utils.cpp). ``fp32_grouped``: fp32
    attention with fewer key/value heads than query heads, passed with ``enable_gqa=True``
    (transformers does so without a mask), which leaves CUDA only the math path
    (measured on an H200: a fp32 Llama-3.2-1B step keeps the s x s probabilities).
    """
    if device == "cuda":
        return not fp32_grouped
    return not (training and dropout > 0)


def keeps_linear_state(
    implementation: str | AttentionImpl,
    *,
    device: str,
    training: bool,
    dropout: float,
    fp32_grouped: bool = False,
) -> bool:
    """Whether this attention keeps O(s) state (flash-style) rather than the s x s matrix.

    Example:
        >>> keeps_linear_state("sdpa", device="cpu", training=True, dropout=0.1)
        False
        >>> keeps_linear_state("sdpa", device="cuda", training=True, dropout=0, fp32_grouped=True)
        False
    """
    impl = parse_attention(implementation)
    return impl is AttentionImpl.FLASH or (
        impl is AttentionImpl.SDPA
        and sdpa_is_flash(
            device=device, training=training, dropout=dropout, fp32_grouped=fp32_grouped
        )
    )


@checks.arguments(
    batch_size=checks.whole(at_least=1),
    seq_len=checks.whole(at_least=1),
    num_heads=checks.whole(at_least=1),
    head_dim=checks.whole(at_least=1),
    implementation=checks.parsed(parse_attention, kinds=(str,)),
    dropout=checks.number(at_least=0, below=1),
    num_kv_heads=checks.whole(at_least=1),
    device=checks.one_of("cuda", "cpu"),
)
def attention_bytes(
    *,
    batch_size: int,
    seq_len: int,
    num_heads: int,
    head_dim: int,
    dtype: str | DType = "fp32",
    implementation: str | AttentionImpl = "sdpa",
    training: bool = True,
    dropout: float = 0.0,
    num_kv_heads: int | None = None,
    device: str = "cuda",
    fp32_softmax: bool = False,
) -> int:
    """What the attention core of one layer keeps alive, in bytes.

    Training: the tensors saved for backward between the Q/K/V projections and the output
    projection. Eager (and SDPA's math fallback): Q, K^T and V as made contiguous for the
    batched matmuls, the b·a·s² probabilities, and with dropout the b·a·s² mask and
    dropped probabilities. Flash / memory-efficient SDPA: Q, K, V, the output and the
    fp32 log-sum-exp — O(s), no s² term. Inference: the largest transient (eager: the
    scores and the probabilities at once; flash: the output). ``fp32_softmax``: the
    probabilities are computed in fp32 and cast back for the matmul (CUDA autocast, and
    Llama-style eager attention), so softmax keeps its fp32 output and the matmul the
    16-bit copy.

    Example:
        >>> eager = attention_bytes(batch_size=1, seq_len=2048, num_heads=32, head_dim=128,
        ...                         dtype="bf16", implementation="eager")
        >>> flash = attention_bytes(batch_size=1, seq_len=2048, num_heads=32, head_dim=128,
        ...                         dtype="bf16", implementation="flash")
        >>> eager // 2**20, flash // 2**20
        (304, 64)
    """
    _check_positive(batch_size=batch_size, seq_len=seq_len, num_heads=num_heads, head_dim=head_dim)
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1); got {dropout}")
    kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    _check_positive(num_kv_heads=kv_heads)
    elem = parse_dtype(dtype).itemsize
    impl = parse_attention(implementation)
    tokens = batch_size * seq_len
    hidden = num_heads * head_dim
    square = batch_size * num_heads * seq_len * seq_len
    grouped = elem == FP32 and kv_heads < num_heads
    flash = keeps_linear_state(
        impl, device=device, training=training, dropout=dropout, fp32_grouped=grouped
    )
    if not training:
        if flash:
            return math.ceil(tokens * hidden * elem)
        return math.ceil(2 * square * elem)  # scores, then probabilities, both alive
    if flash:
        # q (a heads), k and v (kv heads: GQA kernels read them unexpanded), output, lse
        qkv_out = tokens * (2 * hidden + 2 * kv_heads * head_dim) * elem
        return math.ceil(qkv_out + batch_size * num_heads * seq_len * FP32)
    if impl is AttentionImpl.SDPA and elem < FP32:
        # SDPA's math fallback computes 16-bit attention in fp32: it converts Q, K and V
        # (aten/src/ATen/native/transformers/attention.cpp,
        # _scaled_dot_product_attention_math), so everything it keeps is fp32
        elem, fp32_softmax = FP32, False
    # Q, K^T and V contiguous for bmm (K and V already expanded to a heads), probabilities
    probabilities = FP32 + elem if fp32_softmax and elem < FP32 else elem
    saved = 3 * tokens * hidden * elem + square * probabilities
    if dropout > 0:
        # the mask, and the dropped probabilities the matmul saves (with an fp32 softmax
        # its 16-bit cast, already counted above)
        kept = 0 if fp32_softmax and elem < FP32 else elem
        saved += square * (dropout_mask_bytes(parse_dtype(dtype), device) + kept)
    return math.ceil(saved)


@checks.arguments(
    batch_size=checks.whole(at_least=1),
    seq_len=checks.whole(at_least=1),
    num_layers=checks.whole(at_least=1),
    num_kv_heads=checks.whole(at_least=1),
    head_dim=checks.whole(at_least=1),
    sliding_window=checks.whole(at_least=1),
)
def kv_cache_bytes(
    *,
    batch_size: int,
    seq_len: int,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: str | DType = "fp16",
    sliding_window: int | None = None,
) -> int:
    """Bytes of a key/value cache: 2 · layers · batch · seq · kv_heads · head_dim · bytes.

    ``num_kv_heads`` is ``num_key_value_heads`` for GQA/MQA models, not the number of
    attention heads. With a sliding window (Mistral-style) a layer keeps at most
    ``sliding_window`` positions.

    Example:
        >>> # Llama-2-7B, 4096 tokens, fp16: 2 GiB per sequence
        >>> kv_cache_bytes(batch_size=1, seq_len=4096, num_layers=32, num_kv_heads=32,
        ...                head_dim=128, dtype="fp16") / 2**30
        2.0
    """
    _check_positive(
        batch_size=batch_size,
        seq_len=seq_len,
        num_layers=num_layers,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
    )
    positions = seq_len if sliding_window is None else min(seq_len, sliding_window)
    elem = parse_dtype(dtype).itemsize
    return math.ceil(2 * num_layers * batch_size * positions * num_kv_heads * head_dim * elem)


@checks.arguments(
    config=checks.model_ref(), batch_size=checks.whole(at_least=1), seq_len=checks.whole(at_least=1)
)
def kv_cache_bytes_for(
    config: object,
    *,
    batch_size: int,
    seq_len: int,
    dtype: str | DType | None = None,
) -> int:
    """`kv_cache_bytes` for a transformers config (or a catalog name).

    Layers, KV heads (GQA/MQA), head size and sliding window from the config (`spec_from_config`);
    ``dtype`` defaults to the config's ``torch_dtype``/``dtype``, else fp16.

    Example:
        >>> from transformers import MistralConfig
        >>> config = MistralConfig(sliding_window=4096)  # Mistral-7B: 8 KV heads of 128
        >>> kv_cache_bytes_for(config, batch_size=1, seq_len=32768, dtype="bf16") / 2**20
        512.0
    """
    if isinstance(config, str):
        config = model_config(config)
    spec = spec_from_config(config)
    if dtype is None:
        stored = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        dtype = parse_dtype(stored) if stored is not None else DType.FP16
    return spec_kv_bytes(spec, batch_size=batch_size, seq_len=seq_len, dtype=parse_dtype(dtype))


def spec_kv_bytes(spec: TransformerSpec, *, batch_size: int, seq_len: int, dtype: DType) -> int:
    """`kv_cache_bytes` with the layers, KV heads, head size and window of ``spec``."""
    return kv_cache_bytes(
        batch_size=batch_size,
        seq_len=seq_len,
        num_layers=spec.num_layers,
        num_kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        dtype=dtype,
        sliding_window=spec.sliding_window,
    )
