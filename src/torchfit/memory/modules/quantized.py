"""A bitsandbytes 4/8-bit base in the meta-device pass, for any transformers architecture.

A model without a closed form (Falcon, GPTBigCode, BLOOM, T5, ...) is run on the meta
device in its compute dtype (`by_meta_pass`), as a 16-bit model would be: what bitsandbytes'
matmuls save for backward is what a frozen 16-bit Linear saves (bitsandbytes 0.43.2 and
later). This module puts in place of the 16-bit weights what bitsandbytes holds:

* the layers transformers hands to bitsandbytes: every ``nn.Linear`` and transformers
  ``Conv1D`` outside transformers' default skip list (the output head, tied embeddings,
  the module of the last parameter, ``_keep_in_fp32_modules``), each in bitsandbytes'
  layout with the closed form's rule (`torchfit.memory.analytic.quantized.linear_bytes`);
  ``quantize_head`` adds the head;
* every other parameter in the compute dtype, as the closed form counts it, and the
  adapters in fp32 under mixed precision;
* on CUDA, as the closed form adds it, the copy of the largest 4-bit weight that
  ``MatMul4Bit`` dequantizes for one matmul (`bitsandbytes_transients`).
"""

from __future__ import annotations

import functools
import importlib.metadata
import math
from typing import Any

import torch
from torch import nn

from torchfit._bnb.layout import keeps_4bit_input
from torchfit._bnb.selection import default_skip, is_linear, out_in, skip_matches
from torchfit._core.step import Mode, parse_mode
from torchfit._core.units import DType, parse_dtype
from torchfit.memory.analytic.quantized import (
    bitsandbytes_transients,
    check_quantize_head,
    linear_bytes,
    with_loading,
)
from torchfit.memory.modules.adapters import with_adapters
from torchfit.memory.modules.configs import by_meta_pass, meta_model, pass_sequence
from torchfit.memory.result import MemoryEstimate

__all__ = [
    "keep_linear_inputs",
    "meta_quantized_weight_bytes",
    "quantized_linears",
    "quantized_meta_pass",
]


class _SavedInput(torch.autograd.Function):
    """Identity that saves its input for backward, as ``MatMul4Bit`` did before 0.43.2."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x.view_as(x)

    @staticmethod
    def backward(_ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


def keep_linear_inputs(model: nn.Module, *, names: frozenset[str]) -> None:
    """Make the Linears of ``model`` named in ``names`` save their input for backward.

    bitsandbytes before 0.43.2 saved a 4-bit layer's input in ``MatMul4Bit.forward``
    (``ctx.tensors = (A, B)``; PR #1270 removed it), where a frozen 16-bit Linear saves
    none. ``names`` are the base model's module names; in a PEFT copy the same layer is
    ``base_model.model.<name>`` or, adapted, its ``.base_layer``. ``model`` is changed in
    place: pass a copy (`by_meta_pass` hands it its adapted copy).

    Example:
        >>> net = nn.Sequential(nn.Linear(4, 3)).requires_grad_(False)
        >>> x = torch.ones(2, 4, requires_grad=True)
        >>> def saved_shapes():
        ...     shapes = []
        ...     pack = lambda t: shapes.append(tuple(t.shape)) or t
        ...     with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        ...         net(x)
        ...     return shapes
        >>> saved_shapes()  # the frozen weight only (transposed)
        [(4, 3)]
        >>> keep_linear_inputs(net, names=frozenset({"0"}))
        >>> saved_shapes()  # and the input
        [(2, 4), (4, 3)]
    """
    for name, module in model.named_modules():
        plain = name.removeprefix("base_model.model.").removesuffix(".base_layer")
        if plain in names and is_linear(module, subclasses=True):
            forward = module.forward
            module.forward = functools.partial(_with_saved_input, forward)


def _with_saved_input(forward: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    kept = _SavedInput.apply(x) if x.requires_grad else x  # type: ignore[no-untyped-call]
    return forward(kept, *args, **kwargs)


def quantized_linears(
    model: nn.Module, weights: DType, *, head: bool = False
) -> dict[str, tuple[int, int]]:
    """``{module name: (out_features, in_features)}`` of the layers bitsandbytes quantizes.

    ``model`` is a transformers model (on the meta device will do), without adapters.

    Raises:
        ValueError: ``head`` with a tied or missing output head, or nothing to quantize.
    """
    modules = dict(model.named_modules())
    hf: Any = model  # a transformers PreTrainedModel
    output = hf.get_output_embeddings()
    inputs = hf.get_input_embeddings()
    tied = output is not None and inputs is not None and output.weight is inputs.weight
    check_quantize_head(weights, head=head, tied=tied)
    skip = default_skip(model)
    # nn.Linear subclasses too, as transformers 4.x replaced them (5.x does not: the notes
    # say so, `_subclass_note`)
    found = {
        name: out_in(module)
        for name, module in modules.items()
        if name and is_linear(module) and not any(skip_matches(key, name) for key in skip)
    }
    if head:
        if output is None or not is_linear(output):
            raise ValueError(
                f"quantize_head=True, but {type(model).__name__} has no nn.Linear output "
                "head to quantize; drop quantize_head"
            )
        name = next(n for n, m in modules.items() if m is output)
        found[name] = out_in(output)
    if not found:
        raise ValueError(
            f"{type(model).__name__} has nothing bitsandbytes would quantize: every "
            f"nn.Linear/Conv1D is in transformers' skip list ({skip}); use dtype='bf16'"
        )
    return found


def meta_quantized_weight_bytes(
    model: nn.Module,
    weights: DType,
    compute: DType,
    *,
    double_quant: bool = True,
    head: bool = False,
    rest: DType | None = None,
) -> int:
    """Bytes of ``model``'s parameters once loaded with bitsandbytes ``weights``.

    The quantized layers (`quantized_linears`) in bitsandbytes' layout, their biases and
    every other parameter in ``compute``, each parameter once (tied ones share), as the
    closed form counts them. ``_keep_in_fp32_modules`` (T5's ``wo``) stay in ``compute``
    too: transformers 5 skips quantizing them but loads them in the checkpoint's bf16.
    Buffers are not counted (neither are they in the closed form or the 16-bit pass).
    ``rest``: the dtype of every parameter left unquantized (default ``compute``; fp32
    after PEFT's ``prepare_model_for_kbit_training``).
    """
    layers = quantized_linears(model, weights, head=head)
    quantized = {f"{name}.weight" for name in layers}
    others = sum(p.numel() for name, p in model.named_parameters() if name not in quantized)
    held = linear_bytes(layers.values(), weights, double_quant=double_quant)
    return held + math.ceil(others * (compute if rest is None else rest).itemsize)


def quantized_meta_pass(
    config: Any,
    *,
    weights: DType,
    seq_len: int | None,
    attention: str,
    adapters: dict[str, Any] | None,
    double_quant: bool,
    head: bool,
    bitsandbytes_version: str | None,
    base_dtype: DType | None = None,
    kbit_prepare: bool = False,
    bnb_compute_dtype: DType | None = None,
    checkpointing: bool = False,
    **options: Any,
) -> MemoryEstimate:
    """`by_meta_pass` with the base in bitsandbytes ``weights`` (``options["dtype"]`` computes).

    ``base_dtype``: the dtype the 4-bit weights were quantized from (default: the compute
    dtype), which bitsandbytes dequantizes them back to. ``bnb_compute_dtype``: the 4-bit
    layers' own compute dtype in inference, where it is not the model's (`layer_copies`).

    ``kbit_prepare``: the base went through PEFT's ``prepare_model_for_kbit_training``
    (`torchfit.memory.analytic.kbit`): every unquantized parameter counts in fp32, and under
    autocast the fp32 head's 16-bit copy is alive at the start of backward, as in the
    closed form. The pass itself runs in the compute dtype, so its activations are those
    of a 16-bit stream (the closed form's fp32 stream is not modelled here).

    Training without adapters assumes PEFT's default LoRA, as the closed form does.

    With a bitsandbytes before 0.43.2, a training step's 4-bit Linears keep their inputs
    for backward (`keep_linear_inputs`).

    Raises:
        ValueError: see `quantized_linears`.
    """
    compute = parse_dtype(options["dtype"])
    training = parse_mode(options["mode"]) is Mode.TRAIN
    notes: list[str] = []
    if training and adapters is None:
        adapters = {}
    base = meta_model(config, attention)
    layers = quantized_linears(base, weights, head=head)
    prepare = None
    if training and weights.bits == 4 and keeps_4bit_input(bitsandbytes_version):
        prepare = functools.partial(keep_linear_inputs, names=frozenset(layers))
        notes.append("bitsandbytes before 0.43.2: every 4-bit Linear keeps its input for backward")
    found = by_meta_pass(
        config,
        seq_len=seq_len,
        attention=attention,
        adapters=adapters,
        prepare=prepare,
        checkpointing=checkpointing,
        fp32_stream=training and kbit_prepare,  # prepared: fp32 embeddings and norms
        **options,
    )
    trainable = 0
    if adapters is not None:
        wrapped = with_adapters(base, **adapters)
        trainable = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
        if not adapters:
            lora: Any = getattr(wrapped, "peft_config", {})["default"]
            notes.append(
                f"{weights.value} weights train through adapters: assumed PEFT's default "
                f"LoRA, r={lora.r} on {', '.join(sorted(lora.target_modules))} (set "
                "lora_rank=/lora_targets=)"
            )
    mixed = compute.autocasts(mixed=options.get("mixed_precision"), training=training)
    prepared = training and kbit_prepare
    rest = DType.FP32 if prepared else compute
    held = meta_quantized_weight_bytes(
        base, weights, compute, double_quant=double_quant, head=head, rest=rest
    ) + math.ceil(trainable * compute.master(mixed=mixed).itemsize)
    nested = "" if weights is DType.INT8 else (" + double quant" if double_quant else "")
    why = " (peft.prepare_model_for_kbit_training)" if prepared else ""
    notes.append(
        f"{len(layers)} Linear layers{' (the head too)' if head else ''} in "
        f"{weights.value}{nested} (bitsandbytes' layout); embeddings, norms, biases"
        f"{'' if head else ', head'} in {rest.value}{why}"
    )
    notes += _subclass_note(base, layers)
    found = found.replace(weights=held, notes=_restated(found.notes, trainable))
    copy = _head_copy(base, compute, prepared=prepared and mixed, quantized_head=head)
    if copy and not found.in_optimizer_step:
        found = found.replace(overhead=found.overhead + copy)
        notes.append(f"the fp32 head's {compute.value} autocast copy ({copy:,} bytes) kept")
    loading = 0
    if options.get("device") == "cuda":
        decoding = found.peak_at == "last decoding step"
        rows = options["batch_size"] * (1 if decoding else pass_sequence(config, seq_len))
        loading, copy, _ = bitsandbytes_transients(
            layers.values(),
            weights,
            compute,
            base=base_dtype,
            version=bitsandbytes_version,
            rows=None if training else rows,
            decode_rows=None,
            notes=notes,
            matmul=bnb_compute_dtype,
        )
        if not training:
            found = found.replace(activations=found.activations + copy)
        elif not found.in_optimizer_step:
            found = found.replace(workspace=found.workspace + copy)
    if weights is DType.INT8:
        notes.append(
            "LLM.int8: nothing added for bitsandbytes' matmul (as in the closed form): not "
            "its int8/fp16 copies of the input, nor the 16-bit weight copy its backward makes"
        )
    return with_loading(found.replace(notes=(*found.notes, *notes)), loading)


def _head_copy(model: nn.Module, compute: DType, *, prepared: bool, quantized_head: bool) -> int:
    """Bytes of the 16-bit copy autocast makes of a prepared (fp32) head for ``F.linear``."""
    hf: Any = model  # a transformers PreTrainedModel
    output = hf.get_output_embeddings()
    if not prepared or quantized_head or output is None or compute.bits != 16:
        return 0
    weight: torch.Tensor = output.weight
    return math.ceil(weight.numel() * compute.itemsize)


def _restated(notes: tuple[str, ...], trainable: int) -> tuple[str, ...]:
    """The pass's notes, its note on the model states said of the adapters (or dropped)."""
    kept = []
    for note in notes:
        if note.startswith("weights in "):  # inference: the quantized note says it
            continue
        if note.startswith(("mixed precision: fp32 weights", "weights, gradients and optim")):
            if not trainable:
                continue
            note = f"adapters ({trainable:,} parameters): {note}"  # noqa: PLW2901
        kept.append(note)
    return tuple(kept)


def _subclass_note(model: nn.Module, layers: dict[str, tuple[int, int]]) -> list[str]:
    """Say so when subclasses of nn.Linear are counted quantized (transformers 5 skips them)."""
    modules = dict(model.named_modules())
    kinds = sorted(
        {type(modules[n]).__name__ for n in layers if type(modules[n]) is not nn.Linear}
        - {"Conv1D"}
    )
    version = importlib.metadata.version("transformers")
    if not kinds or int(version.split(".")[0]) < 5:
        return []
    note = (
        f"{', '.join(kinds)} layers counted quantized, as transformers 4.x replaces every "
        f"nn.Linear; transformers {version} replaces the exact class only and would load "
        "them unquantized"
    )
    return [note]
