"""A frozen copy of torchfit's distinct-storage counters before the storage ledger (71111e7).

``legacy_live_bytes`` (``torchfit/memory/measure.py``), ``legacy_count_parameters``
(``memory/catalog/count.py``), ``legacy_predict``, ``legacy_predict_unquantized`` and
``legacy_measure`` (``quantize/sizes.py``), ``legacy_tensor_bytes`` and
``legacy_proxy_model`` (``memory/device_map/sizes.py``) as they were at commit 71111e7,
before they were rebuilt on ``torchfit._core.ledger``; kept, unchanged but for their
names, only for the differential tests in ``tests/core``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from torchfit._bnb.layout import BLOCKSIZE, held_bytes, linear4bit_tensors, linear8bit_bytes
from torchfit._bnb.selection import LayerSelection, QuantSettings, out_in, select_layers
from torchfit._core.tensors import reachable_tensors
from torchfit.quantize.result import Footprint, FootprintRow, summarize

# CUDA's caching allocator rounds every block up to 512 bytes (kMinBlockSize in
# c10/cuda/CUDACachingAllocator.cpp); tracked CUDA tensors are counted as it would.
_CUDA_BLOCK = 512


def legacy_live_bytes(*objects: object, device: str | None = None) -> int:
    storages: dict[tuple[str, int], int] = {}
    for tensor in reachable_tensors(objects):
        if tensor.device.type == "meta" or (device is not None and tensor.device.type != device):
            continue
        storage = tensor.untyped_storage()
        size = storage.nbytes()
        if tensor.device.type == "cuda":
            size = -(-size // _CUDA_BLOCK) * _CUDA_BLOCK
        storages[(str(tensor.device), storage.data_ptr())] = size
    return sum(storages.values())


def legacy_count_parameters(model: nn.Module, *, trainable_only: bool = False) -> int:
    if not isinstance(model, nn.Module):
        raise TypeError(f"count_parameters needs an nn.Module; got {type(model).__name__}")
    seen: set[tuple[Any, ...]] = set()
    total = 0
    for param in model.parameters():  # already yields each Parameter object once
        if trainable_only and not param.requires_grad:
            continue
        key = _storage_key(param)
        if key is not None:
            if key in seen:
                continue
            seen.add(key)
        total += param.numel()
    return total


def _storage_key(tensor: torch.Tensor) -> tuple[Any, ...] | None:
    if tensor.device.type == "meta" or tensor.numel() == 0:
        return None
    try:
        pointer = tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # fake or otherwise storage-less tensors
        return None
    if pointer == 0:
        return None
    return (tensor.device, pointer, tensor.storage_offset(), tuple(tensor.shape), tensor.stride())


def _own_tensors(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    yield from module.named_parameters(recurse=False)
    yield from module.named_buffers(recurse=False)


def _key(tensor: torch.Tensor) -> tuple[str, int]:
    if tensor.device.type == "meta":
        return ("meta", id(tensor))
    return (str(tensor.device), tensor.untyped_storage().data_ptr())


def _nbytes(tensor: torch.Tensor) -> int:
    if tensor.device.type == "meta":
        return tensor.numel() * tensor.element_size()
    return held_bytes(tensor.untyped_storage().nbytes(), tensor.device.type)


def legacy_predict(
    model: nn.Module,
    selection: LayerSelection,
    settings: QuantSettings,
    *,
    device: str,
    cpu_packed: bool = False,
) -> Footprint:
    chosen = set(selection.quantize)
    seen: set[tuple[str, int]] = set()
    rows: list[FootprintRow] = []
    packed_layers = 0
    for name, module in model.named_modules():
        quantize = name in chosen
        kind = settings.quantized_kind if quantize else type(module).__name__
        params = qparams = qbytes = scales = other = 0
        for attr, tensor in _own_tensors(module):
            if _key(tensor) in seen:
                continue
            seen.add(_key(tensor))
            if isinstance(tensor, nn.Parameter):
                params += tensor.numel()
            if not (quantize and attr == "weight"):
                other += held_bytes(tensor.numel() * tensor.element_size(), device)
                continue
            qparams += tensor.numel()
            out_f, in_f = out_in(module)
            if settings.bits == 8:
                weight, row_scales = linear8bit_bytes(out_f, in_f)
                parts: tuple[int, ...] = (row_scales,)
            else:
                # The CPU repack needs whole 32-row groups and whole blocks per row; torchfit
                # switches it off for other layers (see _quantize_build.keep_cpu_layout).
                packs = cpu_packed and out_f % 32 == 0 and in_f % BLOCKSIZE == 0
                packed_layers += packs
                weight, parts = linear4bit_tensors(
                    tensor.numel(), double_quant=settings.double_quant, cpu_packed=packs
                )
            qbytes += held_bytes(weight, device)
            scales += sum(held_bytes(p, device) for p in parts)
        rows.append(FootprintRow(kind, 1, params, qbytes, scales, other, qparams))
    notes = [f"left unquantized by the skip list: {', '.join(selection.skip) or 'nothing'}"]
    if device == "cuda":
        notes.append("every tensor rounded up to the CUDA allocator's 512-byte blocks")
    if cpu_packed and settings.bits == 4:
        notes.append(f"{packed_layers} layers in bitsandbytes' AVX512-BF16 CPU layout")
    return summarize(
        rows, method=settings.method, source="predicted", device=device, notes=tuple(notes)
    )


def legacy_predict_unquantized(
    model: nn.Module, *, device: str, cast: torch.dtype | None = None
) -> Footprint:
    seen: set[tuple[str, int]] = set()
    rows: list[FootprintRow] = []
    for _, module in model.named_modules():
        params = other = 0
        for _, tensor in _own_tensors(module):
            if _key(tensor) in seen:
                continue
            seen.add(_key(tensor))
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


def legacy_measure(model: nn.Module) -> Footprint:
    seen: set[tuple[str, int]] = set()
    rows: list[FootprintRow] = []
    methods: set[str] = set()
    devices = {t.device.type for _, t in model.named_parameters()} | {"cpu"}
    device = "cuda" if "cuda" in devices else "cpu"

    def take(tensor: torch.Tensor) -> int:
        if _key(tensor) in seen:
            return 0
        seen.add(_key(tensor))
        return _nbytes(tensor)

    for _, module in model.named_modules():
        params = qparams = qbytes = other = 0
        extra = _layer_state_tensors(module)
        for _, tensor in _own_tensors(module):
            if _key(tensor) in seen:
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


def legacy_tensor_bytes(
    model: nn.Module, settings: QuantSettings | None
) -> dict[str, tuple[int, torch.Tensor]]:
    chosen = set(select_layers(model, settings, ()).quantize) if settings is not None else set()
    seen: set[int] = set()
    sizes: dict[str, tuple[int, torch.Tensor]] = {}
    for prefix, module in model.named_modules():
        for attr, tensor in _own_tensors(module):
            if id(tensor) in seen:
                continue
            seen.add(id(tensor))
            name = f"{prefix}.{attr}" if prefix else attr
            if settings is not None and prefix in chosen and attr == "weight":
                if settings.bits == 8:
                    codes, scales = linear8bit_bytes(*out_in(module))
                    nbytes = held_bytes(codes, "cuda") + held_bytes(scales, "cuda")
                else:  # each quant_state tensor is an allocation of its own
                    codes, parts = linear4bit_tensors(
                        tensor.numel(), double_quant=settings.double_quant
                    )
                    nbytes = held_bytes(codes, "cuda") + sum(held_bytes(p, "cuda") for p in parts)
            else:
                nbytes = held_bytes(tensor.numel() * tensor.element_size(), "cuda")
            sizes[name] = (nbytes, tensor)
    return sizes


def legacy_proxy_model(
    model: nn.Module, sizes: Mapping[str, tuple[int, torch.Tensor]]
) -> nn.Module:
    proxies: dict[int, torch.Tensor] = {}
    for nbytes, tensor in sizes.values():
        empty = torch.empty(nbytes, dtype=torch.uint8, device="meta")
        is_param = isinstance(tensor, nn.Parameter)
        proxies[id(tensor)] = nn.Parameter(empty, requires_grad=False) if is_param else empty
    for module in model.modules():
        params: dict[str, Any] = module._parameters
        buffers: dict[str, Any] = module._buffers
        for table in (params, buffers):
            for attr, held in list(table.items()):
                if held is not None and id(held) in proxies:
                    table[attr] = proxies[id(held)]
    return model
