"""A transformers language model without a closed form, on CUDA: its step traced.

`torchfit.estimate` gives the Llama-style decoders, GPT-2 and the BERT-style encoders
closed forms. Every other architecture (Gemma 2 and 3, GPT-NeoX, OLMo 2, Falcon, T5, ...)
had only the meta-device pass (`torchfit.memory.modules.configs`), which sees what
autograd saves layer by layer but not CUDA's kernels: autocast's casts and the ops it
runs in fp32 (the softmax and the final logit soft-capping of Gemma 2, the fp32
RMSNorms), the fused attention's layout and its backward's accumulators, the reduction
buffers, and the exact order of allocations the caching allocator sees. Against the
CUDA-target trace of the same step (torch 2.13, transformers 5.25) the pass was 7% to
11% low on the allocated peak of Gemma 2, Gemma 3, GPT-NeoX and OLMo 2 under bf16
autocast, and 9% to 18% low on reserved bytes under checkpointing, where the closed
forms are within 1% of the same trace. That trace is the estimator whose events matched
an H200's ``max_memory_reserved`` within 0.2% on every traced transformer step.

So on ``device="cuda"`` a step of such a model is traced: the model is built
on the meta device from its config, in the dtypes the step holds its weights in (fp32
masters under autocast; a LoRA base in its own dtype, the adapters in fp32 as PEFT's
``autocast_adapter_dtype`` keeps them), with PEFT's adapters and transformers'
checkpointing where the step asks, and `traced_step` runs it on fake tensors; an
inference forward keeps its output, the KV cache reported apart. For the forwards the
pass's allocated bytes were right, but its reserved bytes (no events to replay) were 4%
to 13% low on Gemma 2 shapes. What the trace cannot run (a 4/8-bit base, a chunked loss,
``generate``, an op that reads a tensor's value) keeps the meta-device pass.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from torchfit._core.units import DType
from torchfit.memory.catalog.build import checkpointing_on
from torchfit.memory.catalog.inputs import example_batch
from torchfit.memory.modules.adapters import with_adapters
from torchfit.memory.modules.configs import cache_apart, meta_model, pass_sequence
from torchfit.memory.result import MemoryEstimate
from torchfit.memory.step import Step
from torchfit.memory.step.run import loop_alone
from torchfit.memory.tracing.tracer import traced_step

__all__ = ["traceable", "traced_language_step"]


def traceable(step: Step) -> bool:
    """Whether ``step`` of a model without a closed form is traced (else: meta pass)."""
    return (
        step.device == "cuda"
        and step.max_new_tokens is None
        and not step.numerics.weights.is_quantized
        and step.loss_chunk_size is None
        and step.trainable_params is None
        and not step.frozen_base
    )


#: Traced steps by (config, step, adapters, frozen dtype): a plan asks for the same step
#: more than once (its own step, then advice that lands on a size the search asked).
_TRACED: dict[str, MemoryEstimate] = {}
_KEEP = 32


def traced_language_step(
    config: Any,
    step: Step,
    *,
    adapters: dict[str, Any] | None,
    frozen: DType | None,
) -> MemoryEstimate:
    """``step`` of the model ``config`` describes, traced on fake tensors under CUDA's rules.

    A step traced before (same config, step, adapters and frozen dtype) is not traced again:
    estimates are immutable, so the earlier one is returned.

    Args:
        config: A transformers config without a closed form.
        step: A step on ``device="cuda"`` that `traceable` accepts.
        adapters: LoRA arguments of `with_adapters` (lora, rank, targets, dropout), or None.
        frozen: The dtype a LoRA base keeps under autocast (its checkpoint's), or None.

    Raises:
        ValueError: PEFT cannot place the adapters, or ``seq_len`` is beyond the model.
        RuntimeError: The step cannot run on fake tensors (the caller falls back).
    """
    key = repr((config.to_json_string(use_diff=False), step, adapters, frozen))
    if key not in _TRACED:
        if len(_TRACED) >= _KEEP:
            _TRACED.pop(next(iter(_TRACED)))
        _TRACED[key] = _traced(config, step, adapters=adapters, frozen=frozen)
    return _TRACED[key]


def _traced(
    config: Any, step: Step, *, adapters: dict[str, Any] | None, frozen: DType | None
) -> MemoryEstimate:
    """`traced_language_step` without the memo."""
    attention = "eager" if step.attn_implementation == "eager" else "sdpa"
    base = meta_model(config, attention)
    model = copy.deepcopy(base)
    if adapters is not None:
        model = with_adapters(model, **adapters)
    _in_step_dtypes(model, step, frozen)
    # a training forward returns no KV cache: what checkpointing forces, and what the
    # closed forms and the GPU harness assume (the cache is an inference setting)
    cache = step.use_cache if not step.training else False
    if cache is not None:
        model.config.use_cache = cache
    if step.gradient_checkpointing:
        checkpointing_on(model)
    seq = pass_sequence(config, step.seq_len)
    batch = example_batch(model, batch_size=step.batch_size, seq_len=seq, training=step.training)
    # the built model carries what the step says of the model (adapters, dtypes, attention,
    # the cache); what it cannot carry (a 4/8-bit base, a chunked loss, generate) `traceable`
    # sent to the meta-device pass: the trace takes the loop only
    found = traced_step(model, batch, loop_alone(step))
    method = (
        f"method: the step of {type(base).__name__} built from its "
        f"config, traced on fake tensors (CUDA rules; no closed form for model_type "
        f"{config.model_type!r}); {seq} tokens per sample"
    )
    extra = []
    if adapters is not None:
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        extra.append(f"LoRA adapters placed by PEFT: {trainable:,} trainable parameters")
    found = found.replace(notes=(method, *found.notes, *extra))
    if not step.training and getattr(model.config, "use_cache", False):
        # the cache the forward returns, apart from the activations
        try:
            found = cache_apart(found, model, batch, step.compute)
        except RuntimeError:  # its meta forward reads a value (BART): the cache stays in
            note = "the KV cache is counted in the activations (not told apart for this model)"
            found = found.replace(notes=(*found.notes, note))
    return found


def _in_step_dtypes(model: torch.nn.Module, step: Step, frozen: DType | None) -> None:
    """Cast ``model``'s parameters (a copy) to the dtypes ``step`` holds them in."""
    master = torch.float32 if step.mixed else step.compute.torch_dtype
    base = master if frozen is None else frozen.torch_dtype
    for param in model.parameters():
        param.data = param.data.to(master if param.requires_grad else base)
