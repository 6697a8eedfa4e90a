"""The distinct-storage counters on the ledger count what the frozen legacy counters counted.

Random small models (linear, norm, embedding layers; biases or not; frozen parameters;
buffers; a weight tied by object, a second parameter object over the same storage, a
parameter viewing part of another's storage; gradients; optimizer state after a step)
go through the legacy counters (commit 71111e7, `legacy_counters.py`) and the new ones:
`live_bytes`, `count_parameters`, the quantized footprints (`predict`,
`predict_unquantized`, `measure`) and the device map's `tensor_bytes`/`proxy_model`.
Every figure must be identical, on real CPU models and on meta-device ones.
"""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from core.legacy_counters import (
    legacy_count_parameters,
    legacy_live_bytes,
    legacy_measure,
    legacy_predict,
    legacy_predict_unquantized,
    legacy_proxy_model,
    legacy_tensor_bytes,
)
from torchfit._bnb.selection import QuantSettings, select_layers
from torchfit.memory.catalog.count import count_parameters
from torchfit.memory.device_map.sizes import proxy_model, tensor_bytes
from torchfit.memory.measure import live_bytes
from torchfit.quantize.sizes import measure, predict, predict_unquantized

_WIDTHS = st.sampled_from([1, 3, 8, 32, 64, 96])
_LAYERS = st.sampled_from(["linear", "linear-nobias", "norm", "batchnorm", "embedding"])
_TIES = st.sampled_from(["object", "same-storage", "part-of-storage", "buffer-alias"])


class Net(nn.Module):
    """Layers in a list, plus what the ties add."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList()


def _layer(kind, width_in, width_out):
    if kind.startswith("linear"):
        return nn.Linear(width_in, width_out, bias=kind == "linear")
    if kind == "norm":
        return nn.LayerNorm(width_in)
    if kind == "batchnorm":
        return nn.BatchNorm1d(width_in)
    return nn.Embedding(width_out, width_in)


@st.composite
def models(draw, *, meta: bool):
    """A `Net`; on meta, only ties by object (see `test_counters_on_meta_...`)."""
    widths = draw(st.lists(_WIDTHS, min_size=3, max_size=6))
    kinds = ["linear", *draw(st.lists(_LAYERS, min_size=len(widths) - 2, max_size=len(widths)))]
    with torch.device("meta" if meta else "cpu"):
        net = Net()
        for kind, (a, b) in zip(kinds, itertools.pairwise(widths), strict=False):
            net.blocks.append(_layer(kind, a, b))
        net.blocks.append(nn.Linear(widths[0], widths[1]))  # a twin of the first layer
    for tie in draw(st.lists(st.sampled_from(["object"]) if meta else _TIES, max_size=3)):
        first, twin = net.blocks[0], net.blocks[-1]
        if tie == "object":
            twin.weight = first.weight
        elif tie == "same-storage":
            net.again = nn.Parameter(first.weight.data)
        elif tie == "part-of-storage":
            net.part = nn.Parameter(first.weight.data[:1])
        else:
            net.register_buffer("alias", twin.weight.data.view(-1))
    for param in net.parameters():
        param.requires_grad_(draw(st.booleans()))
    return net


def _with_state(net, draw):
    """Gradients on some parameters, and an optimizer that has stepped on them."""
    params = [p for p in net.parameters() if p.requires_grad]
    for param in params:
        if draw(st.booleans()):
            param.grad = torch.ones_like(param)
    kind = draw(st.sampled_from(["none", "sgd-momentum", "adamw"]))
    if kind == "none" or not params:
        return None
    opt = (
        torch.optim.SGD(params, lr=0.1, momentum=0.9)
        if kind == "sgd-momentum"
        else torch.optim.AdamW(params)
    )
    opt.step()
    return opt


def _footprint_cases(net):
    for bits, double_quant in ((4, True), (4, False), (8, False)):
        quant = QuantSettings(bits=bits, double_quant=double_quant)
        try:
            selection = select_layers(net, quant, ())
        except ValueError:  # nothing left to quantize in this model
            continue
        for device in ("cpu", "cuda"):
            for cpu_packed in (False, True):
                yield selection, quant, device, cpu_packed


def _structure(net):
    """Per tensor name: (shape, dtype, the first name holding the same object)."""
    first = {}
    out = {}
    for name, tensor in [*net.named_parameters(remove_duplicate=False), *net.named_buffers()]:
        holder = first.setdefault(id(tensor), name)
        out[name] = (tuple(tensor.shape), tensor.dtype, holder)
    return out


def _check_every_counter(net, opt, *, real):
    if real:
        for device in (None, "cpu", "cuda"):
            objects = (net, opt, [p.detach() for p in net.parameters()])
            assert live_bytes(*objects, device=device) == legacy_live_bytes(*objects, device=device)
        assert measure(net) == legacy_measure(net)
    for trainable_only in (False, True):
        new = count_parameters(net, trainable_only=trainable_only)
        assert new == legacy_count_parameters(net, trainable_only=trainable_only)
    for device in ("cpu", "cuda"):
        for cast in (None, torch.bfloat16):
            new_rows = predict_unquantized(net, device=device, cast=cast)
            assert new_rows == legacy_predict_unquantized(net, device=device, cast=cast)
    for selection, quant, device, packed in _footprint_cases(net):
        new_rows = predict(net, selection, quant, device=device, cpu_packed=packed)
        assert new_rows == legacy_predict(net, selection, quant, device=device, cpu_packed=packed)
    for quant in (None, QuantSettings(bits=4), QuantSettings(bits=8)):
        try:
            new_sizes = tensor_bytes(net, quant)
        except ValueError:  # nothing left to quantize
            continue
        old_sizes = legacy_tensor_bytes(net, quant)
        assert {k: n for k, (n, _) in new_sizes.items()} == {
            k: n for k, (n, _) in old_sizes.items()
        }
        new_proxy = proxy_model(copy.deepcopy(net), tensor_bytes(net, quant))
        old_proxy = legacy_proxy_model(copy.deepcopy(net), legacy_tensor_bytes(net, quant))
        assert _structure(new_proxy) == _structure(old_proxy)


@settings(max_examples=60)
@given(data=st.data())
def test_counters_on_real_models_match_the_legacy_counters(data):
    net = data.draw(models(meta=False))
    opt = _with_state(net, data.draw)
    _check_every_counter(net, opt, real=True)


@settings(max_examples=30)
@given(data=st.data())
def test_counters_on_meta_models_match_the_legacy_counters(data):
    _check_every_counter(data.draw(models(meta=True)), None, real=False)


def test_counters_on_meta_now_see_ties_by_storage_as_on_real_devices():
    """The one deliberate difference: meta tensors have storages, and they are compared.

    Two parameter objects over one meta storage (same offset, shape, strides) were two
    parameters to the legacy count_parameters and two storages to the legacy quantized
    footprint; on the CPU they were one. They are one on both devices now.
    """
    for device in ("cpu", "meta"):
        net = nn.Linear(8, 8, device=device)
        net.again = nn.Parameter(net.weight.data)
        assert count_parameters(net) == 64 + 8
        assert predict_unquantized(net, device="cpu").total == 4 * (64 + 8)
    assert legacy_count_parameters(net) == 2 * 64 + 8  # the meta net, by the legacy rule


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_count_parameters_keeps_different_views_of_one_storage_apart(device):
    fused = nn.Linear(4, 12, bias=False, device=device)
    net = nn.Module()
    for i, name in enumerate("qkv"):
        setattr(net, name, nn.Parameter(fused.weight.data[4 * i : 4 * (i + 1)]))
    assert count_parameters(net) == 48  # three views of one storage: three parameters
