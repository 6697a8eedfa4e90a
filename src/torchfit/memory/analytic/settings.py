"""`BlockSettings`: what changes the tensors a transformer block saves for backward.

The dtype, the attention kernel, the device, training or not, a frozen base with LoRA
adapters, an fp32 residual stream; read by the block's terms (`torchfit.memory.analytic.
blocks`), its attention's (`torchfit.memory.analytic.attention_terms`) and the outlines.
"""

from __future__ import annotations

import dataclasses

from torchfit._core.units import DType
from torchfit.memory.analytic.arch import TransformerSpec
from torchfit.memory.analytic.formulas import FP32, AttentionImpl, dropout_mask_bytes
from torchfit.memory.analytic.lora import BLOCK_ROLES, LoraSetup, role_shapes
from torchfit.memory.analytic.term import Term, pieces

__all__ = ["BlockSettings"]


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
    ``fp32_logits``: the loop casts the logits to fp32 before the loss (Lightning
    Fabric's ``convert_output``): the loss runs, and saves, in fp32.
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
    fp32_logits: bool = False

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
        return pieces(name, *self.rms_copies(spec, spec.hidden), FP32, normed)

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
