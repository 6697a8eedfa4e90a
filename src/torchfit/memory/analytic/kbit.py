"""A 4/8-bit base as PEFT's QLoRA recipe leaves it: ``prepare_model_for_kbit_training``.

PEFT's ``prepare_model_for_kbit_training`` (peft/utils/other.py), which the Hugging Face
QLoRA notebook and TRL's ``SFTTrainer`` (``_prepare_peft_model``) call before
``get_peft_model``, does four things to a bitsandbytes-loaded model:

1. freezes every parameter;
2. casts every parameter that is fp16 or bf16 and not a ``Params4bit`` to fp32: the
   embeddings, the norms, the LM head (tied or not), the biases of quantized Linears;
   the 4-bit and int8 weights stay as they are;
3. with ``use_gradient_checkpointing=True`` (its default) and ``use_reentrant`` left
   unset, ``model.enable_input_require_grads()``: the embedding's output requires grad,
   so the first block's input gets a gradient too (a ``tokens x hidden`` fp32 tensor
   at the end of backward, after the peak);
4. ``model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={})``: reentrant
   checkpointing (``torch.utils.checkpoint`` defaults to ``use_reentrant=True``).

What that changes in memory (measured on an H200 with torch 2.11, transformers 5.17,
peft 0.21, bitsandbytes 0.50.2, and with torchfit's CUDA-target trace of the same model):

- the non-quantized weights are fp32: the embedding and an untied head count 4 bytes a
  parameter (a Llama-3.1-8B's 128K-vocabulary embedding and head: 4.2 GB, not 2.1);
- the residual stream is fp32 (fp32 embeddings, norms with fp32 weights), so gradient
  checkpointing keeps fp32 block inputs, and ``Linear4bit.forward`` (bitsandbytes
  nn/modules.py) hands back its input's dtype (``matmul_4bit(...).to(inp_dtype)``): the
  q/k/v, gate, up and down projections give fp32, so SwiGLU's saved intermediates are
  fp32. Adapters still compute in the autocast dtype (each ``lora_A`` keeps its own
  16-bit cast of the fp32 input);
- under autocast the head's fp32 weight is cast to a 16-bit copy for ``F.linear``, and
  that copy is saved for the input's gradient until the head's backward (``vocab x
  hidden`` 16-bit bytes, alive at the loss). The logits themselves are 16-bit (autocast
  runs ``linear`` in the lower precision whatever the weight's dtype), and the loss
  upcasts them to fp32 as it does for a 16-bit head (transformers' ``ForCausalLMLoss``:
  ``logits.float()``), so the loss's own tensors do not change.
"""

from __future__ import annotations

from torchfit.memory.analytic.arch import TransformerSpec

__all__ = ["kbit_head_params"]


def kbit_head_params(spec: TransformerSpec, *, prepared: bool, quantized_head: bool) -> int:
    """Head parameters autocast copies to 16 bits in a QLoRA step: the fp32 head's.

    ``prepare_model_for_kbit_training`` leaves the head in fp32 (tied or not), and
    ``F.linear`` under autocast casts it and saves the copy; a 16-bit head (no prepare)
    needs no copy, and a quantized head is bitsandbytes' own matmul (none either).

    Example:
        >>> from transformers import LlamaConfig
        >>> from torchfit.memory.analytic.arch import spec_from_config
        >>> spec = spec_from_config(LlamaConfig(vocab_size=1000, hidden_size=64))
        >>> kbit_head_params(spec, prepared=True, quantized_head=False)
        64000
        >>> kbit_head_params(spec, prepared=False, quantized_head=False)
        0
    """
    return spec.vocab * spec.hidden if prepared and not quantized_head else 0
