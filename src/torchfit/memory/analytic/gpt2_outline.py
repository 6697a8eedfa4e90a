"""A GPT-2 block run without autograd, as its forward allocates it: a `Transient` list.

Under gradient checkpointing (and in an inference forward) a block frees each
intermediate as soon as Python drops it, so what the caching allocator keeps cached
afterwards is decided by the sizes and lifetimes of those intermediates. transformers'
``GPT2Block`` (5.x, ``models/gpt2/modeling_gpt2.py``) makes, in order: ``ln_1``'s
output (in the stream's dtype, fp32 under autocast over fp32 weights), the fused
``c_attn`` output (one tensor of three hidden widths, split by views), the attention
output, ``c_proj``'s output, the dropped output and its mask, the residual sum, then
``ln_2``'s output and the MLP. ``gelu_new`` is a chain of elementwise ops
(``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * pow(x, 3))))``): ``0.5 * x``
lives to the last product, each other intermediate until the next exists; under
autocast ``pow`` runs in fp32 (it casts ``x``), so the rest of the chain is fp32 and
``c_proj`` casts its result back. The attention half's outputs stay referenced until
the block returns (``attn_outputs`` holds them). Each ``Conv1D`` under autocast casts
its input to the compute dtype first. The order and lifetimes are those of the
CUDA-target trace of GPT-2 (124M) training steps under checkpointing (fp32, bf16, and
fp32 under bf16 autocast; batch 4 x 1024), whose events this list reproduces.
"""

from __future__ import annotations

import math

from torchfit.memory.analytic.arch import TransformerSpec
from torchfit.memory.analytic.formulas import FP32, dropout_mask_bytes
from torchfit.memory.analytic.settings import BlockSettings
from torchfit.memory.outline import ForwardEvent, Transient, lifetimes

__all__ = ["gpt2_no_grad_block"]


def _gelu_new(x: int, chain: int, *, cast: bool) -> list[ForwardEvent]:
    """``gelu_new`` of an ``x``-byte input: ``chain``-byte intermediates (fp32 under autocast)."""
    steps: list[ForwardEvent] = [("half", x)]  # 0.5 * x
    if cast:
        steps += [("x32", chain)]  # autocast's fp32 copy of x for pow
    steps += [("pow", chain)] + (["x32"] if cast else [])
    previous = "pow"
    # the chain after pow: scaled by 0.044715, added to x, scaled, tanh, plus one
    for op in ("scaled", "sum", "inner", "tanh", "plus"):
        steps += [(op, chain), previous]
        previous = op
    return [*steps, ("gelu", chain), "half", previous]  # then the caller frees x


def gpt2_no_grad_block(
    spec: TransformerSpec, settings: BlockSettings, tokens: int, core: int
) -> tuple[Transient, ...]:
    """One GPT-2 block without autograd (module docstring); ``core``: the attention output."""
    e, r = settings.dtype.itemsize, settings.residual
    cast = settings.autocast and r > e
    h, i = tokens * spec.hidden, tokens * spec.intermediate
    he, hr, ie = math.ceil(h * e), math.ceil(h * r), math.ceil(i * e)
    drop = settings.training and spec.dropout > 0
    mask = math.ceil(h * dropout_mask_bytes(settings.dtype, settings.device))

    def dropped(name: str) -> list[ForwardEvent]:
        """Dropout of a projection's output: the dropped output and its mask."""
        if not drop:
            return []
        return [(f"{name} dropped", he), (f"{name} mask", mask), f"{name} mask", name]

    attention: list[ForwardEvent] = [
        ("ln_1", hr),
        *([("c_attn input", he)] if cast else []),
        ("qkv", 3 * he),
        *(["c_attn input"] if cast else []),
        ("attention", core),
        ("c_proj", he),
        "attention",
        *dropped("c_proj"),
        "qkv",
        ("residual", hr),
        "ln_1",
    ]
    chain = math.ceil(i * FP32) if cast else ie
    mlp: list[ForwardEvent] = [
        ("ln_2", hr),
        *([("c_fc input", he)] if cast else []),
        ("c_fc", ie),
        *(["c_fc input"] if cast else []),
    ]
    if spec.activation == "gelu_new":
        mlp += [*_gelu_new(ie, chain, cast=cast), "c_fc"]
        out = "gelu"
    else:  # one op
        mlp += [("act", ie), "c_fc"]
        out = "act"
    mlp += [
        *([("mlp proj input", ie)] if cast else []),
        ("mlp proj", he),
        *(["mlp proj input"] if cast else []),
        out,
        *dropped("mlp proj"),
    ]
    return lifetimes([*attention, *mlp])
