"""`quantized_footprint`, `weights_footprint` and `footprint`: bytes predicted and measured."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from torchfit._bnb.selection import QuantSettings, QuantType, is_hf, select_layers, skip_list
from torchfit._core import checks
from torchfit._core.units import DType, parse_dtype
from torchfit.memory.catalog.build import instantiate, model_class_for
from torchfit.memory.catalog.hub import load_dtype
from torchfit.memory.catalog.resolve import resolve_config
from torchfit.quantize.build import float_dtype
from torchfit.quantize.loading import check_saved
from torchfit.quantize.result import Footprint
from torchfit.quantize.sizes import measure, predict, predict_unquantized

__all__ = ["footprint", "quantized_footprint", "weights_footprint"]


@checks.arguments(
    config_or_name=checks.model_ref(), skip_modules=checks.parsed(skip_list, kinds=(str,))
)
def quantized_footprint(
    config_or_name: Any,
    *,
    bits: int = 4,
    quant_type: QuantType | str = QuantType.NF4,
    double_quant: bool = True,
    skip_modules: Iterable[str] = (),
    dtype: str | torch.dtype | None = None,
    model_class: Any = None,
    device: str = "cuda",
    cpu_packed: bool = False,
) -> Footprint:
    """Predict the bytes a model will hold once quantized, before loading anything.

    The model is built on the meta device (no memory, instant even for 70B) to list its
    real layers, the skip list is resolved as `load_quantized` does, and every quantized
    layer is counted with bitsandbytes' layout rules; every other parameter and buffer at
    its own dtype. Needs transformers for configs and names, not bitsandbytes.

    Args:
        config_or_name: A transformers config, a local model folder, a name known to
            ``torchfit.memory.catalog``, a hub id, or an ``nn.Module`` (what
            `quantize_model` would make of it).
        bits: 4 or 8.
        quant_type: ``"nf4"`` or ``"fp4"`` (same bytes).
        double_quant: Predict double quantization (4-bit only).
        skip_modules: Extra module names kept unquantized, as in `load_quantized`.
        dtype: The dtype unquantized modules load in; default: the config's, else fp32.
        model_class: The class to build, as in `load_quantized`.
        device: ``"cuda"`` rounds every tensor up to the allocator's 512-byte blocks;
            ``"cpu"`` counts exact bytes.
        cpu_packed: Predict the layout after the first inference forward on an
            AVX512-BF16 CPU, where bitsandbytes keeps the 4-bit absmax as bf16.

    Returns:
        A `Footprint` with ``source="predicted"``.

    Raises:
        ValueError: bad ``bits``/``quant_type``/``device``, an unknown skip name, or
            nothing to quantize.

    Example:
        >>> from transformers import LlamaConfig
        >>> big = LlamaConfig(hidden_size=8192, intermediate_size=28672,
        ...                   num_hidden_layers=80, num_attention_heads=64,
        ...                   num_key_value_heads=8, vocab_size=32000, dtype="float16")
        >>> fp = quantized_footprint(big, bits=4)
        >>> print(f"{fp.total / 2**30:.1f} GiB, {fp.bits_per_parameter:.2f} bits/param")
        33.9 GiB, 4.22 bits/param
    """
    settings = QuantSettings(bits=bits, quant_type=quant_type, double_quant=double_quant)
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu'; got {device!r}")
    saved: list[str] | None = None
    if isinstance(config_or_name, nn.Module) and not is_hf(config_or_name):
        model = config_or_name
    elif isinstance(config_or_name, nn.Module):
        # quantize_model rebuilds a transformers model from its config (buffers included)
        # in the model's own dtype.
        source = config_or_name
        load = float_dtype(source) if dtype is None else load_dtype(None, {"dtype": dtype})
        model = instantiate(source.config, type(source), load)
    else:
        config = resolve_config(config_or_name, hub=True)
        cls = model_class_for(config, model_class)
        model = instantiate(config, cls, load_dtype(config, {"dtype": dtype}))
        saved = check_saved(str(config_or_name), config, settings, skip_list(skip_modules))
    selection = select_layers(model, settings, skip_modules, saved_skip=saved or ())
    return predict(model, selection, settings, device=device, cpu_packed=cpu_packed)


@checks.arguments(config_or_name=checks.model_ref())
def weights_footprint(
    config_or_name: Any,
    dtype: str | torch.dtype | DType,
    *,
    device: str = "cuda",
    double_quant: bool = True,
) -> Footprint:
    """Predicted weight bytes of a model stored in ``dtype``: the figure memory estimates use.

    ``"int8"`` is LLM.int8; ``"int4"``/``"nf4"`` NF4 and ``"fp4"`` FP4, both with
    ``double_quant`` (see `quantized_footprint`, which this calls with the default skip
    list). A float dtype gives every floating parameter and buffer that dtype, as
    ``from_pretrained(dtype=...)`` would (buffers transformers computes in fp32 stay fp32).

    Example:
        >>> from transformers import GPT2Config
        >>> config = GPT2Config(n_layer=2, n_embd=128, n_head=2, vocab_size=1000)
        >>> fp32 = weights_footprint(config, "fp32", device="cpu")
        >>> bf16 = weights_footprint(config, "bf16", device="cpu")
        >>> nf4 = weights_footprint(config, "int4", device="cpu")
        >>> fp32.total == 2 * bf16.total, nf4.method
        (True, 'nf4 + double quant')
    """
    kind = parse_dtype(dtype)
    if kind.is_quantized:
        bits = 8 if kind is DType.INT8 else 4
        quant_type = QuantType.FP4 if kind is DType.FP4 else QuantType.NF4
        return quantized_footprint(
            config_or_name,
            bits=bits,
            quant_type=quant_type,
            double_quant=double_quant,
            device=device,
        )
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu'; got {device!r}")
    if isinstance(config_or_name, nn.Module) and not is_hf(config_or_name):
        return predict_unquantized(config_or_name, device=device, cast=kind.torch_dtype)
    source = config_or_name.config if isinstance(config_or_name, nn.Module) else config_or_name
    config = resolve_config(source, hub=True)
    cls = type(config_or_name) if isinstance(config_or_name, nn.Module) else None
    meta = instantiate(config, model_class_for(config, cls), kind.torch_dtype)
    return predict_unquantized(meta, device=device)


@checks.arguments(model=checks.model())
def footprint(model: nn.Module) -> Footprint:
    """The bytes ``model`` really holds: weights, buffers and quantization state.

    Each distinct storage counts once (tied weights, ``SCB`` shared between a weight and
    its layer state); CUDA tensors are rounded up to the allocator's 512-byte blocks.
    Unlike transformers' ``get_memory_footprint()``, the 4-bit ``quant_state`` (absmax,
    nested absmax, offset, code books) and LLM.int8 row scales are counted. Not counted: the
    rest of a safetensors file that transformers keeps mapped on CPU because unquantized
    weights are views into it (clean file pages, not allocator memory).

    Example:
        >>> footprint(nn.Linear(64, 64)).total  # 64*64 + 64 fp32 values
        16640
    """
    return measure(model)
