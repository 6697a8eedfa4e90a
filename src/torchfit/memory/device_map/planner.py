"""The planner behind `torchfit.memory.device_map`: a model, its sizes and the cards.

`Planner` builds the meta-device proxy once, then places it with accelerate under a
``max_memory`` and judges any device map GPU by GPU (see the rule in
`torchfit.memory.device_map`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from torch import nn

from torchfit._bnb.selection import QuantSettings
from torchfit._core.imports import require
from torchfit._core.units import DType, format_bytes, parse_bytes, parse_dtype
from torchfit.memory.allocator import cublas_workspace_bytes, cuda_context_bytes, to_device
from torchfit.memory.catalog.build import instantiate, model_class_for
from torchfit.memory.catalog.resolve import resolve_config
from torchfit.memory.device_map.result import DeviceMap, DeviceShare
from torchfit.memory.device_map.sizes import (
    Runtime,
    allocatable,
    decoder_layers,
    device_of,
    proxy_model,
    runtime_figures,
    tensor_bytes,
)
from torchfit.memory.gpus import GPU
from torchfit.memory.gpus.budget import card_of
from torchfit.memory.result import MemoryEstimate

__all__ = ["FEATURE", "Planner", "gpu_index"]

FEATURE = "torchfit.memory.plan_device_map"
#: The CPU budget with ``offload=True``: unbounded, so nothing goes to disk.
_CPU_UNBOUNDED = 1 << 62
_FLOAT = {DType.FP32, DType.FP16, DType.BF16}


class Planner:
    """The model, its sizes and the cards: everything a placement is judged with."""

    def __init__(
        self,
        model: Any,
        gpus: Any,
        *,
        batch: int,
        seq: int | None,
        dtype: str | DType,
        bits: int | None,
        quant_type: str,
        double_quant: bool,
        kv_cache: bool,
        attn: str,
        reserve: int | str,
        context_bytes: int | str | None,
    ) -> None:
        """Resolve the model, its sizes and the cards once."""
        from torchfit.memory.analytic.arch import spec_from_config  # noqa: PLC0415

        require("transformers", feature=FEATURE)
        self.cards = _cards(gpus)
        if isinstance(batch, bool) or not isinstance(batch, int) or batch <= 0:
            raise ValueError(
                f"batch_size must be a positive integer (sequences per forward); got {batch!r}"
            )
        self.compute = _compute_dtype(dtype, self.cards)
        self.quant = None if bits is None else QuantSettings(bits, quant_type, double_quant)
        self.reserve = parse_bytes(reserve)
        # Layers on "cpu"/"disk" run on GPU 0 when offloading; without offload they are
        # overflow, which the plan refuses, not a load for GPU 0.
        self.offload_runs_on_zero = True
        if isinstance(model, nn.Module):
            config = getattr(model, "config", None)
            if not hasattr(config, "model_type"):
                raise TypeError(
                    f"plan_device_map needs a transformers model, config or name; got a "
                    f"{type(model).__name__} without a transformers config"
                )
            cls: Any = type(model)
            self.name = type(model).__name__
        else:
            config = resolve_config(model, hub=True)
            cls = model_class_for(config)
            named = isinstance(model, str | os.PathLike)
            self.name = os.fspath(model) if named else type(model).__name__
        spec = spec_from_config(config)
        self.seq = spec.max_positions if seq is None else seq
        self.batch, self.attn, self.kv_cache = batch, attn, kv_cache
        self.runtime: Runtime = runtime_figures(
            config,
            spec,
            batch=batch,
            seq=self.seq,
            compute=self.compute,
            attn=attn,
            kv_cache=kv_cache,
        )
        meta = instantiate(config, cls, self.compute.torch_dtype)
        self.no_split = tuple(sorted(getattr(meta, "_no_split_modules", None) or ()))
        sized = tensor_bytes(meta, self.quant)
        self.sizes = {n: b for n, (b, _) in sized.items()}
        layers = decoder_layers(meta, spec.num_layers)
        self.layer_keys = [next(n for n in self.sizes if n.startswith(f"{k}.")) for k in layers]
        self.layer_class = type(meta.get_submodule(layers[0])).__name__
        finder: Any = getattr(meta, "get_output_embeddings", None)
        head = finder() if callable(finder) else None
        self.head_key = next(reversed(self.sizes))  # the last tensor's module, by default
        for name, param in meta.named_parameters(remove_duplicate=False):
            if head is not None and any(param is p for p in head.parameters()):
                self.head_key = name
        # The proxy carries each decoder layer's KV cache on the layer's first tensor, so
        # accelerate places a layer's cache with its weights.
        for key in self.layer_keys:
            nbytes, tensor = sized[key]
            sized[key] = (nbytes + self.runtime.kv_per_layer, tensor)
        self.proxy = proxy_model(meta, sized)
        self.contexts = [
            parse_bytes(context_bytes) if context_bytes is not None else cuda_context_bytes(card)
            for card in self.cards
        ]
        self.workspaces = [cublas_workspace_bytes(card.compute_capability) for card in self.cards]
        self.allocatable = [
            allocatable(card.total - self.reserve - ctx)
            for card, ctx in zip(self.cards, self.contexts, strict=True)
        ]

    @property
    def method(self) -> str:
        """Run-time bytes of a card holding ``layers`` layers: KV cache, activations, workspace."""
        return self.compute.value if self.quant is None else self.quant.method

    def runtime_of(self, layers: int, *, head: bool, active: bool) -> tuple[int, int, int]:
        """KV cache, activations and overhead of a GPU running ``layers`` blocks."""
        rt = self.runtime
        kv = layers * rt.kv_per_layer
        act = max(rt.transient if layers else 0, rt.head if head else 0)
        return kv, act, rt.overhead if active else 0

    def shares(
        self, device_map: Mapping[str, int | str], max_memory: Mapping[int, int] | None
    ) -> tuple[list[DeviceShare], list[str]]:
        """Each GPU's share under ``device_map``, and the keys placed off the GPUs."""
        n = len(self.cards)
        weights = [0] * n
        for name, nbytes in self.sizes.items():
            where = gpu_index(device_of(name, device_map), n)
            if where is not None:
                weights[where] += nbytes
        runs: list[list[int]] = [[] for _ in range(n)]
        for k, key in enumerate(self.layer_keys):
            where = gpu_index(device_of(key, device_map), n)
            if where is not None:
                runs[where].append(k)
            elif self.offload_runs_on_zero:  # accelerate runs offloaded layers on GPU 0
                runs[0].append(k)
        head_at = gpu_index(device_of(self.head_key, device_map), n) or 0
        shares = []
        for i, card in enumerate(self.cards):
            active = bool(weights[i] or runs[i] or head_at == i)
            kv, act, overhead = self.runtime_of(len(runs[i]), head=head_at == i, active=active)
            share = MemoryEstimate(
                weights=weights[i], kv_cache=kv, activations=act, overhead=overhead
            )
            if active:
                share = to_device(share, gpu=card, context_bytes=self.contexts[i])
            shares.append(
                DeviceShare(
                    device=i,
                    card=card.name,
                    memory=card.total,
                    max_memory=None if max_memory is None else max_memory[i],
                    layers=tuple(runs[i]),
                    weights=weights[i],
                    kv_cache=share.kv_cache,
                    activations=share.activations,
                    overhead=share.overhead,
                    workspace=share.workspace,
                    reserved=share.reserved or 0,
                    context=share.context,
                    reserve=self.reserve,
                )
            )
        off = [key for key, value in device_map.items() if gpu_index(value, n) is None]
        return shares, off

    def limits(self, device_map: Mapping[str, int | str]) -> dict[int, int]:
        """The ``max_memory`` that leaves room for ``device_map``'s runtime on each GPU.

        accelerate's budget covers weights and the KV cache of the layers it places (the
        proxy carries both); the rest of the runtime is taken off here, with the KV cache
        of offloaded layers, which run on GPU 0.
        """
        shares, _ = self.shares(device_map, None)
        n = len(self.cards)
        placed = [0] * n
        for key in self.layer_keys:
            where = gpu_index(device_of(key, device_map), n)
            if where is not None:
                placed[where] += 1
        limits = {}
        for s in shares:
            elsewhere = s.kv_cache - placed[s.device] * self.runtime.kv_per_layer
            room = self.allocatable[s.device] - self.workspaces[s.device]
            limits[s.device] = max(0, room - s.activations - s.overhead - elsewhere)
        return limits

    def first_guess(self) -> dict[int, int]:
        """``max_memory`` if every GPU ran blocks and the output head."""
        rt = self.runtime
        return {
            i: max(0, room - self.workspaces[i] - max(rt.transient, rt.head) - rt.overhead)
            for i, room in enumerate(self.allocatable)
        }

    def place(
        self, max_memory: Mapping[int, int], *, offload: bool
    ) -> tuple[dict[str, int | str], list[str]]:
        """Place the proxy with accelerate under ``max_memory``; the map and its warnings."""
        require("accelerate", feature=FEATURE)
        from accelerate.utils import infer_auto_device_map  # noqa: PLC0415 - optional

        budget: dict[int | str, int] = {int(k): v for k, v in max_memory.items()}
        if offload:
            budget["cpu"] = _CPU_UNBOUNDED
        with _quiet("accelerate.utils.modeling"), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            placed = infer_auto_device_map(
                self.proxy, max_memory=budget, no_split_module_classes=list(self.no_split)
            )
        return dict(placed), [str(w.message) for w in caught]

    def result(
        self,
        device_map: dict[str, int | str],
        max_memory: dict[int, int],
        *,
        given: bool,
        rounds: int,
        notes: Sequence[str],
    ) -> DeviceMap:
        """The `DeviceMap` for ``device_map`` under ``max_memory``."""
        shares, off = self.shares(device_map, None if given else max_memory)
        rules = [
            (
                f"KV cache {format_bytes(self.runtime.kv_per_layer)} per layer on the GPU "
                f"that runs it; block transient {format_bytes(self.runtime.transient)}, "
                f"logits {format_bytes(self.runtime.head)} (torchfit.memory.estimate)"
            ),
            *self.runtime.notes,
            *notes,
        ]
        return DeviceMap(
            device_map=dict(device_map),
            max_memory={} if given else dict(max_memory),
            devices=tuple(shares),
            fits=not off and all(s.fits for s in shares),
            offloaded=tuple(off),
            model=self.name,
            method=self.method,
            dtype=self.compute.value,
            batch_size=self.batch,
            seq_len=self.seq,
            attn_implementation=self.attn,
            kv_cache=self.kv_cache,
            no_split_module_classes=self.no_split,
            rounds=rounds,
            notes=tuple(dict.fromkeys(rules)),
        )


@contextlib.contextmanager
def _quiet(logger_name: str) -> Iterator[None]:
    """Silence one logger (accelerate warns that planned GPU indices are absent here)."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def gpu_index(value: int | str, count: int) -> int | None:
    """The GPU index of a device-map value; ``None`` for ``"cpu"``/``"disk"``."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < count:
        return value
    text = str(value)
    if text.startswith("cuda:") and text[5:].isdigit() and int(text[5:]) < count:
        return int(text[5:])
    if text in {"cpu", "disk"}:
        return None
    raise ValueError(
        f"device_map value {value!r} is not one of the {count} planned GPUs (0..{count - 1}), "
        "'cpu' or 'disk'"
    )


def _cards(gpus: Any) -> list[GPU]:
    items = [gpus] if isinstance(gpus, str | GPU | int | float) else gpus
    if isinstance(items, bool) or not isinstance(items, Sequence):
        raise TypeError(
            f"gpus must be a list of card names, GPU records or byte budgets; got {gpus!r}"
        )
    if not items:
        raise ValueError(
            "gpus is empty; list the cards to place the model on, e.g. ['A100 40GB'] * 2"
        )
    cards = []
    for i, item in enumerate(items):
        try:
            cards.append(card_of(item))
        except (ValueError, TypeError) as e:
            raise type(e)(f"gpus[{i}]: {e}") from e
    return cards


def _compute_dtype(dtype: str | DType, cards: list[GPU]) -> DType:
    if str(dtype) == "auto":
        return DType.BF16 if all(card.bf16 for card in cards) else DType.FP16
    parsed = parse_dtype(dtype)
    if parsed not in _FLOAT:
        raise ValueError(
            f"dtype={dtype!r}: expected 'auto', 'fp32', 'fp16' or 'bf16' (the dtype of "
            "unquantized weights, compute and KV cache); for 4/8-bit weights pass bits=4 or "
            "bits=8 with dtype='bf16'"
        )
    return parsed
