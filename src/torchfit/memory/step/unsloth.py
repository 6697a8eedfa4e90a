"""`unsloth_fields`: the `Step` fields of Unsloth's QLoRA recipe, as its README runs it.

Unsloth describes a run in code, not a config file; its README's example (unslothai/unsloth
``README.md`` at e3162dc, January 2025) is the recipe people copy, and its library code of
the same commit says what the calls do to memory:

- ``FastLanguageModel.from_pretrained(..., dtype=None, load_in_4bit=True)``: the weights
  in bf16 where the card has it (else fp16), the block Linears as bitsandbytes nf4 with
  double quantization and a compute dtype of that 16-bit type
  (``unsloth/models/llama.py``, its ``BitsAndBytesConfig``);
- ``get_peft_model(r=16, the seven projections, lora_dropout=0,
  use_gradient_checkpointing="unsloth")``: Unsloth's own ``prepare_model_for_kbit_training``
  (``unsloth/models/_utils.py``) casts the adapters to fp32 and leaves the embeddings,
  norms and head 16-bit (PEFT's casts them to fp32); the checkpoints go to CPU memory;
- ``TrainingArguments(per_device_train_batch_size=2, gradient_accumulation_steps=4,
  bf16/fp16 by the card, optim="adamw_8bit")`` and ``max_seq_length=2048``.

These are the README's values, which people change in their own copy: a field given to
``Step.from_recipe("unsloth", ...)`` replaces one. What torchfit does not model is said as
notes: the offloaded checkpoints and Unsloth's Triton kernels, both of which keep less on
the card than eager PyTorch (the estimate is an upper bound).
"""

from __future__ import annotations

from torchfit.memory.step.fields import FieldsRead, StepFields

__all__ = ["UNSLOTH_TARGETS", "unsloth_fields"]

#: The README's ``target_modules``.
UNSLOTH_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: The README's ``max_seq_length``.
_MAX_SEQ_LENGTH = 2048


def unsloth_fields(*, seq_len: int | None = None) -> StepFields:  # noqa: ARG001
    """The `Step` fields of Unsloth's README recipe (module notes).

    They are the README's defaults: a field the caller gives replaces one (``seq_len=``
    for your ``max_seq_length``, ``batch_size=``, ...). ``seq_len`` is taken for the
    readers' common signature.

    Example:
        >>> read = unsloth_fields()
        >>> read.fields["quantization"], read.fields["kbit_prepare"], read.fields["precision"]
        ('nf4', False, 'auto')
    """
    read = FieldsRead()
    read.set(
        "FastLanguageModel.from_pretrained(load_in_4bit=True): nf4, double quant",
        quantization="nf4",
        double_quant=True,
    )
    # bf16 = is_bfloat16_supported(), fp16 otherwise: what precision='auto' picks
    read.set("TrainingArguments(bf16/fp16 by the card)", precision="auto")
    read.set(
        "get_peft_model: Unsloth's prepare_model_for_kbit_training keeps the rest 16-bit",
        kbit_prepare=False,
    )
    read.set("get_peft_model(r=16)", lora_rank=16)
    read.set("get_peft_model(target_modules=[the seven projections])", lora_targets=UNSLOTH_TARGETS)
    read.set("get_peft_model(lora_dropout=0)", lora_dropout=0.0)
    read.set("use_gradient_checkpointing='unsloth'", gradient_checkpointing=True)
    read.set("TrainingArguments(optim='adamw_8bit')", optimizer="adamw-8bit")
    read.set("TrainingArguments(per_device_train_batch_size=2)", batch_size=2)
    read.set("TrainingArguments(gradient_accumulation_steps=4)", gradient_accumulation_steps=4)
    read.set(f"max_seq_length={_MAX_SEQ_LENGTH}", seq_len=_MAX_SEQ_LENGTH)
    read.set("the Trainer's compute_loss drops the outputs before backward", keep_output=False)
    read.notes.append(
        "use_gradient_checkpointing='unsloth' moves each layer's checkpoint to CPU memory; "
        "torchfit keeps them on the card (an upper bound)"
    )
    read.notes.append(
        "Unsloth's Triton kernels (RoPE, RMSNorm, SwiGLU, cross-entropy) keep less for "
        "backward than the eager ops torchfit counts (an upper bound)"
    )
    return read.done("Unsloth recipe", defaults=True)
