"""Describe a transformer by the few numbers the closed forms need.

`spec_from_config` reads a transformers config (GPT-2; Llama, Mistral, Qwen2 and other
Llama-style decoders; BERT/RoBERTa encoders) into a `TransformerSpec`. Parameter counts
are computed from the config alone — exact, and checked against a meta-device build in
the tests — so a 175B model is described in microseconds.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from torchfit._core import checks

__all__ = ["Family", "MoESpec", "TransformerSpec", "spec_from_config", "has_closed_form"]


#: Model types whose attention RMS-normalizes each query and key head (weights of head_dim).
QK_NORM_TYPES = frozenset({"qwen3", "qwen3_moe"})

#: Llama-family model types whose norms are weightless layer norms (``F.layer_norm``), not
#: RMSNorms: OLMo's ``OlmoLayerNorm``.
LAYER_NORM_TYPES = frozenset({"olmo"})


class Family(enum.StrEnum):
    """Block layouts with their own activation formulas."""

    GPT2 = "gpt2"  # pre-LN, fused QKV (Conv1D), GELU-tanh MLP, dropout, learned positions
    LLAMA = "llama"  # pre-RMSNorm, RoPE, GQA, SwiGLU, no dropout by default
    BERT = "bert"  # post-LN encoder, separate Q/K/V, GELU MLP, dropout


_LLAMA_LIKE = {"llama", "mistral", "qwen2", "qwen3", "gemma", "phi3", "olmo"}
_BERT_LIKE = {"bert", "roberta", "xlm-roberta", "camembert"}
#: Mixture-of-experts decoders: Llama-style attention, `torchfit.memory.analytic.moe` blocks.
_MOE = {"mixtral", "qwen2_moe", "qwen3_moe"}


@dataclasses.dataclass(frozen=True)
class MoESpec:
    """The mixture-of-experts part of a decoder (Mixtral, Qwen2-MoE, Qwen3-MoE).

    Attributes:
        num_experts: Routed experts per MoE layer, every one resident.
        top_k: Experts each token is routed to.
        expert_intermediate: MLP width of one expert.
        shared_intermediate: Width of the shared expert every token also goes through
            (Qwen2-MoE), 0 without one.
        sparse_layers: Layers with experts; the others keep a dense MLP of the spec's
            ``dense_intermediate`` (Qwen's ``mlp_only_layers``, ``decoder_sparse_step``).
        dense_intermediate: MLP width of the dense layers.
        expert_params: Parameters of one MoE layer's routed experts (3D tensors, not
            ``nn.Linear``: autocast and bitsandbytes leave them as they are).
        normalized: The top-k routing weights are renormalized to sum to one (Mixtral
            always; Qwen with ``norm_topk_prob``).
    """

    num_experts: int
    top_k: int
    expert_intermediate: int
    shared_intermediate: int
    sparse_layers: int
    dense_intermediate: int
    expert_params: int
    normalized: bool


@dataclasses.dataclass(frozen=True)
class TransformerSpec:
    """A transformer as numbers.

    Attributes:
        family: The block layout (`Family`).
        num_layers: Transformer blocks.
        hidden: Model width ``h``.
        num_heads: Attention heads ``a``.
        num_kv_heads: Key/value heads (GQA/MQA); equals ``num_heads`` for MHA.
        head_dim: Width of one head.
        intermediate: MLP width ``i``.
        vocab: Vocabulary size ``V``.
        max_positions: Longest sequence the model accepts.
        activation: MLP activation name as in the config (``gelu_new``, ``silu``...).
        dropout: Residual/hidden dropout probability.
        attention_dropout: Dropout on attention probabilities.
        tied_embeddings: The LM head shares the input embedding.
        sliding_window: Mistral-style attention window, or ``None``.
        qkv_bias: Q/K/V projections have biases.
        num_params: Exact parameter count of the model with its head (tied weights once).
        linear_params: Parameters of the Linear/Conv1D weights inside the blocks (what
            autocast casts and what 4/8-bit quantization converts).
        embedding_params: Input embedding (and position/type embedding) parameters.
        head_params: LM/MLM head parameters not tied to the embedding.
        num_tensors: Number of parameter tensors.
        model_type: The config's ``model_type``.
    """

    family: Family
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_positions: int
    activation: str
    dropout: float
    attention_dropout: float
    tied_embeddings: bool
    sliding_window: int | None
    qkv_bias: bool
    num_params: int
    linear_params: int
    embedding_params: int
    head_params: int
    num_tensors: int
    model_type: str

    @property
    def qk_norm(self) -> bool:
        """Each query and key head is RMS-normalized before RoPE (Qwen3's ``q_norm``/``k_norm``)."""
        return self.model_type in QK_NORM_TYPES

    @property
    def rms_norm(self) -> bool:
        """The block and final norms are RMSNorms (``x.pow(2).mean(-1)``), not layer norms."""
        return self.model_type not in LAYER_NORM_TYPES

    @property
    def autocast_params(self) -> int:
        """Weights autocast casts to 16 bits: the block Linears and the LM / MLM head's.

        The head is an ``nn.Linear`` whether or not it is tied to the embedding, so
        ``F.linear`` under autocast casts its weight too and keeps the copy for backward
        (measured with the CUDA-target trace: ``vocab x hidden`` 16-bit bytes at the head).
        """
        return self.linear_params + self.vocab * self.hidden

    @property
    def kv_dim(self) -> int:
        """Width of the keys (or values) of one token: ``num_kv_heads * head_dim``."""
        return self.num_kv_heads * self.head_dim

    # --- mixture of experts (`torchfit.memory.analytic.moe`); ``None`` for dense models
    moe: MoESpec | None = None


def has_closed_form(config: Any) -> bool:
    """Whether `spec_from_config` reads this config (else `estimate` takes a meta-device pass).

    Example:
        >>> from transformers import LlamaConfig, T5Config
        >>> has_closed_form(LlamaConfig()), has_closed_form(T5Config())
        (True, False)
    """
    model_type = str(getattr(config, "model_type", ""))
    return model_type == "gpt2" or model_type in _LLAMA_LIKE | _BERT_LIKE | _MOE


def _get(config: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return default


@checks.arguments(config=checks.model_ref())
def spec_from_config(config: Any) -> TransformerSpec:
    """Read a transformers config into a `TransformerSpec`.

    Raises:
        ValueError: the config's ``model_type`` has no closed form here; the message
            points to `torchfit.memory.trace` and `activation_bytes`, which handle any model.

    Example:
        >>> from transformers import GPT2Config
        >>> spec = spec_from_config(GPT2Config())
        >>> spec.num_params, spec.num_layers, spec.head_dim
        (124439808, 12, 64)
    """
    model_type = str(getattr(config, "model_type", ""))
    if model_type == "gpt2":
        return _describe_gpt2(config)
    if model_type in _LLAMA_LIKE:
        return _describe_llama(config, model_type)
    if model_type in _BERT_LIKE:
        return _describe_bert(config, model_type)
    if model_type in _MOE:  # Llama-style attention, experts in place of the MLP
        return _describe_moe(config, model_type)
    raise ValueError(
        f"no closed-form description for model_type {model_type!r}; supported: gpt2, "
        f"{', '.join(sorted(_LLAMA_LIKE | _BERT_LIKE | _MOE))}. estimate() plans any other "
        "model from a meta-device pass; torchfit.memory.trace(model, inputs) traces its step"
    )


def _describe_gpt2(config: Any) -> TransformerSpec:
    h, layers, vocab = config.n_embd, config.n_layer, config.vocab_size
    inner = config.n_inner or 4 * h
    positions = config.n_positions
    per_layer = 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + 2 * h + (h * inner + inner)
    per_layer += inner * h + h
    embeddings = vocab * h + positions * h
    linear = layers * (h * 3 * h + h * h + 2 * h * inner)
    return TransformerSpec(
        family=Family.GPT2,
        num_layers=layers,
        hidden=h,
        num_heads=config.n_head,
        num_kv_heads=config.n_head,
        head_dim=h // config.n_head,
        intermediate=inner,
        vocab=vocab,
        max_positions=positions,
        activation=str(config.activation_function),
        dropout=float(config.resid_pdrop),
        attention_dropout=float(config.attn_pdrop),
        tied_embeddings=True,
        sliding_window=None,
        qkv_bias=True,
        num_params=embeddings + layers * per_layer + 2 * h,
        linear_params=linear,
        embedding_params=embeddings,
        head_params=0,
        num_tensors=2 + 12 * layers + 2,
        model_type="gpt2",
    )


def _describe_llama(config: Any, model_type: str) -> TransformerSpec:
    h, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    heads = config.num_attention_heads
    kv_heads = _get(config, "num_key_value_heads", default=heads)
    head_dim = _get(config, "head_dim", default=h // heads)
    inner = config.intermediate_size
    qkv_bias = bool(_get(config, "attention_bias", default=model_type == "qwen2"))
    if model_type in {"qwen2", "qwen2_moe"}:
        qkv_bias = True  # Qwen2 always has Q/K/V biases (modeling_qwen2.py)
    o_bias = bool(_get(config, "attention_bias", default=False)) and model_type not in {
        "qwen2",
        "qwen2_moe",
    }
    mlp_bias = bool(_get(config, "mlp_bias", default=False))
    q_out, kv_out = heads * head_dim, kv_heads * head_dim
    attn = h * q_out + 2 * h * kv_out + q_out * h
    attn_bias = (q_out + 2 * kv_out if qkv_bias else 0) + (h if o_bias else 0)
    mlp = 3 * h * inner + (2 * inner + h if mlp_bias else 0)
    # OLMo's LayerNorms have no weights; Qwen3 normalizes each query and key head (RMSNorm)
    norm = 0 if model_type in LAYER_NORM_TYPES else h
    qk_norm = 2 * head_dim if model_type in QK_NORM_TYPES else 0
    per_layer = attn + attn_bias + mlp + 2 * norm + qk_norm
    tied = bool(_get(config, "tie_word_embeddings", default=False))
    head = 0 if tied else vocab * h
    tensors_per_layer = 4 + 3 + (2 if norm else 0) + (3 if qkv_bias else 0) + (1 if o_bias else 0)
    tensors_per_layer += (3 if mlp_bias else 0) + (2 if qk_norm else 0)
    if model_type == "phi3":
        tensors_per_layer -= 3  # fused qkv_proj (one tensor for three) and gate_up_proj
    window = _get(config, "sliding_window")
    use_window = bool(_get(config, "use_sliding_window", default=window is not None))
    return TransformerSpec(
        family=Family.LLAMA,
        num_layers=layers,
        hidden=h,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=inner,
        vocab=vocab,
        max_positions=config.max_position_embeddings,
        activation=str(_get(config, "hidden_act", default="silu")),
        dropout=0.0,
        attention_dropout=float(_get(config, "attention_dropout", default=0.0)),
        tied_embeddings=tied,
        sliding_window=int(window) if window and use_window else None,
        qkv_bias=qkv_bias,
        num_params=vocab * h + layers * per_layer + norm + head,
        linear_params=layers * (attn + 3 * h * inner),
        embedding_params=vocab * h,
        head_params=head,
        num_tensors=1 + layers * tensors_per_layer + (1 if norm else 0) + (0 if tied else 1),
        model_type=model_type,
    )


def _describe_bert(config: Any, model_type: str) -> TransformerSpec:
    h, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    inner = config.intermediate_size
    positions = config.max_position_embeddings
    types = _get(config, "type_vocab_size", default=2)
    embeddings = vocab * h + positions * h + types * h
    per_layer = 4 * (h * h + h) + 2 * h + (h * inner + inner) + (inner * h + h) + 2 * h
    # BertForMaskedLM head: transform dense + LayerNorm, decoder tied to the embedding + bias
    head = (h * h + h) + 2 * h + vocab
    return TransformerSpec(
        family=Family.BERT,
        num_layers=layers,
        hidden=h,
        num_heads=config.num_attention_heads,
        num_kv_heads=config.num_attention_heads,
        head_dim=h // config.num_attention_heads,
        intermediate=inner,
        vocab=vocab,
        max_positions=positions,
        activation=str(config.hidden_act),
        dropout=float(config.hidden_dropout_prob),
        attention_dropout=float(config.attention_probs_dropout_prob),
        tied_embeddings=True,
        sliding_window=None,
        qkv_bias=True,
        num_params=embeddings + 2 * h + layers * per_layer + head,
        linear_params=layers * (4 * h * h + 2 * h * inner) + h * h,
        embedding_params=embeddings,
        head_params=head,
        num_tensors=5 + 16 * layers + 5,
        model_type=model_type,
    )


def _sparse_layers(config: Any) -> list[bool]:
    """Which layers route to experts (Qwen: ``mlp_only_layers``, ``decoder_sparse_step``)."""
    dense = set(_get(config, "mlp_only_layers", default=[]) or [])
    step = int(_get(config, "decoder_sparse_step", default=1) or 1)
    return [
        layer not in dense and (layer + 1) % step == 0 for layer in range(config.num_hidden_layers)
    ]


def _describe_moe(config: Any, model_type: str) -> TransformerSpec:
    """Mixtral, Qwen2-MoE, Qwen3-MoE: a Llama spec with experts in the sparse layers.

    Per sparse layer: the router (``num_experts x h``, an ``nn.Linear``), the experts'
    ``gate_up_proj`` and ``down_proj`` (3D parameters, ``3 h i`` per expert) and, for
    Qwen2-MoE, a shared SwiGLU expert and its one-unit sigmoid gate.
    """
    h = config.hidden_size
    experts = int(_get(config, "num_local_experts", "num_experts"))
    expert_i = int(_get(config, "moe_intermediate_size", default=config.intermediate_size))
    shared_i = int(_get(config, "shared_expert_intermediate_size", default=0))
    sparse = _sparse_layers(config)
    n_sparse = sum(sparse)
    dense = _describe_llama(config, model_type)  # every layer with a dense MLP
    dense_mlp = 3 * h * dense.intermediate
    expert_params = experts * 3 * h * expert_i
    router = experts * h
    shared = (3 * h * shared_i + h) if shared_i else 0
    moe_layer = expert_params + router + shared
    tensors = 1 + 2 + (4 if shared_i else 0) - 3  # router, two expert tensors, shared - MLP
    return dataclasses.replace(
        dense,
        intermediate=expert_i,
        num_params=dense.num_params + n_sparse * (moe_layer - dense_mlp),
        linear_params=dense.linear_params + n_sparse * (router + shared - dense_mlp),
        num_tensors=dense.num_tensors + n_sparse * tensors,
        moe=MoESpec(
            num_experts=experts,
            top_k=int(config.num_experts_per_tok),
            expert_intermediate=expert_i,
            shared_intermediate=shared_i,
            sparse_layers=n_sparse,
            dense_intermediate=dense.intermediate,
            expert_params=expert_params,
            normalized=model_type == "mixtral" or bool(_get(config, "norm_topk_prob")),
        ),
    )
