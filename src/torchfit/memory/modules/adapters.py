"""LoRA adapters on a model without a closed form: PEFT's own layers, on the meta device.

`with_adapters` copies the meta-device model and wraps it with ``peft.get_peft_model``,
so the meta pass sees exactly the layers PEFT would add (targets resolved by PEFT,
defaults for the model type included) and a frozen base. `frozen_base_weights` gives the
weights' bytes with the base in its own dtype: under mixed precision a LoRA base stays
in the checkpoint's dtype (``from_pretrained``'s default), only the adapters in fp32.

Targets may be module names, as PEFT takes them, or LitGPT's role names (``"query"``,
``"key"``, ``"value"``, ``"projection"``, ``"mlp"``, ``"head"``), which `role_targets`
turns into this model's modules: the closed forms take the same names. A role on a fused
query/key/value Linear (GPT-NeoX, Falcon, BLOOM, GPT-2) adapts the whole fused Linear,
a little more than LitGPT's adapter on its query and value parts.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from torch import nn

from torchfit._bnb.selection import is_linear
from torchfit._core.imports import require
from torchfit._core.units import DType
from torchfit.memory.analytic.lora import DEFAULT_RANK

__all__ = ["frozen_base_weights", "role_targets", "with_adapters"]

#: Attention Linear names by role (last name component), over the transformers families.
_SEPARATE = {
    "query": {"q_proj", "query", "q", "q_lin", "wq"},
    "key": {"k_proj", "key", "k", "k_lin", "wk"},
    "value": {"v_proj", "value", "v", "v_lin", "wv"},
}
_FUSED = {"query_key_value", "qkv_proj", "c_attn", "wqkv", "Wqkv", "qkv", "W_pack"}
_ROLES = frozenset({*_SEPARATE, "projection", "mlp", "head"})


def _linears(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every Linear-like module (``nn.Linear``, transformers' ``Conv1D``) with its name."""
    return [(name, module) for name, module in model.named_modules() if is_linear(module)]


def _role_of(name: str, module: nn.Module, head: nn.Module | None) -> set[str]:
    """The roles a Linear plays: by its name inside an attention module, else MLP."""
    if module is head:
        return {"head"}
    parent, _, leaf = name.rpartition(".")
    if "attn" not in parent.lower() and "attention" not in parent.lower():
        return {"mlp"}
    if leaf in _FUSED:
        return set(_SEPARATE)
    found = {role for role, leaves in _SEPARATE.items() if leaf in leaves}
    return found or {"projection"}


def role_targets(model: nn.Module, names: Iterable[str]) -> list[str]:
    """``names`` with LitGPT's role names replaced by ``model``'s module names.

    A name that is a Linear's own name (BERT's ``query``), or no role, is left to PEFT.

    Raises:
        ValueError: a role no Linear of ``model`` plays.

    Example:
        >>> import torch, transformers
        >>> with torch.device("meta"):
        ...     neox = transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(
        ...         hidden_size=8, num_attention_heads=2, num_hidden_layers=1,
        ...         intermediate_size=8, vocab_size=16))
        >>> role_targets(neox, ["query", "value"])
        ['gpt_neox.layers.0.attention.query_key_value']
    """
    linears = _linears(model)
    own = {name.rpartition(".")[2] for name, _ in linears}
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    chosen: list[str] = []
    for wanted in names:
        if wanted in own or wanted not in _ROLES:
            chosen.append(wanted)
            continue
        matched = [name for name, module in linears if wanted in _role_of(name, module, head)]
        if not matched:
            raise ValueError(
                f"lora_targets: no Linear of {type(model).__name__} plays the role "
                f"{wanted!r}; name its modules instead, e.g. "
                f"{sorted({n.rpartition('.')[2] for n, _ in linears})}"
            )
        chosen += [name for name in matched if name not in chosen]
    return chosen


def with_adapters(
    model: nn.Module,
    *,
    lora: Any = None,
    rank: int | None = None,
    targets: str | Iterable[str] | None = None,
    dropout: float | None = None,
) -> nn.Module:
    """A copy of ``model`` with PEFT's LoRA layers: from ``lora`` or rank/targets/dropout.

    Without targets, PEFT picks its default for the model type (and says when it has none).

    Raises:
        ValueError: ``lora`` together with rank or targets, or targets PEFT cannot find.
        ImportError: peft is not installed.
    """
    peft = require("peft", feature="LoRA on a model without a closed form")
    if lora is not None and (rank is not None or targets is not None or dropout is not None):
        raise ValueError(
            "lora= (a peft.LoraConfig) and lora_rank=/lora_targets=/lora_dropout= both "
            "describe the adapters; pass one of them (the LoraConfig has r, "
            "target_modules and lora_dropout)"
        )
    if lora is not None:
        lora = copy.deepcopy(lora)  # PEFT fills in fields of the config it is given
    else:
        named = (
            None
            if targets is None
            else role_targets(model, [targets] if isinstance(targets, str) else targets)
        )
        lora = peft.LoraConfig(
            r=DEFAULT_RANK if rank is None else rank,
            target_modules=named,
            lora_dropout=0.0 if dropout is None else dropout,
        )
    try:
        wrapped: nn.Module = peft.get_peft_model(copy.deepcopy(model), lora)
    except ValueError as error:
        raise ValueError(
            f"PEFT cannot place LoRA adapters on {type(model).__name__}: {error} (name the "
            "modules with lora_targets=, e.g. ['query_key_value'])"
        ) from error
    return wrapped


def frozen_base_weights(model: nn.Module, *, trainable: DType, frozen: DType) -> int:
    """Weights' bytes: parameters that train in ``trainable``, frozen ones in ``frozen``."""
    total = 0.0
    for param in model.parameters():
        dtype = trainable if param.requires_grad else frozen
        total += param.numel() * dtype.itemsize
    return int(total)
