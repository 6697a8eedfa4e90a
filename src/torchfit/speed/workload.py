"""One step as kernels: run it on fake tensors with an `OpRecorder`, add what is closed-form.

`record_workload` builds the model (`torchfit.speed.build`), adds PEFT's adapters when
LoRA is asked for, runs forward, loss and backward under the recorder (with CUDA's
autocast lists and fused attention, as `torchfit.memory.trace` runs a CUDA-target
step) and adds the kernels the fake step cannot show: the optimizer's
(`torchfit.speed.optimizer`) and a 4-bit base's dequantization before every matmul
that uses a quantized weight (bitsandbytes' ``dequantize_4bit`` in ``MatMul4Bit``'s
forward and again in its backward; gradient checkpointing's recomputation repeats the
forward's).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from torchfit._core.imports import require
from torchfit._core.outputs import call_model, compute_loss, outputs_in_fp32
from torchfit._core.step import OptimizerName
from torchfit._core.units import DType
from torchfit.memory.catalog.build import transformers_without_data
from torchfit.memory.kernels.autocast import cuda_autocast_on_cpu
from torchfit.memory.kernels.cuda import FusedSdpa
from torchfit.memory.modules.adapters import role_targets
from torchfit.memory.tracing.session import copy_to_fake, new_fake_mode
from torchfit.speed.build import Built
from torchfit.speed.ops import Op, OpKind, Phase, merge
from torchfit.speed.optimizer import implementation_of, optimizer_ops
from torchfit.speed.python_cost import python_hooks
from torchfit.speed.record import OpRecorder

__all__ = ["Workload", "hold_quantized_in", "record_workload"]

#: Bytes per weight a dequantization moves: the packed weight and its scales read, the
#: 16-bit copy written. nf4/fp4: 0.5 + 2 + one absmax byte per 64 (double quantization
#: stores them as uint8, plus a negligible second level); int8: 1 + 2 + a row scale.
_DEQUANT_BYTES = {DType.NF4: 0.5 + 2.0 + 1 / 64, DType.FP4: 0.5 + 2.0 + 1 / 64, DType.INT8: 3.0}
_HEADS = ("lm_head", "head", "classifier", "score", "cls.predictions.decoder")


@dataclasses.dataclass(frozen=True)
class Workload:
    """The kernels of one optimizer step and what they process.

    Attributes:
        ops: Kernel rows (`Op`), merged.
        samples: Samples per optimizer step (micro-batches included).
        tokens: Tokens per optimizer step, for language models; None otherwise.
        parameters: Parameters of the model (adapters included).
        trainable: Parameters that train.
        name: The model's name for tables.
        notes: What was modelled and how.
    """

    ops: tuple[Op, ...]
    samples: int
    tokens: int | None
    parameters: int
    trainable: int
    name: str
    notes: tuple[str, ...]


@contextlib.contextmanager
def _cuda_target(autocast: torch.dtype | None) -> Iterator[None]:
    """Fused SDPA, CUDA's autocast lists and fake-friendly experts, as `trace` uses them."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(FusedSdpa().installed())
        stack.enter_context(cuda_autocast_on_cpu())
        if "transformers" in sys.modules:
            stack.enter_context(transformers_without_data())
        if autocast is not None:
            stack.enter_context(torch.autocast("cpu", dtype=autocast))
        yield


def add_lora(built: Built, lora: Any) -> None:
    """Wrap ``built.module`` in PEFT's LoRA model for ``lora`` (a ``peft.LoraConfig``).

    Role names among the targets (LitGPT's and torchtune's ``"query"``, ``"mlp"``, ...)
    become the model's module names first, as the memory estimate reads them.
    """
    peft = require("peft", feature="timing LoRA adapters")
    targets = getattr(lora, "target_modules", None)
    if isinstance(targets, (list, tuple, set, frozenset)):
        lora = copy.copy(lora)  # the caller's config stays as it was
        names = sorted(targets) if isinstance(targets, (set, frozenset)) else list(targets)
        lora.target_modules = role_targets(built.module, names)
    try:
        with warnings.catch_warnings():
            # peft 0.21 reads transformers' deprecated `is_gradient_checkpointing`
            # (transformers 5: "use is_activation_checkpointing"): not the user's code
            warnings.filterwarnings("ignore", ".*is_gradient_checkpointing", FutureWarning)
            built.module = peft.get_peft_model(built.module, lora)
    except ValueError as e:  # PEFT's NoMatchingPeftModuleError and kin
        targets = getattr(lora, "target_modules", None)
        raise ValueError(
            f"lora_targets={targets!r} (the LoRA target modules): PEFT could not place them "
            f"on this model ({e}); name the model's Linear modules, e.g. 'q_proj,v_proj', "
            "or 'all-linear'"
        ) from e


def _quantized_linears(module: nn.Module, *, head: bool = False) -> list[nn.Module]:
    """The Linears bitsandbytes quantizes: block Linears and GPT-2's Conv1D.

    The output head too with ``head`` (``Step.quantize_head``: Lightning Fabric's
    ``BitsandbytesPrecision`` converts every Linear).
    """
    found: list[nn.Module] = []
    for name, sub in module.named_modules():
        linear = isinstance(sub, nn.Linear) or type(sub).__name__ == "Conv1D"
        if not linear or "lora_" in name:
            continue
        is_head = any(name.endswith(h) or f"{h}.base_layer" in name for h in _HEADS)
        if is_head and not head:
            continue
        found.append(sub)
    return found


def hold_quantized_in(module: nn.Module, dtype: torch.dtype, *, head: bool = False) -> None:
    """Give the weights bitsandbytes quantizes ``dtype``: what dequantization produces.

    ``Linear4bit`` casts its input to its compute dtype and multiplies by the
    dequantized weight in it (bitsandbytes ``nn/modules.py`` and ``MatMul4Bit``), so
    under autocast those weights need no cast, while everything left unquantized keeps
    the dtype it was built in.
    """
    for linear in _quantized_linears(module, head=head):
        linear.weight.data = linear.weight.data.to(dtype)


def _dequant_hooks(
    module: nn.Module,
    recorder: OpRecorder,
    weights: DType,
    matmul: torch.dtype | None,
    *,
    head: bool,
) -> list[Any]:
    # dequantized into a wider compute dtype, the copy written is that much wider
    wider = 0.0 if matmul is None else max(torch.finfo(matmul).bits // 8 - 2, 0)
    per_weight = _DEQUANT_BYTES[weights] + wider
    handles = []
    adapted = {id(m.base_layer) for m in module.modules() if hasattr(m, "lora_A")}
    for linear in _quantized_linears(module, head=head):
        moved = float(linear.weight.numel() * per_weight)  # type: ignore[operator]

        def dequantize(*_: Any, moved: float = moved) -> None:
            recorder.add(Op("dequantize", OpKind.DEQUANT, recorder.phase, 0.0, moved, "bf16"))

        handles.append(linear.register_forward_pre_hook(dequantize))
        handles.append(linear.register_full_backward_pre_hook(dequantize))
        handles += _cast_back_hooks(linear, recorder)
        if id(linear) in adapted:
            handles.append(linear.register_forward_hook(_defensive_clone(recorder)))
    return handles


def _defensive_clone(recorder: OpRecorder) -> Any:
    """PEFT's LoRA over a 4-bit Linear copies the base's output before adding its own.

    ``peft/tuners/lora/bnb.py``, ``Linear4bit.forward``: ``result = result.clone()`` ("As
    per Tim Dettmers, for 4bit, we need to defensively clone here"), a copy the generic
    LoRA layer the step is recorded with does not make: the output read and written once
    more, in the dtype bitsandbytes returns it (the input's: fp32 over a prepared base).
    """

    def clone(_: nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> None:
        width = args[0].element_size() if args and isinstance(args[0], torch.Tensor) else 2
        moved = float(out.numel() * 2 * width)
        recorder.add(Op("clone", OpKind.MEMORY, recorder.phase, 0.0, moved, "fp32"))

    return clone


def _own_compute_hooks(module: nn.Module, matmul: torch.dtype, *, head: bool) -> list[Any]:
    """A 4-bit layer computing in ``matmul`` on a model held in another dtype.

    ``Linear4bit.forward`` casts its input to ``bnb_4bit_compute_dtype``, multiplies by the
    weight dequantized into it and casts the output back to the input's dtype
    (bitsandbytes/nn/modules.py): the casts and the matmul run on the fake step, so they
    are recorded as the kernels they are.
    """
    original: dict[int, torch.dtype] = {}

    def cast_in(layer: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        original[id(layer)] = args[0].dtype
        return (args[0].to(matmul), *args[1:])

    def cast_back(layer: nn.Module, _: tuple[Any, ...], out: torch.Tensor) -> torch.Tensor:
        return out.to(original.pop(id(layer), out.dtype))

    handles = []
    for linear in _quantized_linears(module, head=head):
        handles.append(linear.register_forward_pre_hook(cast_in))
        handles.append(linear.register_forward_hook(cast_back))
    return handles


def _cast_back_hooks(linear: nn.Module, recorder: OpRecorder) -> list[Any]:
    """``Linear4bit`` returns its output cast back to its input's dtype.

    bitsandbytes' ``Linear4bit.forward`` ends ``matmul_4bit(...).to(inp_dtype)``: with an
    fp32 residual stream (``prepare_model_for_kbit_training``) every quantized Linear
    writes its 16-bit output again in fp32, and backward casts the fp32 gradient back.
    Autocast on the fake step leaves the output 16-bit, so the casts are added here.
    """
    widths: dict[str, int] = {}

    def forward(_: nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> None:
        x = args[0]
        if x.dtype == out.dtype:
            return
        widths["in"] = x.element_size()
        moved = float(out.numel() * (out.element_size() + x.element_size()))
        recorder.add(Op("_to_copy", OpKind.MEMORY, recorder.phase, 0.0, moved, "fp32"))

    def backward(_: nn.Module, grads: tuple[Any, ...]) -> None:
        if "in" in widths and grads and isinstance(grads[0], torch.Tensor):
            moved = float(grads[0].numel() * (widths["in"] + grads[0].element_size()))
            recorder.add(Op("_to_copy", OpKind.MEMORY, recorder.phase, 0.0, moved, "fp32"))

    return [
        linear.register_forward_hook(forward),
        linear.register_full_backward_pre_hook(backward),
    ]


def _run(
    built: Built,
    *,
    train: bool,
    autocast: torch.dtype | None,
    weights: DType,
    new_tokens: int | None,
    matmul: torch.dtype | None = None,
    quantized_head: bool = False,
    fp32_output: bool = False,
) -> tuple[list[Op], nn.Module]:
    fake_mode = new_fake_mode()
    module, inputs = copy_to_fake((built.module, built.inputs), fake_mode)
    module.train(train)
    recorder = OpRecorder()
    recorder.own_masks = built.causal
    handles = []
    if weights.is_quantized:
        handles = _dequant_hooks(module, recorder, weights, matmul, head=quantized_head)
    if matmul is not None:
        handles += _own_compute_hooks(module, matmul, head=quantized_head)
    quantized = _quantized_linears(module, head=quantized_head) if weights.is_quantized else []
    handles += python_hooks(module, recorder, quantized)
    try:
        with fake_mode, recorder:
            if new_tokens:
                _generate(module, inputs, recorder, autocast, new_tokens)
            elif train:
                with _cuda_target(autocast):
                    output = call_model(module, inputs)
                    if fp32_output:  # the loop's cast (Lightning Fabric)
                        output = outputs_in_fp32(output)
                    loss = compute_loss(output, built.loss_fn)
                recorder.phase = Phase.BACKWARD
                with _cuda_target(None):
                    loss.backward()  # type: ignore[no-untyped-call]
            else:
                with torch.no_grad(), _cuda_target(autocast):
                    call_model(module, inputs)
    finally:
        for handle in handles:
            handle.remove()
    return recorder.ops, module


def _generate(
    module: nn.Module,
    inputs: dict[str, torch.Tensor],
    recorder: OpRecorder,
    autocast: torch.dtype | None,
    new_tokens: int,
) -> None:
    """Prefill, then the first and the last decoding step (the cost in between is linear)."""
    ids = inputs["input_ids"]
    batch, seq = ids.shape
    with torch.no_grad(), _cuda_target(autocast):
        out = module(input_ids=ids, use_cache=True, logits_to_keep=1)
        first = len(recorder.ops)
        step = ids[:, :1]
        module(input_ids=step, past_key_values=out.past_key_values, use_cache=True)
        decode_first = recorder.ops[first:]
        del recorder.ops[first:]
        if new_tokens > 1:
            recorder.phase = Phase.FORWARD
            longer = torch.zeros(batch, seq + new_tokens - 1, dtype=ids.dtype)
            marker = len(recorder.ops)
            cache = module(input_ids=longer, use_cache=True, logits_to_keep=1).past_key_values
            del recorder.ops[marker:]
            last = len(recorder.ops)
            module(input_ids=step, past_key_values=cache, use_cache=True)
            decode_last = recorder.ops[last:]
            del recorder.ops[last:]
        else:
            decode_last = []
    half = new_tokens // 2
    recorder.ops += [op.times(new_tokens - half) for op in decode_first]
    recorder.ops += [op.times(half) for op in decode_last]


def record_workload(
    built: Built,
    *,
    train: bool,
    autocast: torch.dtype | None,
    weights: DType,
    optimizer: OptimizerName | None,
    implementation: str,
    state_bytes: int,
    accumulation: int,
    batch_size: int,
    new_tokens: int | None = None,
    grad_scaler: bool = False,
    matmul: torch.dtype | None = None,
    quantized_head: bool = False,
    fp32_output: bool = False,
) -> Workload:
    """Record one optimizer step of ``built`` (see the module notes).

    ``matmul``: the 4-bit layers' own compute dtype where it is not the model's
    (bitsandbytes' ``bnb_4bit_compute_dtype``; their weights already held in it).
    ``quantized_head``: the output head is quantized too, dequantized at each call.
    ``fp32_output``: the loop casts the outputs to fp32 before the loss (Lightning Fabric).
    """
    ops, module = _run(
        built,
        train=train,
        autocast=autocast,
        weights=weights,
        new_tokens=new_tokens,
        matmul=matmul,
        quantized_head=quantized_head,
        fp32_output=fp32_output,
    )
    ops = [op.times(accumulation) for op in ops] if accumulation > 1 else ops
    trainable = [p for p in module.parameters() if p.requires_grad]
    notes = []
    if train:
        sizes = [p.numel() for p in trainable]
        param_bytes = trainable[0].element_size() if trainable else 4
        ops += optimizer_ops(
            optimizer,
            sizes,
            param_bytes=param_bytes,
            state_bytes=state_bytes,
            implementation=implementation,
        )
        if grad_scaler and sizes:  # GradScaler.unscale_: gradients read and written once
            moved = 2.0 * sum(sizes) * param_bytes
            ops.append(Op("unscale", OpKind.MEMORY, Phase.OPTIMIZER, 0.0, moved, "fp32"))
        ran = implementation_of(optimizer, implementation)
        notes.append(f"optimizer: {optimizer.value if optimizer else 'none'} ({ran})")
    tokens = None if built.tokens is None else built.tokens * batch_size * accumulation
    if new_tokens:
        tokens = batch_size * new_tokens
    return Workload(
        ops=merge(ops),
        samples=batch_size * accumulation,
        tokens=tokens,
        parameters=sum(p.numel() for p in module.parameters()),
        trainable=sum(p.numel() for p in trainable),
        name=built.name,
        notes=tuple(notes),
    )
