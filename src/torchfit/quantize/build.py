"""Making quantized models: the ``BitsAndBytesConfig``, copies of built models, CPU fixes.

bitsandbytes and transformers are passed in or imported lazily; nothing here runs at
``import torchfit``.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from torchfit._bnb.layout import BLOCKSIZE
from torchfit._bnb.selection import LayerSelection, QuantSettings
from torchfit._core.imports import require

__all__ = ["bnb_config", "device_type_of", "float_dtype", "keep_cpu_layout", "quantize_copy"]

_FEATURE = "torchfit.quantize"


def bnb_config(
    settings: QuantSettings, selection: LayerSelection | None, compute: torch.dtype | None
) -> Any:
    """The ``BitsAndBytesConfig`` for ``settings``, with the merged skip list of ``selection``.

    Without a selection, transformers computes its default skip list itself (the same one).
    """
    transformers = require("transformers", feature=_FEATURE)
    # Passing a skip list *replaces* transformers' default one (transformers #45674);
    # `selection.skip` already holds the defaults merged with the user's names.
    skip = None if selection is None else list(selection.skip)
    if settings.bits == 8:
        return transformers.BitsAndBytesConfig(load_in_8bit=True, llm_int8_skip_modules=skip)
    return transformers.BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=str(settings.quant_type),
        bnb_4bit_use_double_quant=settings.double_quant,
        bnb_4bit_compute_dtype=compute,
        llm_int8_skip_modules=skip,
    )


def keep_cpu_layout(model: nn.Module) -> None:
    """Switch off bitsandbytes' AVX512-BF16 CPU repack for layers it cannot repack.

    On the first no-grad forward on such a CPU, ``Linear4bit`` repacks its weight with
    ``functional._convert_weight_packed_for_cpu``, which asserts ``out_features % 32 == 0``
    and reshapes the absmax to ``(out, in // blocksize)``: any other shape crashes
    ("N must be divisible by block_n", seen with bitsandbytes 0.50.2 on a GPT-2 with
    n_embd=100). Those layers keep the portable kernel.
    """
    for module in model.modules():
        layer: Any = module
        if not getattr(layer, "support_avx512bf16_for_cpu", False):
            continue
        blocksize = int(getattr(layer.weight, "blocksize", BLOCKSIZE))
        if int(layer.out_features) % 32 or int(layer.in_features) % blocksize:
            layer.support_avx512bf16_for_cpu = False


def float_dtype(model: nn.Module) -> torch.dtype:
    """The dtype of the first floating-point parameter (fp32 when there is none)."""
    for param in model.parameters():
        if param.is_floating_point():
            return param.dtype
    return torch.get_default_dtype()


def device_type_of(model: nn.Module) -> str:
    """The device type of the first parameter (``"cpu"`` when there is none)."""
    for param in model.parameters():
        return param.device.type
    return "cpu"


def quantize_copy(
    model: nn.Module,
    *,
    selection: LayerSelection,
    settings: QuantSettings,
    compute: torch.dtype | None,
    dtype: torch.dtype,
    device: torch.device,
    hf_model: bool,
) -> nn.Module:
    """A quantized copy of ``model``; ``model`` is read, never written."""
    if hf_model:
        return _from_state_dict(model, selection, settings, compute, dtype=dtype, device=device)
    bnb = require("bitsandbytes", feature=_FEATURE)
    return _replace_linears(bnb, model, selection, settings, compute=compute, device=device)


def _from_state_dict(
    model: nn.Module,
    selection: LayerSelection,
    settings: QuantSettings,
    compute: torch.dtype | None,
    *,
    dtype: torch.dtype,
    device: torch.device,
) -> nn.Module:
    # transformers' own path: from_pretrained(None, state_dict=...) quantizes while it
    # loads, so the result saves and reloads like any quantized checkpoint.
    quantized = {f"{name}.weight" for name in selection.quantize}
    clones: dict[int, torch.Tensor] = {}
    state: dict[str, torch.Tensor] = {}
    for key, tensor in model.state_dict().items():
        if key in quantized:
            state[key] = tensor  # read only: bitsandbytes quantizes into new memory
            continue
        # from_pretrained keeps CPU tensors as they are: clone them so that the copy never
        # shares memory with the caller's model; one clone per storage keeps ties tied.
        ptr = tensor.data_ptr()
        if ptr not in clones:
            clones[ptr] = tensor.detach().clone()
        state[key] = clones[ptr]
    source: Any = model
    config = copy.deepcopy(source.config)
    config.quantization_config = None
    out: nn.Module = type(source).from_pretrained(
        None,
        config=config,
        state_dict=state,
        quantization_config=bnb_config(settings, selection, compute),
        device_map={"": str(device)},
        dtype=dtype,
    )
    return out


def _set_submodule(root: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, leaf, module)


def _replace_linears(
    bnb: Any,
    model: nn.Module,
    selection: LayerSelection,
    settings: QuantSettings,
    *,
    compute: torch.dtype | None,
    device: torch.device,
) -> nn.Module:
    # Copy the model without the weights to quantize (the memo shares them), take those
    # layers out, and only then move the copy: moving a shared Parameter would move the
    # caller's too.
    memo: dict[int, Any] = {}
    for name in selection.quantize:
        weight = model.get_submodule(name).weight
        memo[id(weight)] = weight
    out = copy.deepcopy(model, memo)
    layers = {name: out.get_submodule(name) for name in selection.quantize}
    for name in layers:
        _set_submodule(out, name, nn.Identity())
    out.to(device)
    for name, old in layers.items():
        _set_submodule(out, name, _quantized_layer(bnb, old, settings, compute, device))
    return out


def _quantized_layer(
    bnb: Any,
    old: nn.Module,
    settings: QuantSettings,
    compute: torch.dtype | None,
    device: torch.device,
) -> nn.Module:
    layer: Any = old
    weight = layer.weight.detach()
    if type(old) is not nn.Linear:  # transformers' Conv1D stores (in, out)
        weight = weight.t().contiguous()
    out_f, in_f = weight.shape
    has_bias = layer.bias is not None
    new: Any
    if settings.bits == 4:
        new = bnb.nn.Linear4bit(
            in_f,
            out_f,
            has_bias,
            compute,
            compress_statistics=settings.double_quant,
            quant_type=str(settings.quant_type),
            device="meta",
        )
        packed = bnb.nn.Params4bit(
            weight,
            requires_grad=False,
            blocksize=BLOCKSIZE,
            compress_statistics=settings.double_quant,
            quant_type=str(settings.quant_type),
            module=new,
        )
        new.weight = packed.to(device)  # bitsandbytes quantizes on the move
    else:
        new = bnb.nn.Linear8bitLt(
            in_f, out_f, has_bias, has_fp16_weights=False, threshold=6.0, device="meta"
        )
        # Int8Params quantizes only when it leaves the CPU (nn/modules.py, `to`); that
        # is why transformers' Bnb8bitQuantize moves the weight to the CPU first, too.
        rows = bnb.nn.Int8Params(weight.cpu(), requires_grad=False, has_fp16_weights=False)
        new.weight = rows.to(device)
    if has_bias:
        bias = layer.bias.detach().to(device).clone()
        new.bias = nn.Parameter(bias, requires_grad=bool(layer.bias.requires_grad))
    result: nn.Module = new
    return result
