"""The figures behind `torchfit.memory.device_map`: bytes per tensor, per layer, per card.

Three pieces, each from torchfit's own models:

* the bytes of every parameter and buffer as it will be loaded (a float dtype, or
  bitsandbytes 4/8-bit with its scales, the rules of `torchfit.quantize.quantized_footprint`),
  put on a *proxy* model whose tensors are uint8 meta tensors of exactly those bytes, so
  that accelerate's ``infer_auto_device_map`` (which sizes tensors as numel x itemsize)
  places what will really be held;
* the inference runtime of `torchfit.memory.estimate` (``mode="inference"``): the KV cache
  per decoder layer, the largest transient of one block, the logits, the step overhead;
* the allocator: the largest allocated total a card can hold once the CUDA context and the
  caching allocator's slack (`approximate_reserved`) are taken off.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from torchfit._bnb.layout import held_bytes, quantized_linear_bytes
from torchfit._bnb.selection import QuantSettings, out_in, select_layers
from torchfit._core.bisection import last_true
from torchfit._core.tensors import own_tensors
from torchfit._core.units import DType
from torchfit.memory.allocator import approximate_reserved
from torchfit.memory.analytic.arch import TransformerSpec
from torchfit.memory.analytic.blocks import inference_transient
from torchfit.memory.analytic.formulas import parse_attention
from torchfit.memory.analytic.settings import BlockSettings
from torchfit.memory.estimator import estimate

__all__ = [
    "Runtime",
    "allocatable",
    "decoder_layers",
    "device_of",
    "proxy_model",
    "runtime_figures",
    "tensor_bytes",
]

#: A device of a device map: a GPU index, "cpu" or "disk" (accelerate's values).
Device = int | str


def tensor_bytes(
    model: nn.Module, settings: QuantSettings | None
) -> dict[str, tuple[int, torch.Tensor]]:
    """``{full tensor name: (bytes on a CUDA device, tensor)}``, each shared tensor once.

    With ``settings`` the layers `select_layers` picks (transformers' default skip list) hold
    a bitsandbytes weight: packed codes plus scales (`quantized_linear_bytes`, the rule
    `torchfit.quantize.quantized_footprint(device="cuda")` counts with), each tensor
    rounded to the allocator's 512-byte blocks. Every other tensor holds
    ``numel x itemsize`` of the dtype the meta model was built in, rounded the same way.

    A tensor object registered under several names (a tied weight) is listed once, under
    the first. Tensors are told apart as objects, not by storage
    (`torchfit._core.ledger.storage_key`): accelerate places named tensors and ties
    parameters by object (``find_tied_parameters``), and `proxy_model` swaps objects.
    """
    chosen = set(select_layers(model, settings, ()).quantize) if settings is not None else set()
    seen: set[int] = set()
    sizes: dict[str, tuple[int, torch.Tensor]] = {}
    for prefix, module in model.named_modules():
        for attr, tensor in own_tensors(module):
            if id(tensor) in seen:
                continue
            seen.add(id(tensor))
            name = f"{prefix}.{attr}" if prefix else attr
            if settings is not None and prefix in chosen and attr == "weight":
                codes, scales = quantized_linear_bytes(
                    *out_in(module),
                    bits=settings.bits,
                    double_quant=settings.double_quant,
                    device="cuda",
                )
                nbytes = codes + scales
            else:
                nbytes = held_bytes(tensor.numel() * tensor.element_size(), "cuda")
            sizes[name] = (nbytes, tensor)
    return sizes


def proxy_model(model: nn.Module, sizes: Mapping[str, tuple[int, torch.Tensor]]) -> nn.Module:
    """Swap, in place, every tensor of a meta ``model`` for a uint8 meta tensor of its bytes.

    Tied parameters stay tied (one proxy per original tensor), so accelerate still keeps
    them on one device; module names and buffer persistence are unchanged.
    """
    proxies: dict[int, torch.Tensor] = {}
    for nbytes, tensor in sizes.values():
        empty = torch.empty(nbytes, dtype=torch.uint8, device="meta")
        is_param = isinstance(tensor, nn.Parameter)
        proxies[id(tensor)] = nn.Parameter(empty, requires_grad=False) if is_param else empty
    for module in model.modules():
        params: dict[str, Any] = module._parameters  # noqa: SLF001 - swapping in place
        buffers: dict[str, Any] = module._buffers  # noqa: SLF001
        for table in (params, buffers):
            for attr, held in list(table.items()):
                if held is not None and id(held) in proxies:
                    table[attr] = proxies[id(held)]
    return model


def decoder_layers(model: nn.Module, num_layers: int) -> list[str]:
    """Names of the decoder blocks: the first ``nn.ModuleList`` of ``num_layers`` alike modules."""
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) == num_layers:
            kinds = {type(child) for child in module}
            if len(kinds) == 1:
                return [f"{name}.{k}" for k in range(num_layers)]
    raise ValueError(
        f"{type(model).__name__} has no list of {num_layers} decoder layers, so the KV cache "
        "cannot be placed with its layers; plan_device_map needs a transformers decoder "
        "(GPT-2, Llama, Mistral, Qwen, ...)"
    )


def device_of(name: str, device_map: Mapping[str, Device]) -> Device:
    """Where ``name`` (a tensor or module) lives under ``device_map``: its longest prefix key.

    Example:
        >>> device_of("model.layers.1.mlp.up_proj.weight", {"model.layers.1": 1, "": 0})
        1
    """
    best: tuple[int, Device] | None = None
    for key, device in device_map.items():
        if key in ("", name) or name.startswith(key + "."):
            length = len(key) if key else -1
            if best is None or length > best[0]:
                best = (length, device)
    if best is None:
        raise ValueError(
            f"the device map places no key over {name!r}; every parameter needs an entry "
            "(its own name, a parent module, or '' for everything)"
        )
    return best[1]


@dataclasses.dataclass(frozen=True)
class Runtime:
    """Non-weight bytes of inference, split by where they live (from `estimate`).

    Attributes:
        kv_per_layer: KV cache of one decoder layer (0 without a cache).
        transient: Largest set of tensors alive inside one block (on a GPU running blocks).
        head: Logits plus the last hidden state (on the GPU running the output head).
        overhead: Input ids, the attention mask, RoPE tables: on every GPU that runs a part.
        total: The single-GPU estimate's allocated total without weights, for checking.
        notes: Rules applied.
    """

    kv_per_layer: int
    transient: int
    head: int
    overhead: int
    total: int
    notes: tuple[str, ...]


def runtime_figures(
    config: Any,
    spec: TransformerSpec,
    *,
    batch: int,
    seq: int,
    compute: DType,
    attn: str,
    kv_cache: bool,
) -> Runtime:
    """The runtime bytes of `estimate(..., mode="inference")`, split per layer and per part.

    ``estimate`` reports ``activations = max(block transient, logits + hidden)`` for the
    whole model; placed on several GPUs the two happen on the GPUs that run blocks and on
    the one that runs the head, so they are taken apart here with the same block model
    (`inference_transient`) and checked against the estimate's figure.
    """
    whole = estimate(
        config,
        batch_size=batch,
        seq_len=seq,
        dtype=compute,
        mode="inference",
        attn_implementation=attn,
        use_cache=kv_cache,
        device="cuda",
    )
    notes: list[str] = []
    if whole.kv_cache % spec.num_layers:  # pragma: no cover - the formula is linear in layers
        raise ArithmeticError(f"KV cache {whole.kv_cache} is not a multiple of the layers")
    tokens = batch * seq
    settings = BlockSettings(
        dtype=compute, attention=parse_attention(attn), device="cuda", training=False
    )
    transient = math.ceil(tokens * inference_transient(spec, seq, settings, batch_size=batch))
    e = compute.itemsize
    head = math.ceil(tokens * spec.vocab * e) + math.ceil(tokens * spec.hidden * e)
    if max(transient, head) != whole.activations:  # pragma: no cover - kept in step by a test
        notes.append("activations: the estimate's whole-model figure on every GPU")
        transient = head = whole.activations
    return Runtime(
        kv_per_layer=whole.kv_cache // spec.num_layers,
        transient=transient,
        head=head,
        overhead=whole.overhead,
        total=whole.total - whole.weights,
        notes=tuple(notes),
    )


def allocatable(budget: int) -> int:
    """The largest allocated peak whose reserved bytes (`approximate_reserved`) fit ``budget``.

    Example:
        >>> t = allocatable(1 << 30)
        >>> approximate_reserved(t) <= 1 << 30 < approximate_reserved(t + 1)
        True
    """
    if budget <= 0 or approximate_reserved(1) > budget:
        return 0
    # approximate_reserved(x) >= x, so budget + 1 never fits
    return last_true(lambda x: approximate_reserved(x) <= budget, 1, budget + 1)
