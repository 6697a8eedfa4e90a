"""A ``peft.LoraConfig`` as the closed form reads it: each field that changes memory.

Read as PEFT 0.21 applies them (peft/tuners/lora/config.py, model.py, layer.py,
tuners_utils.py's ``check_target_module_exists``):

- ``r``, and ``rank_pattern`` (a rank per module name pattern; per role here, so a pattern
  naming single layers is refused);
- ``target_modules``: names (a module's name or its last components), ``"all-linear"``
  (every Linear but the head), the full names ``get_peft_model`` writes back for
  ``"all-linear"`` (each block's modules), or one string taken as a regular expression that must
  match a module's full name; ``exclude_modules`` the same, taken out of the targets;
- ``lora_dropout``: above 0 each adapter keeps a mask and a dropped copy of its input;
- ``bias``: ``"all"`` trains every bias of the model, ``"lora_only"`` those of the adapted
  Linears; ``lora_bias``: each ``lora_B`` gets a bias (trained);
- ``modules_to_save``: ``ModulesToSaveWrapper`` (peft/utils/other.py) keeps the original
  module frozen and trains a ``copy.deepcopy`` of it, in the original's dtype: the head
  or the embedding then counts twice in the weights, its copy trains (gradients and
  optimizer state in that dtype) and a trained head keeps its input for its gradient;
- ``use_dora``: a trained magnitude per output feature; each adapted Linear keeps the
  base's and the adapter's outputs for it (``DoraLinearLayer.forward``:
  ``(m - 1) * base_result + m * lora_result``); with dropout it runs the base matmul
  again on the dropped input. With a quantized base that second matmul keeps a
  dequantized copy of every adapted weight, which is not modelled: refused there;
- ``inference_mode=True`` freezes the adapters: refused for training.

Refused, because the closed form has no such structure (`LORA_FIELDS_NOT_MODELLED`; trace the PEFT
model instead): adapters on some layers only (``layers_to_transform``,
``layers_pattern``), ``layer_replication``, ``target_parameters``,
``trainable_token_indices`` and the LoRA variants with their own layers.

Not read, knowingly (no effect on a step's memory): ``lora_alpha``, ``alpha_pattern`` and
``use_rslora`` (the scaling), ``fan_in_fan_out`` (GPT-2's Conv1D layout),
``init_lora_weights``, ``loftq_config``, ``eva_config``, ``corda_config``,
``lora_ga_config`` (initialisation), ``runtime_config`` (offload at inference),
``megatron_config``/``megatron_core`` (Megatron's layers), ``ensure_weight_tying``,
``qalora_group_size`` (with ``use_qalora`` only), ``task_type`` and bookkeeping fields.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from torchfit.memory.analytic.arch import Family, TransformerSpec
from torchfit.memory.analytic.lora import (
    BLOCK_ROLES,
    DEFAULT_RANK,
    FUSED_NAMES,
    LoraSetup,
    default_targets,
    names_of,
    resolve_targets,
    role_shapes,
)

__all__ = ["LORA_FIELDS_NOT_MODELLED", "bias_parameters", "lora_from_peft", "lora_setup"]

#: LoraConfig fields that give adapters a structure the closed form does not have.
LORA_FIELDS_NOT_MODELLED = (
    "layers_to_transform",
    "layers_pattern",
    "layer_replication",
    "target_parameters",
    "trainable_token_indices",
    "use_qalora",
    "alora_invocation_tokens",
    "velora_config",
    "monteclora_config",
    "arrow_config",
    "kasa_config",
    "use_bdlora",
)

#: Each role's module, by its full name in transformers' model of the family, in layer {k}.
_FULL_NAMES: dict[Family, dict[str, str]] = {
    Family.LLAMA: {
        **{r: f"model.layers.{{k}}.self_attn.{r}_proj" for r in ("q", "k", "v", "o")},
        **{r: f"model.layers.{{k}}.mlp.{r}_proj" for r in ("gate", "up", "down")},
        "head": "lm_head",
    },
    Family.GPT2: {
        "qkv": "transformer.h.{k}.attn.c_attn",
        "o": "transformer.h.{k}.attn.c_proj",
        "fc": "transformer.h.{k}.mlp.c_fc",
        "down": "transformer.h.{k}.mlp.c_proj",
        "head": "lm_head",
    },
    Family.BERT: {
        **{
            r: f"bert.encoder.layer.{{k}}.attention.self.{n}"
            for r, n in (("q", "query"), ("k", "key"), ("v", "value"))
        },
        "o": "bert.encoder.layer.{k}.attention.output.dense",
        "fc": "bert.encoder.layer.{k}.intermediate.dense",
        "down": "bert.encoder.layer.{k}.output.dense",
        "transform": "cls.predictions.transform.dense",
        "head": "cls.predictions.decoder",
    },
}
#: Phi-3's fused modules by their full names (`torchfit.memory.analytic.lora.FUSED_NAMES`).
_FUSED_FULL_NAMES = {
    "qkv": "model.layers.{k}.self_attn.qkv_proj",
    "o": "model.layers.{k}.self_attn.o_proj",
    "gate_up": "model.layers.{k}.mlp.gate_up_proj",
    "down": "model.layers.{k}.mlp.down_proj",
    "head": "lm_head",
}


def _full_names(spec: TransformerSpec) -> dict[str, str]:
    """Each role's full module name in ``spec``'s transformers model (layer ``{k}``)."""
    return _FUSED_FULL_NAMES if names_of(spec) is FUSED_NAMES else _FULL_NAMES[spec.family]


_HEADS = ("lm_head", "output", "embed_out", "head")
_EMBEDDINGS = ("embed_tokens", "wte", "word_embeddings", "embed_in")
_SMALL = ("score", "classifier")


def _matching(spec: TransformerSpec, matches: Any, what: str) -> set[str]:
    """The roles (and ``"head"``) whose modules ``matches(full name)`` in every layer.

    Raises:
        ValueError: a pattern that matches a role in some layers only.
    """
    found = set()
    for role, name in _full_names(spec).items():
        hits = {bool(matches(name.format(k=k))) for k in (0, 1)}
        if hits == {True, False}:
            raise ValueError(
                f"{what} matches {role!r} in some layers only, which the closed form does not "
                "model (every block is alike); trace the PEFT model (torchfit.memory.trace)"
            )
        if True in hits:
            found.add(role)
    return found


def _targets(spec: TransformerSpec, value: Any, what: str) -> tuple[frozenset[str], bool]:
    """Block roles and the head from ``target_modules``/``exclude_modules`` as PEFT reads them."""
    if isinstance(value, str) and value.strip() != "all-linear":
        pattern = value.strip()
        roles = _matching(spec, lambda name: re.fullmatch(pattern, name), f"{what}={value!r}")
        if not roles:
            raise ValueError(
                f"{what}={value!r} (a regular expression of full module names) matches no "
                f"Linear of a {spec.family.value}-style model, e.g. "
                f"{_full_names(spec).get('q') or _full_names(spec)['qkv']!r}"
            )
        return frozenset(roles - {"head"}), "head" in roles
    if not isinstance(value, str) and any(isinstance(v, str) and "." in v for v in value):
        return _dotted(spec, list(value), what)
    return resolve_targets(spec, value)


#: A module name inside a numbered block: the block's index, then the module's own name.
_IN_BLOCK = re.compile(r"(?:^|\.)(\d+)\.(.+)$")


def _dotted(spec: TransformerSpec, names: list[Any], what: str) -> tuple[frozenset[str], bool]:
    """Roles from dotted module names, as PEFT writes ``"all-linear"`` back into the config.

    ``get_peft_model`` replaces ``target_modules="all-linear"`` with the full name of every
    module it adapted (``model.layers.0.self_attn.q_proj``, one per block), so a config read
    after the model was built names modules, not kinds. A name in a block counts for its
    role when it is there for every block (the closed form's blocks are alike); a dotted
    name outside a block (``self_attn.q_proj``) matches as a suffix, as PEFT matches it.

    Raises:
        ValueError: a role named in some blocks only.
    """
    within = {t.split("{k}.", 1)[1]: r for r, t in _full_names(spec).items() if "{k}." in t}
    blocks: dict[str, set[int]] = {}
    plain: list[Any] = []
    for name in names:
        key = name.strip() if isinstance(name, str) else name
        found = _IN_BLOCK.search(key) if isinstance(key, str) else None
        if found is not None and found.group(2) in within:
            blocks.setdefault(within[found.group(2)], set()).add(int(found.group(1)))
            continue
        suffix = [
            r
            for tail, r in within.items()
            if isinstance(key, str) and "." in key and (tail == key or tail.endswith("." + key))
        ]
        if suffix:
            blocks.update({r: set(range(spec.num_layers)) for r in suffix})
            continue
        plain.append(key.rsplit(".", 1)[-1] if isinstance(key, str) else key)
    for role, seen in blocks.items():
        if seen != set(range(spec.num_layers)):
            raise ValueError(
                f"{what} names the {role!r} Linear of blocks {sorted(seen)} of "
                f"{spec.num_layers} only; the closed form adapts every block alike: target "
                "it in every block, or trace the PEFT model (torchfit.memory.trace)"
            )
    roles, head = resolve_targets(spec, plain) if plain else (frozenset(), False)
    return roles | frozenset(blocks), head


def _ranks(spec: TransformerSpec, pattern: dict[str, int] | None) -> tuple[tuple[str, int], ...]:
    """``rank_pattern`` per role: PEFT matches each key at the end of a module's name."""
    ranks: dict[str, int] = {}
    for key, rank in (pattern or {}).items():
        compiled = re.compile(rf"(.*\.)?({key})$")
        for role in _matching(spec, compiled.match, f"rank_pattern key {key!r}"):
            ranks.setdefault(role, int(rank))
    return tuple(sorted(ranks.items()))


def bias_parameters(spec: TransformerSpec, roles: Iterable[str], *, bias: str) -> int:
    """Biases that train with ``bias="lora_only"`` (those of ``roles``) or ``"all"``.

    GPT-2 and BERT give every Linear a bias, and their LayerNorms one each (BERT's MLM
    decoder too); Llama-style blocks have biases on q/k/v only when the config says so
    (Qwen2's ``qkv_bias``) and RMSNorms without.

    Example:
        >>> from transformers import GPT2Config
        >>> from torchfit.memory.analytic.arch import spec_from_config
        >>> bias_parameters(spec_from_config(GPT2Config(n_layer=1)), ["qkv"], bias="lora_only")
        2304
    """
    if bias == "none":
        return 0
    if bias not in {"all", "lora_only"}:
        raise ValueError(f"LoraConfig bias must be 'none', 'all' or 'lora_only'; got {bias!r}")
    shapes = role_shapes(spec)
    every = {role for found in names_of(spec).values() for role in found}
    # GPT-2's Conv1D and BERT's Linears all have biases; Llama-style ones q/k/v at most
    llama = {"q", "k", "v"} if spec.qkv_bias else set()
    biased = llama if spec.family is Family.LLAMA else every
    chosen = (set(roles) if bias == "lora_only" else every) & biased
    per_block = sum(shapes[role][1] for role in chosen - {"transform"})
    once = shapes["transform"][1] if "transform" in chosen else 0
    total = spec.num_layers * per_block + once
    if bias == "all" and spec.family is Family.GPT2:  # ln_1, ln_2 per block, ln_f
        total += (2 * spec.num_layers + 1) * spec.hidden
    if bias == "all" and spec.family is Family.BERT:  # + the embeddings' and MLM's, decoder
        total += (2 * spec.num_layers + 2) * spec.hidden + spec.vocab
    return total


def _saved(spec: TransformerSpec, names: Iterable[str]) -> tuple[frozenset[str], int]:
    """``modules_to_save``: the head and embedding copies, and the small modules' parameters."""
    saved: set[str] = set()
    small = 0
    for name in names:
        leaf = str(name).rpartition(".")[2]
        if leaf in _HEADS:
            saved.add("head")
        elif leaf in _EMBEDDINGS:
            saved.add("embedding")
        elif leaf in _SMALL:
            small += spec.hidden  # one output per label; the labels are not in the config
        else:
            known = ", ".join((*_HEADS, *_EMBEDDINGS, *_SMALL))
            raise ValueError(f"modules_to_save names {name!r}; expected some of: {known}")
    return frozenset(saved), small


def lora_from_peft(spec: TransformerSpec, config: Any, *, training: bool = True) -> LoraSetup:
    """A `LoraSetup` from a ``peft.LoraConfig``, field by field (see the module notes).

    ``training``: the adapters train (``inference_mode=True`` is then refused).

    Raises:
        ValueError: a field whose structure the closed form does not model, or a name
            that matches no module; the message names the field and what to do.
    """
    if training and getattr(config, "inference_mode", False):
        raise ValueError(
            "LoraConfig(inference_mode=True) freezes the adapters, so nothing would train; "
            "set inference_mode=False, or estimate with mode='inference'"
        )
    asked = [
        name
        for name in LORA_FIELDS_NOT_MODELLED
        if getattr(config, name, None) not in (None, False)
    ]
    if asked:
        raise ValueError(
            f"LoraConfig({', '.join(asked)}=...) gives the adapters a structure the closed "
            "form does not model (every block adapted alike); trace the PEFT model with "
            "torchfit.memory.trace"
        )
    targets = getattr(config, "target_modules", None)
    if targets is None:
        raise ValueError(
            "the LoraConfig has no target_modules; name them (e.g. ['q_proj', 'v_proj']) or "
            "use target_modules='all-linear'"
        )
    roles, head = _targets(spec, targets, "target_modules")
    excluded = getattr(config, "exclude_modules", None)
    if excluded:
        out, out_head = _targets(spec, excluded, "exclude_modules")
        roles, head = roles - out, head and not out_head
    saved, small = _saved(spec, getattr(config, "modules_to_save", None) or ())
    bias = bias_parameters(spec, roles, bias=str(getattr(config, "bias", "none")))
    if getattr(config, "lora_bias", False):  # lora_B with a bias: one per output feature
        shapes = role_shapes(spec)
        bias += spec.num_layers * sum(shapes[r][1] for r in roles & BLOCK_ROLES)
        bias += spec.vocab if head else 0
    return LoraSetup(
        rank=int(config.r),
        roles=roles,
        head=head,
        dropout=float(getattr(config, "lora_dropout", 0.0) or 0.0),
        extra_trainable=small + bias,
        ranks=_ranks(spec, getattr(config, "rank_pattern", None)),
        dora=bool(getattr(config, "use_dora", False)),
        saved=saved,
    )


def lora_setup(
    spec: TransformerSpec,
    *,
    lora: Any = None,
    rank: int | None = None,
    targets: str | Iterable[str] | None = None,
    dropout: float | None = None,
    training: bool = True,
) -> LoraSetup:
    """The adapters `estimate` plans: a ``peft.LoraConfig``, a `LoraSetup`, a rank and targets.

    ``training``: the step trains them (see `lora_from_peft`).

    The defaults are PEFT's for the family: ``r=8`` on q and v (`DEFAULT_TARGETS`).

    Example:
        >>> from transformers import GPT2Config
        >>> from torchfit.memory.analytic.arch import spec_from_config
        >>> setup = lora_setup(spec_from_config(GPT2Config()))
        >>> setup.rank, sorted(setup.roles)
        (8, ['qkv'])
    """
    if lora is not None:
        if rank is not None or targets is not None or dropout is not None:
            raise ValueError(
                "lora= (a peft.LoraConfig) and lora_rank=/lora_targets=/lora_dropout= both "
                "describe the adapters; pass one of them (the LoraConfig has r, "
                "target_modules and lora_dropout)"
            )
        if isinstance(lora, LoraSetup):  # already ours, e.g. with shared_qkv_dropout=True
            return lora
        return lora_from_peft(spec, lora, training=training)
    roles, head = resolve_targets(spec, default_targets(spec) if targets is None else targets)
    return LoraSetup(
        rank=DEFAULT_RANK if rank is None else rank,
        roles=roles,
        head=head,
        dropout=0.0 if dropout is None else dropout,
    )
