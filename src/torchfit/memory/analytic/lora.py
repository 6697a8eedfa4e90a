"""LoRA adapters by their targets: which block Linears get one, what they train and save.

Target names are matched the way PEFT matches ``target_modules`` (a module name, or its
last components), in each family's own names (``q_proj``/``v_proj`` for Llama-style
models, ``c_attn``/``c_proj``/``c_fc`` for GPT-2, ``query``/``value``/``dense`` for BERT),
plus PEFT's ``"all-linear"`` and the group names other recipes use (``"attention"``,
``"mlp"``, LitGPT's ``"query"``/``"key"``/``"value"``/``"projection"``, and ``"head"``
for the output head). Each name becomes a *role* of the block: q, k, v, qkv (GPT-2's
fused projection), o, gate, up, fc, down.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from collections.abc import Set as AbstractSet

from torchfit.memory.analytic.arch import Family, TransformerSpec

__all__ = [
    "BLOCK_ROLES",
    "DEFAULT_RANK",
    "DEFAULT_TARGETS",
    "FAMILY_NAMES",
    "default_targets",
    "is_fused",
    "names_of",
    "LoraSetup",
    "lora_parameters",
    "resolve_targets",
    "role_shapes",
    "saved_parameters",
]

#: A family's module names (as PEFT sees their last component) -> roles.
FAMILY_NAMES: dict[Family, dict[str, tuple[str, ...]]] = {
    Family.LLAMA: {
        "q_proj": ("q",),
        "k_proj": ("k",),
        "v_proj": ("v",),
        "o_proj": ("o",),
        "gate_proj": ("gate",),
        "up_proj": ("up",),
        "down_proj": ("down",),
        "query": ("q",),
        "key": ("k",),
        "value": ("v",),
        "projection": ("o",),
        "output_proj": ("o",),
        "attention": ("q", "k", "v", "o"),
        "mlp": ("gate", "up", "down"),
    },
    Family.GPT2: {
        "c_attn": ("qkv",),
        "attn.c_proj": ("o",),
        "mlp.c_proj": ("down",),
        "c_proj": ("o", "down"),
        "c_fc": ("fc",),
        "attention": ("qkv", "o"),
        "mlp": ("fc", "down"),
    },
    Family.BERT: {
        "query": ("q",),
        "key": ("k",),
        "value": ("v",),
        "attention.output.dense": ("o",),
        "intermediate.dense": ("fc",),
        "output.dense": ("o", "down"),
        "transform.dense": ("transform",),
        "dense": ("o", "fc", "down", "transform"),
        "attention": ("q", "k", "v", "o"),
        "mlp": ("fc", "down"),
    },
}
#: Phi-3's fused projections (transformers' ``Phi3Attention.qkv_proj`` and
#: ``Phi3MLP.gate_up_proj``, also Phi-3.5 and Phi-4): one adapter per fused Linear.
FUSED_NAMES: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("qkv",),
    "o_proj": ("o",),
    "gate_up_proj": ("gate_up",),
    "down_proj": ("down",),
    "attention": ("qkv", "o"),
    "mlp": ("gate_up", "down"),
}
#: model_types whose blocks fuse q/k/v and gate/up (`FUSED_NAMES`).
_FUSED_TYPES = frozenset({"phi3"})
_HEAD = frozenset({"head", "lm_head", "output"})
#: Roles outside the blocks, one Linear per model (BERT's masked-LM head transform).
_ONCE = frozenset({"transform"})
#: The roles that read the block's normed input (one fused Linear in Lit-GPT).
_QKV = frozenset({"q", "k", "v", "qkv"})
#: The roles of a block's Linears.
BLOCK_ROLES = frozenset({"q", "k", "v", "qkv", "o", "gate", "up", "gate_up", "fc", "down"})

#: PEFT's default targets per family (``TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING``
#: in peft/utils/constants.py: llama/mistral/qwen2 -> q_proj, v_proj; gpt2 -> c_attn;
#: bert -> query, value), with PEFT's default rank ``r=8`` and dropout 0.
DEFAULT_TARGETS: dict[Family, tuple[str, ...]] = {
    Family.LLAMA: ("q_proj", "v_proj"),
    Family.GPT2: ("c_attn",),
    Family.BERT: ("query", "value"),
}
DEFAULT_RANK = 8


def is_fused(spec: TransformerSpec) -> bool:
    """``spec``'s blocks fuse q/k/v and gate/up into one Linear each (Phi-3)."""
    return spec.model_type in _FUSED_TYPES


def names_of(spec: TransformerSpec) -> dict[str, tuple[str, ...]]:
    """The module names of ``spec``'s blocks and their roles (fused for Phi-3)."""
    return FUSED_NAMES if is_fused(spec) else FAMILY_NAMES[spec.family]


def default_targets(spec: TransformerSpec) -> tuple[str, ...]:
    """PEFT's default targets for ``spec``'s family (peft/utils/constants.py).

    PEFT has none for Phi-3 (it asks for ``target_modules``): its fused ``qkv_proj``,
    which holds the q and v the other families default to.
    """
    return ("qkv_proj",) if is_fused(spec) else DEFAULT_TARGETS[spec.family]


@dataclasses.dataclass(frozen=True)
class LoraSetup:
    """Adapters of rank ``rank`` on the block ``roles`` (and the head), with their dropout.

    Attributes:
        rank: ``r``.
        roles: Block roles that get an adapter (see the module notes).
        head: The output head gets one too.
        dropout: ``lora_dropout``: above 0 each adapter keeps a mask and a dropped copy of
            its input; at 0 it keeps the input itself.
        extra_trainable: Parameters that train beside the adapters: small
            ``modules_to_save`` (a classifier), trained biases (``bias="all"`` or
            ``"lora_only"``, ``lora_bias``).
        ranks: ``rank_pattern``: a rank per role where it differs from ``rank``.
        dora: ``use_dora``: a trained magnitude per output feature, and the base's and
            the adapter's outputs kept for it (`torchfit.memory.analytic.loraconfig`).
        saved: ``modules_to_save`` that are the head (``"head"``) or the input embedding
            (``"embedding"``): a trainable copy beside the frozen original.
        shared_qkv_dropout: One dropout mask and one dropped input shared by the query,
            key and value adapters, which all read the block's normed input: Lit-GPT's
            ``LoRAQKVLinear.forward`` runs ``F.linear(self.lora_dropout(x), self.lora_A)``
            once over the stacked ``lora_A`` of every enabled q/k/v (litgpt/lora.py).
            ``False`` (PEFT): each targeted module has its own ``lora_dropout`` and keeps
            its own mask and copy.
    """

    rank: int
    roles: frozenset[str]
    head: bool = False
    dropout: float = 0.0
    extra_trainable: int = 0
    ranks: tuple[tuple[str, int], ...] = ()
    dora: bool = False
    saved: frozenset[str] = frozenset()
    shared_qkv_dropout: bool = False

    def __post_init__(self) -> None:
        """Refuse a rank below 1 and a dropout outside [0, 1)."""
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"lora_rank must be an int >= 1; got {self.rank!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora_dropout must be in [0, 1); got {self.dropout!r}")

    def dropout_width(self, shapes: dict[str, tuple[int, int]], roles: AbstractSet[str]) -> int:
        """Input features of the dropped copies: one per adapter, or one for q/k/v if shared.

        Example:
            >>> shapes = {"q": (64, 64), "v": (64, 16), "down": (256, 64)}
            >>> roles = {"q", "v", "down"}
            >>> LoraSetup(8, frozenset(roles)).dropout_width(shapes, roles)
            384
            >>> LoraSetup(8, frozenset(roles), shared_qkv_dropout=True).dropout_width(shapes, roles)
            320
        """
        widths = [shapes[role][0] for role in roles]
        if not self.shared_qkv_dropout:
            return sum(widths)
        fused = [shapes[role][0] for role in roles & _QKV]
        return sum(widths) - sum(fused) + max(fused, default=0)

    def rank_of(self, role: str) -> int:
        """The rank of the adapter on ``role`` (``rank_pattern``, else ``rank``)."""
        return dict(self.ranks).get(role, self.rank)


def resolve_targets(
    spec: TransformerSpec, targets: str | Iterable[str]
) -> tuple[frozenset[str], bool]:
    """The block roles and whether the head is targeted, for ``targets`` of ``spec``'s family.

    Raises:
        ValueError: a name that matches no Linear of the family; the message lists them.

    Example:
        >>> from transformers import LlamaConfig
        >>> from torchfit.memory.analytic.arch import spec_from_config
        >>> roles, head = resolve_targets(spec_from_config(LlamaConfig()), ["q_proj", "v_proj"])
        >>> sorted(roles), head
        (['q', 'v'], False)
    """
    names = names_of(spec)
    wanted = [targets] if isinstance(targets, str) else list(targets)
    if not wanted:
        raise ValueError(
            "lora_targets is empty; name the Linears to adapt, e.g. ['q_proj', 'v_proj']"
        )
    roles: set[str] = set()
    head = False
    for name in wanted:
        if not isinstance(name, str):
            raise TypeError(f"a LoRA target must be a module name; got {name!r}")
        key = name.strip()
        if key == "all-linear":  # PEFT: every Linear but the output head
            roles |= {role for found in names.values() for role in found}
        elif key in _HEAD:
            head = True
        elif key in names:
            roles |= set(names[key])
        else:
            known = ", ".join(sorted({*names, "all-linear", "lm_head"}))
            raise ValueError(
                f"lora_targets: {name!r} matches no Linear of a {spec.family.value}-style "
                f"block; expected some of: {known}"
            )
    return frozenset(roles), head


def role_shapes(spec: TransformerSpec) -> dict[str, tuple[int, int]]:
    """``(in_features, out_features)`` of each role's Linear in one block."""
    h, i, kv = spec.hidden, spec.intermediate, spec.kv_dim
    q = spec.num_heads * spec.head_dim
    return {
        "q": (h, q),
        "k": (h, kv),
        "v": (h, kv),
        "qkv": (h, q + 2 * kv),
        "o": (q, h),
        "gate": (h, i),
        "up": (h, i),
        "gate_up": (h, 2 * i),
        "fc": (h, i),
        "down": (i, h),
        "transform": (h, h),
    }


def lora_parameters(spec: TransformerSpec, setup: LoraSetup) -> int:
    """Parameters the adapters train: ``r * (in + out)`` per adapted Linear, plus the rest.

    Example:
        >>> from transformers import LlamaConfig
        >>> from torchfit.memory.analytic.arch import spec_from_config
        >>> spec = spec_from_config(LlamaConfig())  # Llama-2-7B's shapes
        >>> lora_parameters(spec, LoraSetup(rank=8, roles=frozenset({"q", "v"})))
        4194304
    """
    shapes = role_shapes(spec)
    magnitude = 1 if setup.dora else 0  # DoRA: one trained magnitude per output feature

    def adapter(role: str, fan_in: int, fan_out: int) -> int:
        return setup.rank_of(role) * (fan_in + fan_out) + magnitude * fan_out

    per_block = sum(adapter(role, *shapes[role]) for role in setup.roles - _ONCE)
    once = sum(adapter(role, *shapes[role]) for role in setup.roles & _ONCE)
    head = adapter("head", spec.hidden, spec.vocab) if setup.head else 0
    copies = saved_parameters(spec, setup)
    return spec.num_layers * per_block + once + head + setup.extra_trainable + copies


def saved_parameters(spec: TransformerSpec, setup: LoraSetup) -> int:
    """Parameters of the head's and the embedding's ``modules_to_save`` copies."""
    return len(setup.saved & {"head", "embedding"}) * spec.vocab * spec.hidden
