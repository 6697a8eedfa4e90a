"""The results of `torchfit.memory.device_map`: one `DeviceShare` per GPU, one `DeviceMap`."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from torchfit._core.units import format_bytes

__all__ = ["DeviceMap", "DeviceShare", "layer_ranges"]


def layer_ranges(layers: tuple[int, ...]) -> str:
    """Layer indices as runs: ``(0, 1, 2, 5)`` -> ``"0-2, 5"``; ``"-"`` when empty.

    Example:
        >>> layer_ranges((0, 1, 2, 5)), layer_ranges(())
        ('0-2, 5', '-')
    """
    if not layers:
        return "-"
    runs: list[list[int]] = []
    for k in layers:
        if runs and k == runs[-1][1] + 1:
            runs[-1][1] = k
        else:
            runs.append([k, k])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


@dataclasses.dataclass(frozen=True)
class DeviceShare:
    """What one GPU holds during inference under a device map, in bytes.

    Attributes:
        device: The GPU index the device map uses.
        card: The card's name.
        memory: The card's memory.
        max_memory: What accelerate was allowed to place on it (weights plus the KV
            cache of the layers placed); ``None`` when the map was given, not planned.
        layers: Indices of the decoder layers that run here (offloaded layers run on the
            first GPU, accelerate's execution device for them).
        weights: Parameters and buffers placed here, as loaded (quantized with scales).
        kv_cache: The KV cache of the layers that run here.
        activations: The largest transient of one block, or the logits on the GPU that
            runs the output head, whichever is larger.
        overhead: Input ids, attention mask and RoPE tables (on every GPU that runs a part).
        workspace: The cuBLAS workspace.
        reserved: The caching allocator's reserved bytes at the peak (`approximate_reserved`).
        context: The CUDA context (outside the allocator).
        reserve: Bytes the caller asked to keep free on each card.
    """

    device: int
    card: str
    memory: int
    max_memory: int | None
    layers: tuple[int, ...]
    weights: int
    kv_cache: int
    activations: int
    overhead: int
    workspace: int
    reserved: int
    context: int
    reserve: int = 0

    @property
    def runtime(self) -> int:
        """Non-weight allocated bytes: KV cache, activations, overhead, workspace."""
        return self.kv_cache + self.activations + self.overhead + self.workspace

    @property
    def allocated(self) -> int:
        """The predicted peak of allocated bytes: weights plus runtime."""
        return self.weights + self.runtime

    @property
    def device_total(self) -> int:
        """What nvidia-smi would show: reserved bytes plus the CUDA context."""
        return self.reserved + self.context

    @property
    def headroom(self) -> int:
        """``memory - reserve - device_total``; negative when the card is overfilled."""
        return self.memory - self.reserve - self.device_total

    @property
    def fits(self) -> bool:
        """The card holds its share with the requested reserve left free."""
        return self.headroom >= 0

    def to_dict(self) -> dict[str, Any]:
        """Every field and the derived totals, as plain Python values."""
        data = dataclasses.asdict(self)
        data["layers"] = list(self.layers)
        for name in ("runtime", "allocated", "device_total", "headroom", "fits"):
            data[name] = getattr(self, name)
        return data


_HEAD: tuple[str, ...] = ("GPU", "card", "layers", "weights", "KV cache", "activations")
_HEAD += ("other", "allocator", "context", "total", "memory", "headroom", "max_memory")


def _row(share: DeviceShare) -> tuple[str, ...]:
    slack = share.reserved - share.allocated
    return (
        str(share.device),
        share.card,
        layer_ranges(share.layers),
        format_bytes(share.weights),
        format_bytes(share.kv_cache),
        format_bytes(share.activations),
        format_bytes(share.overhead + share.workspace),
        format_bytes(slack),
        format_bytes(share.context),
        format_bytes(share.device_total),
        format_bytes(share.memory),
        format_bytes(share.headroom),
        "-" if share.max_memory is None else format_bytes(share.max_memory),
    )


@dataclasses.dataclass(frozen=True)
class DeviceMap:
    """A device map for inference over several GPUs, with what each GPU will hold.

    Attributes:
        device_map: ``{module name: GPU index}`` (``"cpu"`` for modules offloaded with
            ``offload=True``), as ``from_pretrained(device_map=...)`` and
            `torchfit.quantize.load_quantized` take it.
        max_memory: ``{GPU index: bytes}`` given to accelerate's ``infer_auto_device_map``
            for the weights *and the KV cache* of the layers it places (the proxy model
            carries both): each card's memory less the CUDA context, the allocator's
            slack, the reserve, the cuBLAS workspace, and the activations and inputs of
            what it runs. Not a budget for weights alone: pass `device_map` to
            ``from_pretrained``, not this. Empty when the map was given
            (`evaluate_device_map`).
        devices: One `DeviceShare` per GPU, in index order.
        fits: Every module is on a GPU and every GPU holds its share.
        offloaded: Map keys placed on ``"cpu"`` or ``"disk"``.
        model: What was planned (a name or a class name).
        method: How the weights are stored: ``"bf16"``, ``"nf4 + double quant"``, ``"int8"``.
        dtype: The dtype of unquantized weights, compute and KV cache.
        batch_size: Sequences per forward.
        seq_len: Tokens per sequence (prompt plus generated tokens: the KV cache's length).
        attn_implementation: Attention implementation.
        kv_cache: Whether a KV cache is kept.
        no_split_module_classes: Module classes accelerate keeps whole.
        rounds: Placements made until the map was stable (0 for a given map).
        notes: Rules applied, in words.
    """

    device_map: dict[str, int | str]
    max_memory: dict[int, int]
    devices: tuple[DeviceShare, ...]
    fits: bool
    offloaded: tuple[str, ...]
    model: str
    method: str
    dtype: str
    batch_size: int
    seq_len: int
    attn_implementation: str
    kv_cache: bool
    no_split_module_classes: tuple[str, ...]
    rounds: int
    notes: tuple[str, ...] = ()

    def load_kwargs(self) -> dict[str, Any]:
        """``device_map`` and ``dtype`` for ``from_pretrained`` or `load_quantized`.

        The weights were sized in `dtype`; loading them in another dtype changes the sizes.
        """
        return {"device_map": dict(self.device_map), "dtype": getattr(torch, _TORCH[self.dtype])}

    def to_dict(self) -> dict[str, Any]:
        """Plain Python values, for ``--json``."""
        data = dataclasses.asdict(self)
        data["device_map"] = dict(self.device_map)
        data["max_memory"] = {str(k): v for k, v in self.max_memory.items()}
        data["devices"] = [share.to_dict() for share in self.devices]
        for name in ("offloaded", "no_split_module_classes", "notes"):
            data[name] = list(getattr(self, name))
        return data

    def __str__(self) -> str:
        """The settings, a table of what each GPU holds, and the verdict."""
        what = f"{self.model}, inference, {self.method} weights, {self.dtype} compute"
        what += f", batch {self.batch_size}, seq {self.seq_len}, {self.attn_implementation}"
        what += ", KV cache" if self.kv_cache else ", no KV cache"
        body = [_row(share) for share in self.devices]
        widths = [max(len(line[i]) for line in (_HEAD, *body)) for i in range(len(_HEAD))]
        lines = [f"Device map: {what}"]
        for line in (_HEAD, *body):
            cells = [c.ljust(w) for c, w in zip(line[:3], widths[:3], strict=True)]
            cells += [c.rjust(w) for c, w in zip(line[3:], widths[3:], strict=True)]
            lines.append("  " + "  ".join(cells))
        used = sum(1 for share in self.devices if share.device_total)
        if self.fits:
            verdict = f"FITS on {used} of {len(self.devices)} GPUs"
        elif self.offloaded:
            verdict = f"OFFLOADED: {len(self.offloaded)} modules on the CPU"
        else:
            over = [str(s.device) for s in self.devices if not s.fits]
            verdict = f"DOES NOT FIT: GPU {', '.join(over)} overfilled"
        lines.append(f"  verdict: {verdict}")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


_TORCH = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "fp64": "float64"}
