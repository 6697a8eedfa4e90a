"""`load_quantized` and `quantize_model`: 4- and 8-bit weights with safe defaults."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torchfit._bnb.selection import QuantSettings, QuantType, is_hf, select_layers, skip_list
from torchfit._core import checks
from torchfit._core.hardware import parse_device
from torchfit._core.imports import require
from torchfit.memory.catalog.build import instantiate, model_class_for
from torchfit.memory.catalog.hub import hub_error, load_config, load_dtype
from torchfit.quantize import hf
from torchfit.quantize.build import (
    bnb_config,
    device_type_of,
    float_dtype,
    keep_cpu_layout,
    quantize_copy,
)

__all__ = ["check_saved", "load_quantized", "quantize_model"]

_FEATURE = "torchfit.quantize"


def _require_stack() -> None:
    for package in ("bitsandbytes", "transformers", "accelerate"):
        require(package, feature=_FEATURE)


@checks.arguments(
    path_or_model_or_id=checks.model_ref(),
    compute_dtype=checks.parsed(hf.parse_compute_dtype),
    skip_modules=checks.parsed(skip_list, kinds=(str,)),
)
def load_quantized(
    path_or_model_or_id: str | os.PathLike[str] | nn.Module,
    *,
    bits: int = 4,
    quant_type: QuantType | str = QuantType.NF4,
    double_quant: bool = True,
    compute_dtype: str | torch.dtype = "auto",
    skip_modules: Iterable[str] = (),
    device_map: Any = None,
    model_class: Any = None,
    **from_pretrained_kwargs: Any,
) -> Any:
    """Load a transformers model with 4-bit (NF4/FP4) or 8-bit (LLM.int8) weights.

    Args:
        path_or_model_or_id: A folder written by ``save_pretrained`` (quantized or not), a
            hub id, or a model already built (then see `quantize_model`).
        bits: 4 (NF4/FP4, blocks of 64) or 8 (LLM.int8).
        quant_type: ``"nf4"`` (default; bitsandbytes' own default is fp4) or ``"fp4"``.
        double_quant: Quantize the absmax values again (about 0.37 bits less per weight).
        compute_dtype: The matmul dtype of 4-bit layers. ``"auto"``: the model's dtype if
            it is fp16/bf16; for an fp32 model bf16 on GPUs with native bf16, else fp16 on
            CUDA, and fp32 on CPU. Must stay ``"auto"`` for 8-bit.
        skip_modules: Module names to keep unquantized, *added to* the default list
            (output head, tied embeddings, modules transformers keeps in fp32). Each name
            must match a module of the model (from the start of its path or at its end).
        device_map: Passed to ``from_pretrained``; ``None`` lets transformers choose
            (the current GPU, else the CPU).
        model_class: The class to load with; default: the config's architecture, else
            the Auto class its model type implies (``AutoModelForCausalLM`` for a
            decoder), as `torchfit.memory.catalog.build.model_class_for` decides.
        **from_pretrained_kwargs: Anything else ``from_pretrained`` takes (``dtype``,
            ``revision``, ``local_files_only``, ...), except ``quantization_config``.

    Returns:
        The quantized model (eval mode, as ``from_pretrained`` returns it).

    Raises:
        ImportError: bitsandbytes, transformers or accelerate is missing.
        ValueError: ``bits`` is not 4 or 8, an unknown ``quant_type``, a skip name that
            matches nothing, or a model with nothing to quantize.
        TypeError: ``quantization_config`` was passed too.
        OSError: a hub id could not be loaded (no network, unknown id).

    Example:
        >>> import tempfile
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        ...                      num_attention_heads=2, vocab_size=128)
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     LlamaForCausalLM(config).save_pretrained(folder)
        ...     model = load_quantized(folder, bits=4)
        >>> type(model.model.layers[0].mlp.up_proj).__name__, type(model.lm_head).__name__
        ('Linear4bit', 'Linear')
        >>> from torchfit.quantize import footprint, quantized_footprint
        >>> footprint(model).total == quantized_footprint(config, device="cpu").total
        True
    """
    settings = QuantSettings(bits=bits, quant_type=quant_type, double_quant=double_quant)
    _require_stack()
    if isinstance(path_or_model_or_id, nn.Module):
        if from_pretrained_kwargs:
            raise TypeError(
                f"from_pretrained options {sorted(from_pretrained_kwargs)} do not apply to a "
                "model already built; call quantize_model(model, ...)"
            )
        device = None if device_map is None else hf.target_device(device_map)
        return quantize_model(
            path_or_model_or_id,
            bits=bits,
            quant_type=quant_type,
            double_quant=double_quant,
            compute_dtype=compute_dtype,
            skip_modules=skip_modules,
            device=device,
        )
    if "quantization_config" in from_pretrained_kwargs:
        raise TypeError(
            "load_quantized builds the quantization_config itself; pass bits=, quant_type=, "
            "double_quant=, compute_dtype= and skip_modules= instead"
        )
    name = os.fspath(path_or_model_or_id)
    user_skips = skip_list(skip_modules)
    config = load_config(name, from_pretrained_kwargs)
    cls = model_class_for(config, model_class)
    dtype = load_dtype(config, from_pretrained_kwargs)
    saved = check_saved(name, config, settings, user_skips)
    compute = hf.resolve_compute_dtype(
        compute_dtype, bits=bits, model_dtype=dtype, device=hf.target_device(device_map)
    )
    kwargs = {**from_pretrained_kwargs, "config": config, "device_map": device_map}
    if saved is None:
        # Only a user skip list needs the model's module names before loading (to check and
        # merge it); without one, transformers' own default list is the same as ours.
        selection = (
            select_layers(instantiate(config, cls, dtype), settings, user_skips)
            if user_skips
            else None
        )
        kwargs["quantization_config"] = bnb_config(settings, selection, compute)
    try:
        model = cls.from_pretrained(name, **kwargs)
    except OSError as e:
        if Path(name).is_dir():
            raise
        raise hub_error(name, e) from e
    _finish(model, name, settings, compute=compute if compute_dtype != "auto" else None)
    return model


def _finish(
    model: nn.Module, name: str, settings: QuantSettings, *, compute: torch.dtype | None
) -> None:
    """Check that something was quantized, apply an explicit compute dtype, fix CPU layouts."""
    if not any(type(m).__module__.startswith("bitsandbytes") for m in model.modules()):
        select_layers(model, settings, ())  # raises: nothing to quantize, and why
        raise ValueError(f"transformers quantized no layer of {name!r}")  # pragma: no cover
    if compute is not None:
        for module in model.modules():  # a saved checkpoint fixed it; the layer reads this
            layer: Any = module
            if hasattr(layer, "compute_type_is_set"):
                layer.compute_dtype = compute
                layer.compute_type_is_set = True
    keep_cpu_layout(model)


def check_saved(
    name: str, config: Any, settings: QuantSettings, skip_modules: list[str]
) -> list[str] | None:
    """The skip list of a checkpoint saved quantized, after checking it is what was asked."""
    saved = hf.saved_quantization(config)
    if saved is None:
        return None
    bits, quant_type, double_quant, skip = saved
    stored = QuantSettings(bits=bits, quant_type=quant_type, double_quant=double_quant)
    if stored.method != settings.method:
        raise ValueError(
            f"{name!r} was saved with {stored.method} weights, but {settings.method} was asked "
            f"for; pass bits={bits}"
            + (f", quant_type={quant_type!r}, double_quant={double_quant}" if bits == 4 else "")
            + ", or quantize the unquantized checkpoint instead"
        )
    if skip_modules:
        raise ValueError(
            f"{name!r} is already quantized: its skip list {skip} was fixed when it was saved; "
            "drop skip_modules, or quantize the unquantized checkpoint instead"
        )
    return skip


@checks.arguments(
    model=checks.model(),
    compute_dtype=checks.parsed(hf.parse_compute_dtype),
    device=checks.parsed(parse_device, kinds=(str,)),
    skip_modules=checks.parsed(skip_list, kinds=(str,)),
)
def quantize_model(
    model: nn.Module,
    *,
    bits: int = 4,
    quant_type: QuantType | str = QuantType.NF4,
    double_quant: bool = True,
    compute_dtype: str | torch.dtype = "auto",
    skip_modules: Iterable[str] = (),
    device: str | torch.device | None = None,
) -> nn.Module:
    """A quantized copy of a model already built; ``model`` itself is left as it was.

    A transformers model goes through ``from_pretrained`` with its own state dict, so the
    result saves and reloads like one loaded with `load_quantized`. Any other module gets
    its ``nn.Linear`` layers replaced by bitsandbytes layers in a copy (default skip list:
    the module owning the last parameter and layers whose weight is shared). Unquantized
    tensors are copied, never shared with ``model``.

    Args:
        model: The model to quantize (not modified).
        bits: 4 or 8; see `load_quantized` for this and the other options.
        quant_type: ``"nf4"`` or ``"fp4"``.
        double_quant: Quantize the absmax values again.
        compute_dtype: ``"auto"`` or a 16/32-bit float type, as in `load_quantized`.
        skip_modules: Extra module names to keep unquantized (checked against the model).
        device: Where the quantized copy lives; default: where ``model`` is.

    Returns:
        The quantized copy.

    Raises:
        ImportError: bitsandbytes, transformers or accelerate is missing.
        ValueError: bad ``bits``/``quant_type``, an unknown skip name, nothing to quantize.

    Example:
        >>> net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
        >>> q = quantize_model(net, bits=8, device="cpu")
        >>> [type(m).__name__ for m in q]
        ['Linear8bitLt', 'ReLU', 'Linear']
    """
    settings = QuantSettings(bits=bits, quant_type=quant_type, double_quant=double_quant)
    _require_stack()
    selection = select_layers(model, settings, skip_modules)
    target = torch.device(device if device is not None else device_type_of(model))
    dtype = float_dtype(model)
    compute = hf.resolve_compute_dtype(
        compute_dtype, bits=bits, model_dtype=dtype, device=target.type
    )
    out = quantize_copy(
        model,
        selection=selection,
        settings=settings,
        compute=compute,
        dtype=dtype,
        device=target,
        hf_model=is_hf(model),
    )
    keep_cpu_layout(out)
    return out
