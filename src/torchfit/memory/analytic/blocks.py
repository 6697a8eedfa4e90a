"""Saved-for-backward bytes of one transformer block, term by term.

Each term names a tensor autograd keeps (found with ``saved_tensors_hooks`` on
transformers' GPT-2, Llama and BERT blocks, torch 2.13) and its bytes per token. The
sums are checked against real allocations in ``tests/memory/test_estimator.py``.
"""

from __future__ import annotations

import dataclasses

from torchfit._core.units import DType
from torchfit.memory.analytic.arch import Family, TransformerSpec
from torchfit.memory.analytic.formulas import (
    FP32,
    INT64,
    AttentionImpl,
    attention_bytes,
    dropout_mask_bytes,
    keeps_linear_state,
)
from torchfit.memory.analytic.lora import BLOCK_ROLES, LoraSetup, is_fused, role_shapes

__all__ = [
    "BlockSettings",
    "Term",
    "block_terms",
    "head_terms",
    "inference_transient",
    "mlp_backward_width",
    "upcasts_logits",
]

# Activations whose transformers implementation is a chain of Python ops: every
# intermediate is saved (NewGELUActivation: 0.5*x*(1+tanh(c*(x+0.044715*x^3)))).
_SAVED_BY_ACTIVATION = {"gelu_new": 4, "gelu_fast": 3, "quick_gelu": 2}


@dataclasses.dataclass(frozen=True)
class Term:
    """One saved tensor (or group): a name and its bytes per token.

    ``pieces``: the group's tensors, bytes per token each (summing to ``per_token``), where
    the kernels allocate several apart; empty for one tensor, or a group split by name.
    """

    name: str
    per_token: float
    pieces: tuple[float, ...] = ()


def _pieces(name: str, *pieces: float) -> Term:
    """A `Term` of several tensors."""
    return Term(name, sum(pieces), tuple(pieces))


def _layer_norm(name: str, width: float) -> Term:  # its input, and its fp32 mean and rstd
    return _pieces(name, width, FP32, FP32)


@dataclasses.dataclass(frozen=True)
class BlockSettings:
    """What changes the saved tensors: dtype, attention kernel, dropout, device.

    ``frozen_base``: the model's own weights do not train (LoRA adapters do, beside every
    block Linear): autograd then keeps no tensor that only a weight's gradient needs, i.e.
    the normalized input an RMSNorm multiplies by its weight and the LM head's input
    (an adapter on every block Linear still saves those Linears' inputs). Measured on a
    4-layer Llama, bf16, rank-8 adapters: 9.7% over before, see tests/quantize/test_quantize.py.

    ``fp32_stream``: the embeddings and norms hold fp32 weights (autocast over fp32 weights,
    or a 4-bit base through PEFT's ``prepare_model_for_kbit_training``), so the residual
    stream and every norm's output are fp32. ``fp32_linear_outputs``: the block Linears
    give their input's dtype back (bitsandbytes' ``Linear4bit.forward`` ends with
    ``.to(inp_dtype)``), so over an fp32 stream the MLP's intermediates are fp32 too.
    ``head_trains``: over a frozen base, the head trains anyway (a ``modules_to_save`` copy).
    ``mean_keeps_input``: torch before 2.2, whose ``torch.mean`` keeps its input
    (`torchfit._core.torch_rules`): each RMSNorm keeps its fp32 square too.
    """

    dtype: DType
    attention: AttentionImpl
    device: str
    training: bool = True
    frozen_base: bool = False
    autocast: bool = False
    lora: LoraSetup | None = None
    inputs_kept: bool = False
    fp32_stream: bool = False
    fp32_linear_outputs: bool = False
    head_trains: bool = False
    mean_keeps_input: bool = False

    def keeps_input(self, *roles: str) -> bool:
        """Whether a Linear of these roles keeps its input for backward.

        A trained Linear keeps it for its weight's gradient; over a frozen base only an
        adapter without dropout does (its ``lora_A`` reads the input itself). With no
        `LoraSetup` a frozen base is taken to have adapters on every block Linear.
        ``inputs_kept``: every block Linear keeps its input anyway (bitsandbytes' 4-bit
        matmul before 0.43.2).
        """
        if not self.frozen_base or self.lora is None or self.inputs_kept:
            return True
        return self.lora.dropout == 0 and any(role in self.lora.roles for role in roles)

    def input_copies(self, *roles: str) -> int:
        """How many copies of one input the Linears of ``roles`` keep.

        They share their input, so one copy, except over an fp32 stream under autocast:
        autocast caches the 16-bit casts of weights only, so every Linear (or its adapter's
        ``lora_A``) casts the shared fp32 input again and keeps its own copy (measured with
        the tracer: q, k and v keep three).
        """
        kept = [role for role in roles if self.keeps_input(role)]
        if not kept:
            return 0
        return len(kept) if self.fp32_stream and self.autocast else 1

    def adapter_terms(self, spec: TransformerSpec) -> list[Term]:
        """What each adapter keeps: ``lora_B``'s input, and with dropout a mask and a copy."""
        roles = set() if self.lora is None else self.lora.roles & BLOCK_ROLES
        if not self.frozen_base or self.lora is None or not roles:
            return []
        e, lora = self.dtype.itemsize, self.lora
        shapes = role_shapes(spec)
        count, ranks = len(roles), sum(lora.rank_of(role) for role in roles)
        terms = [Term(f"LoRA: lora_B inputs ({count} adapters)", ranks * e)]
        if lora.dropout > 0:
            mask = dropout_mask_bytes(self.dtype, self.device)
            width = lora.dropout_width(shapes, roles)
            terms.append(Term("LoRA dropout: masks and dropped inputs", width * (mask + e)))
        if lora.dora:  # (m - 1) * base_result + m * lora_result keeps both outputs
            outputs = sum(shapes[role][1] for role in roles)
            terms.append(Term("DoRA: the base's and the adapter's outputs", 2 * outputs * e))
        return terms

    def rms_norm(self, spec: TransformerSpec, width: int) -> float:
        """The fp32 tensors a Llama RMSNorm over ``width`` keeps per token, ``rsqrt`` aside.

        The fp32 copy of its input (kept by ``pow``); before torch 2.2 also the fp32
        square ``mean`` reads (``mean_keeps_input``; a layer norm has no ``mean``).
        """
        return sum(self.rms_copies(spec, width))

    def rms_copies(self, spec: TransformerSpec, width: int) -> tuple[float, ...]:
        """`rms_norm`'s tensors, bytes per token each."""
        square = self.mean_keeps_input and spec.rms_norm
        return (width * FP32,) * (2 if square else 1)

    def rms_term(self, name: str, spec: TransformerSpec, normed: float) -> Term:
        """An RMSNorm's saved tensors: its fp32 input copies, ``rsqrt``, the ``normed`` output."""
        return _pieces(name, *self.rms_copies(spec, spec.hidden), FP32, normed)

    @property
    def residual(self) -> float:
        """Bytes per element of the residual stream: fp32 over fp32 embeddings and norms.

        With fp32 weights the embeddings are fp32 and each block adds its 16-bit output
        to them, which promotes the sum back to fp32; the norms read that fp32 stream.
        """
        return FP32 if self.fp32_stream else self.dtype.itemsize

    @property
    def mlp_itemsize(self) -> float:
        """Bytes per element of the MLP's projections and activation (`fp32_linear_outputs`)."""
        return FP32 if self.fp32_stream and self.fp32_linear_outputs else self.dtype.itemsize


def _dropout(spec_p: float, s: BlockSettings) -> float:
    return dropout_mask_bytes(s.dtype, s.device) if s.training and spec_p > 0 else 0.0


def _attention_per_token(
    spec: TransformerSpec, seq_len: int, s: BlockSettings, *, dropout: float
) -> float:
    """`attention_bytes` of one sequence of this block's attention, per token."""
    # Llama-style eager attention upcasts the scores itself (softmax(..., dtype=float32)
    # then .to(query.dtype)), and CUDA autocast runs softmax in fp32 for every family
    # (the fp32_set_opt_dtype list of aten/src/ATen/autocast_mode.h).
    fp32_softmax = (s.autocast and s.device == "cuda") or (
        spec.family is Family.LLAMA and s.dtype.itemsize < FP32
    )
    whole = attention_bytes(
        batch_size=1,
        seq_len=seq_len,
        num_heads=spec.num_heads,
        head_dim=spec.head_dim,
        dtype=s.dtype,
        implementation=s.attention,
        training=s.training,
        dropout=dropout,
        num_kv_heads=spec.num_kv_heads,
        device=s.device,
        fp32_softmax=fp32_softmax,
    )
    return whole / seq_len


def _core(spec: TransformerSpec, seq_len: int, s: BlockSettings) -> list[Term]:
    p = spec.attention_dropout if s.training else 0.0
    per_token = _attention_per_token(spec, seq_len, s, dropout=p)
    terms = [Term(f"attention ({s.attention.value})", per_token)]
    flash = keeps_linear_state(s.attention, device=s.device, training=s.training, dropout=p)
    if flash and s.device == "cpu" and spec.family is Family.GPT2 and s.training:
        # GPT-2's fused c_attn output stays alive (Q/K/V are views of it) and the CPU
        # flash kernel keeps two contiguous copies: measured 6h per token, not 4h.
        terms.append(Term("fused QKV storage kept by views", 2 * spec.hidden * s.dtype.itemsize))
    return terms


def _output_copied(spec: TransformerSpec, s: BlockSettings) -> bool:
    """Whether the output projection's input is a copy of the attention's output.

    transformers hands the attention output to ``o_proj`` (GPT-2's ``c_proj``, BERT's
    output dense) as ``attn_output.transpose(1, 2).contiguous()``. CUDA's fused SDPA
    kernels (flash, memory-efficient) allocate their output as (batch, seq, heads,
    head_dim) and return it transposed (``_scaled_dot_product_flash_attention`` and its
    meta registration in torch/_meta_registrations.py), so that ``contiguous()`` is a
    view and the projection keeps the attention's own saved output: on an H200 the closed
    form counted it twice (+1.5% on a Llama-3.2-1B bf16 step, +1.8% on GPT-2 fp32,
    against -0.1% and -0.2% from the traced step). Eager attention, SDPA's math fallback
    and the CPU flash kernel (whose output is (batch, heads, seq, head_dim)) make a copy.
    """
    if s.attention is AttentionImpl.EAGER or s.device != "cuda":
        return True
    grouped = s.dtype.itemsize == FP32 and spec.num_kv_heads < spec.num_heads
    dropout = spec.attention_dropout if s.training else 0.0
    fused = keeps_linear_state(
        s.attention, device=s.device, training=s.training, dropout=dropout, fp32_grouped=grouped
    )
    return not fused


def _qk_norm(spec: TransformerSpec, s: BlockSettings) -> float:
    """What Qwen3's per-head RMSNorms of the queries and keys keep, per token (0 without).

    Each is Llama's RMSNorm over one head: the fp32 copy of its input (the projection's
    output, kept by ``pow``), one fp32 ``rsqrt`` per head, and for the weight's gradient
    the normalized input in the compute dtype. Measured with the CUDA-target trace of
    Qwen3 against Qwen2 (same sizes): 2,600 bytes per token and layer in fp32, 1,960 in
    bf16, for 8 query and 2 key heads of 32.
    """
    if not spec.qk_norm:
        return 0
    q, k = spec.num_heads * spec.head_dim, spec.kv_dim
    normalized = 0 if s.frozen_base else (q + k) * s.dtype.itemsize
    heads = spec.num_heads + spec.num_kv_heads
    return s.rms_norm(spec, q + k) + heads * FP32 + normalized


def _activation(spec: TransformerSpec, s: BlockSettings) -> float:
    """What the MLP's activation keeps, per token.

    gelu_new is a chain of Python ops. Under CUDA autocast ``pow`` runs in fp32 (its
    list in aten/src/ATen/autocast_mode.h) and the chain promotes to fp32 from there:
    ``pow`` keeps an fp32 copy of its input, ``tanh`` its fp32 output, the last ``mul``
    the 16-bit ``0.5 * x`` and the fp32 ``1 + tanh`` (measured with a CUDA-target trace).
    """
    e, i = s.mlp_itemsize, spec.intermediate
    if spec.activation == "gelu_new" and s.autocast and s.device == "cuda" and e < FP32:
        return (3 * FP32 + e) * i
    return _SAVED_BY_ACTIVATION.get(spec.activation, 1) * i * e


def block_terms(spec: TransformerSpec, seq_len: int, s: BlockSettings) -> list[Term]:
    """Saved tensors of one block, per token, for training."""
    e, h, i = s.dtype.itemsize, spec.hidden, spec.intermediate
    drop = _dropout(spec.dropout, s)
    copied = _output_copied(spec, s)
    if spec.family is Family.GPT2:
        return [
            _layer_norm("ln_1 input + mean/rstd", h * s.residual),
            Term("c_attn input", h * e if s.keeps_input("qkv") else 0),
            *_core(spec, seq_len, s),
            Term("c_proj input", h * e if s.keeps_input("o") and copied else 0),
            _pieces("dropout masks (attn, mlp)", h * drop, h * drop),
            _layer_norm("ln_2 input + mean/rstd", h * s.residual),
            Term("c_fc input", h * e if s.keeps_input("fc") else 0),
            Term(f"{spec.activation} intermediates", _activation(spec, s)),
            Term("mlp c_proj input", i * e if s.keeps_input("down") else 0),
            *s.adapter_terms(spec),
        ]
    if spec.family is Family.LLAMA:
        # RMSNorm: fp32 copy of the input, rsqrt, the normalized input before the weight
        # (kept for the weight's gradient only)
        normed = 0 if s.frozen_base else h * s.residual
        # Phi-3 reads the normed input once for q/k/v and once for gate/up (fused Linears)
        fused = is_fused(spec)
        qkv, gate_up = (("qkv",), ("gate_up",)) if fused else (("q", "k", "v"), ("gate", "up"))
        return [
            s.rms_term("input RMSNorm", spec, normed),
            _pieces("q/k/v input", *(h * e,) * s.input_copies(*qkv)),
            Term("q/k per-head RMSNorm", _qk_norm(spec, s)),
            *_core(spec, seq_len, s),
            Term("o_proj input", h * e if s.keeps_input("o") and copied else 0),
            s.rms_term("post-attention RMSNorm", spec, normed),
            _pieces("gate/up input", *(h * e,) * s.input_copies(*gate_up)),
            Term("SwiGLU: gate, act(gate), up", 3 * i * s.mlp_itemsize),
            Term("down_proj input (the product)", i * e if s.keeps_input("down") else 0),
            *s.adapter_terms(spec),
        ]
    act = _SAVED_BY_ACTIVATION.get(spec.activation, 1)
    return [
        _pieces("q/k/v input", *(h * e,) * s.input_copies("q", "k", "v")),
        *_core(spec, seq_len, s),
        Term("attention output input", h * e if s.keeps_input("o") and copied else 0),
        Term("dropout masks", 2 * h * drop),
        Term("LayerNorm inputs + mean/rstd", 2 * (h * s.residual + 2 * FP32)),
        Term("intermediate input", h * e if s.keeps_input("fc") else 0),
        Term(f"{spec.activation} input", act * i * e),
        Term("output dense input", i * e if s.keeps_input("down") else 0),
        *s.adapter_terms(spec),
    ]


def upcasts_logits(spec: TransformerSpec, dtype: DType) -> bool:
    """Whether the causal-LM loss makes an fp32 copy of 16-bit logits (``logits.float()``).

    transformers' ``ForCausalLMLoss`` (GPT-2 and Llama heads) upcasts them before the
    log-softmax; fp32 logits need no copy (`loss_bytes` for what the loss keeps).
    """
    return spec.family in {Family.GPT2, Family.LLAMA} and dtype.itemsize < FP32


def loss_bytes(spec: TransformerSpec, s: BlockSettings) -> tuple[Term, float]:
    """The cross-entropy's saved tensor and its gradients at the start of backward, per token.

    GPT-2 and Llama heads in transformers upcast the logits (``logits.float()``, the
    ``ForCausalLMLoss`` path): the log-softmax is fp32, and its backward holds two fp32
    gradients (nll_loss's and log_softmax's). A masked LM hands its logits to
    ``nn.CrossEntropyLoss`` as they are: log_softmax runs in the logits' own dtype
    (aten/src/ATen/native/LossNLL.cpp, ``cross_entropy_loss``); under CUDA autocast only
    ``nll_loss`` is cast to fp32, so a 16-bit log-softmax and its fp32 copy are kept and
    the copy is freed before log_softmax's backward (measured on an H200: a BERT MLM fp16
    step held exactly those three at its peak). CPU autocast casts ``cross_entropy_loss``
    as a whole to fp32: the fp32 path. Returns the saved `Term` and the bytes of gradients
    alive with it, both per token.
    """
    v, e = spec.vocab, s.dtype.itemsize
    upcast = s.autocast and s.device != "cuda"
    if spec.family in {Family.GPT2, Family.LLAMA} or e == FP32 or upcast:
        return Term("log-softmax of the logits (fp32)", v * FP32), 2 * v * FP32
    if s.autocast:
        saved = Term("log-softmax of the logits, and nll_loss's fp32 copy", v * (e + FP32))
        return saved, v * FP32
    return Term("log-softmax of the logits", v * e), 2 * v * e


def head_terms(spec: TransformerSpec, s: BlockSettings) -> list[Term]:
    """Embedding and head tensors saved for training, per token (and the loss's, `loss_bytes`).

    The input ids themselves are the caller's tensor (counted once, as an input).
    """
    e, h = s.dtype.itemsize, spec.hidden
    drop = _dropout(spec.dropout, s)
    logits = loss_bytes(spec, s)[0]
    # saved for the head's weight gradient only
    head_input = 0 if s.frozen_base and not s.head_trains else h * e
    if spec.family is Family.GPT2:
        return [
            Term("embedding dropout mask", h * drop),
            _layer_norm("ln_f input + mean/rstd", h * e),
            Term("lm_head input", head_input),
            logits,
            Term("labels", INT64),
        ]
    if spec.family is Family.LLAMA:
        return [
            s.rms_term("final RMSNorm", spec, head_input),
            Term("lm_head input", head_input),
            logits,
            Term("labels", INT64),
        ]
    return [
        Term("token type ids", INT64),
        Term("embedding LayerNorm + dropout", h * e + 2 * FP32 + h * drop + (h * e if drop else 0)),
        Term("MLM transform (dense, act, LayerNorm inputs)", 3 * h * e + 2 * FP32),
        Term("decoder input", head_input),
        logits,
    ]


def mlp_backward_width(spec: TransformerSpec) -> float:
    """Gradients alive at once in an MLP's backward, in units of intermediate-width elements.

    SwiGLU: the gradients of the gate, the up projection and the activation; GELU-style
    MLPs: one per saved intermediate of the activation (measured with the tracer on
    1-layer GPT-2s: gelu_new's backward holds 3.5 to 4.4 i-wide tensors at its peak).
    """
    if spec.family is Family.LLAMA:
        return 3.0 * spec.intermediate
    return float(_SAVED_BY_ACTIVATION.get(spec.activation, 1) * spec.intermediate)


def inference_transient(
    spec: TransformerSpec, seq_len: int, s: BlockSettings, *, batch_size: int = 1
) -> float:
    """Largest set of tensors alive at once inside one block at inference, per token."""
    e, h, i = s.dtype.itemsize, spec.hidden, spec.intermediate
    core = _attention_per_token(spec, seq_len, dataclasses.replace(s, training=False), dropout=0.0)
    # Kept by the model's forward for its whole duration (measured with the tracer,
    # transformers 5.25): GPT-2 holds its token embeddings and its position embeddings (one
    # row of positions for the batch) as locals, Llama the input embeddings; BERT's
    # embedding module returns its LayerNorm's output alone (a 1-layer BERT at 128 tokens:
    # 2 s^2 + 4.1 h per token at its attention peak).
    held = {Family.LLAMA: 1.0, Family.BERT: 0.0}.get(spec.family, 1 + 1 / batch_size)
    embeddings = held * h * e
    attention_phase = 2 * h * e + 3 * h * e + core  # residual, normed, q/k/v, core
    if spec.family is Family.LLAMA:
        mlp_width = 3 * i * e  # gate, up, act(gate) before the product
    else:  # the MLP input plus the activation's intermediates (gelu_new: a chain of four)
        mlp_width = (1 + _SAVED_BY_ACTIVATION.get(spec.activation, 1)) * i * e
    # Eager attention returns its probabilities, which the block holds until it returns:
    # one b·a·s² tensor stays alive through the MLP.
    eager = s.attention is AttentionImpl.EAGER
    probabilities = spec.num_heads * seq_len * e if eager else 0
    mlp_phase = 2 * h * e + mlp_width + probabilities
    return embeddings + max(attention_phase, mlp_phase)
