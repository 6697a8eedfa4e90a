"""How many bytes a model holds: predicted from shapes, or measured from its tensors.

`predict` turns a `LayerSelection` into a `Footprint` from shapes alone (a meta-device model is
enough); `measure` reads one from the tensors a model really holds, the bitsandbytes
``quant_state`` and LLM.int8 row scales included.

Both count each storage once (`torchfit._core.ledger.storage_key`) and size a quantized
weight with the rule the device maps use too (`torchfit._bnb.layout.quantized_linear_bytes`).
They walk the model module by module (`torchfit._core.tensors.own_tensors`) rather than
with `reachable_tensors`, because every row of a `Footprint` is one module's and a
bitsandbytes ``quant_state`` is no module, container or tensor that walk follows.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from torchfit._bnb.layout import BLOCKSIZE, held_bytes, quantized_linear_bytes
from torchfit._bnb.selection import LayerSelection, QuantSettings, out_in
from torchfit._core.ledger import storage_key
from torchfit._core.tensors import own_tensors
from torchfit.quantize.result import Footprint, FootprintRow, summarize

__all__ = ["measure", "predict", "predict_unquantized"]


def _first_time(tensor: torch.Tensor, seen: set[int]) -> bool:
    """Whether ``tensor``'s storage is met for the first time (then remembered in ``seen``).

    A tensor without a storage cannot be matched: it is always new.
    """
    key = storage_key(tensor)
    if key in seen:
        return False
    if key is not None:
        seen.add(key)
    return True


def _nbytes(tensor: torch.Tensor) -> int:
    if tensor.device.type == "meta":
        return tensor.numel() * tensor.element_size()
    return held_bytes(tensor.untyped_storage().nbytes(), tensor.device.type)


def predict(
    model: nn.Module,
    selection: LayerSelection,
    settings: QuantSettings,
    *,
    device: str,
    cpu_packed: bool = False,
) -> Footprint:
    """The `Footprint` ``model`` will have once the layers in ``selection`` are quantized."""
    chosen = set(selection.quantize)
    seen: set[int] = set()
    rows: list[FootprintRow] = []
    packed_layers = 0
    for name, module in model.named_modules():
        quantize = name in chosen
        kind = settings.quantized_kind if quantize else type(module).__name__
        params = qparams = qbytes = scales = other = 0
        for attr, tensor in own_tensors(module):
            if not _first_time(tensor, seen):
                continue
            if isinstance(tensor, nn.Parameter):
                params += tensor.numel()
            if not (quantize and attr == "weight"):
                other += held_bytes(tensor.numel() * tensor.element_size(), device)
                continue
            qparams += tensor.numel()
            out_f, in_f = out_in(module)
            # The CPU repack needs whole 32-row groups and whole blocks per row; torchfit
            # switches it off for other layers (see torchfit.quantize.build.keep_cpu_layout).
            packs = settings.bits == 4 and cpu_packed and out_f % 32 == 0 and in_f % BLOCKSIZE == 0
            packed_layers += packs
            weight, held_scales = quantized_linear_bytes(
                out_f,
                in_f,
                bits=settings.bits,
                double_quant=settings.double_quant,
                device=device,
                cpu_packed=packs,
            )
            qbytes += weight
            scales += held_scales
        rows.append(FootprintRow(kind, 1, params, qbytes, scales, other, qparams))
    notes = [f"left unquantized by the skip list: {', '.join(selection.skip) or 'nothing'}"]
    if device == "cuda":
        notes.append("every tensor rounded up to the CUDA allocator's 512-byte blocks")
    if cpu_packed and settings.bits == 4:
        notes.append(f"{packed_layers} layers in bitsandbytes' AVX512-BF16 CPU layout")
    return summarize(
        rows, method=settings.method, source="predicted", device=device, notes=tuple(notes)
    )


def predict_unquantized(
    model: nn.Module, *, device: str, cast: torch.dtype | None = None
) -> Footprint:
    """The `Footprint` of ``model`` with nothing quantized, floating tensors in ``cast``."""
    seen: set[int] = set()
    rows: list[FootprintRow] = []
    for _, module in model.named_modules():
        params = other = 0
        for _, tensor in own_tensors(module):
            if not _first_time(tensor, seen):
                continue
            params += tensor.numel() if isinstance(tensor, nn.Parameter) else 0
            size = tensor.element_size()
            if cast is not None and tensor.is_floating_point():
                size = torch.empty((), dtype=cast, device="meta").element_size()
            other += held_bytes(tensor.numel() * size, device)
        rows.append(FootprintRow(type(module).__name__, 1, params, 0, 0, other, 0))
    method = "none" if cast is None else str(cast).removeprefix("torch.")
    return summarize(rows, method=method, source="predicted", device=device)


def _state_tensors(state: object, depth: int = 0) -> Iterator[torch.Tensor]:
    # A bitsandbytes QuantState (absmax, code, offset, state2) or MatmulLtState (CB, SCB).
    for value in vars(state).values():
        if isinstance(value, torch.Tensor):
            yield value
        elif type(value).__name__ == "QuantState" and depth < 2:
            yield from _state_tensors(value, depth + 1)


def _method_of(tensor: torch.Tensor) -> str | None:
    state = getattr(tensor, "quant_state", None)
    if state is not None:
        nested = bool(getattr(state, "nested", False))
        return f"{state.quant_type}{' + double quant' if nested else ''}"
    if type(tensor).__name__ == "Int8Params" and tensor.dtype == torch.int8:
        return "int8"
    return None


def _scale_tensors(weight: torch.Tensor) -> list[torch.Tensor]:
    state = getattr(weight, "quant_state", None)
    found = [] if state is None else list(_state_tensors(state))
    scb = getattr(weight, "SCB", None)  # LLM.int8 row scales, before the first forward
    return [*found, scb] if isinstance(scb, torch.Tensor) else found


def _layer_state_tensors(module: nn.Module) -> list[torch.Tensor]:
    # Linear4bit.quant_state and Linear8bitLt.state (where SCB moves on the first forward).
    if not type(module).__module__.startswith("bitsandbytes"):
        return []
    found: list[torch.Tensor] = []
    for attr in ("quant_state", "state"):
        holder: Any = getattr(module, attr, None)
        if holder is not None and hasattr(holder, "__dict__"):
            found += _state_tensors(holder)
    return found


def measure(model: nn.Module) -> Footprint:
    """The `Footprint` of the tensors ``model`` holds now, each distinct storage once."""
    seen: set[int] = set()
    rows: list[FootprintRow] = []
    methods: set[str] = set()
    devices = {t.device.type for _, t in model.named_parameters()} | {"cpu"}
    device = "cuda" if "cuda" in devices else "cpu"

    def take(tensor: torch.Tensor) -> int:
        return _nbytes(tensor) if _first_time(tensor, seen) else 0

    for _, module in model.named_modules():
        params = qparams = qbytes = other = 0
        extra = _layer_state_tensors(module)
        for _, tensor in own_tensors(module):
            if storage_key(tensor) in seen:
                continue
            method = _method_of(tensor)
            if method is None:
                params += tensor.numel() if isinstance(tensor, nn.Parameter) else 0
                other += take(tensor)
                continue
            methods.add(method)
            state = getattr(tensor, "quant_state", None)
            count = math.prod(state.shape) if state is not None else tensor.numel()
            params += count
            qparams += count
            qbytes += take(tensor)
            extra = _scale_tensors(tensor) + extra
        scales = sum(take(t) for t in extra)
        rows.append(FootprintRow(type(module).__name__, 1, params, qbytes, scales, other, qparams))
    method = " / ".join(sorted(methods)) or "none"
    return summarize(rows, method=method, source="measured", device=device)
