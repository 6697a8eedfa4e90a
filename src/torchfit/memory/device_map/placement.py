"""Inference over several GPUs: a device map whose GPUs also hold their KV cache.

accelerate's ``infer_auto_device_map(model, max_memory=...)`` fills GPU 0 with weights
up to ``max_memory[0]``, then GPU 1, and so on. Given each card's full memory, it leaves
no room for what inference adds beside the weights: the KV cache of every layer a GPU
runs (at long sequences larger than the weights), the activations, the cuBLAS
workspace, the allocator's slack and the CUDA context, so the first GPUs run out of
memory at the first long prompt. `plan_device_map` runs the same accelerate placement
on a meta-device *proxy* of the model and a budget per GPU that leave room for all of it:

* the proxy's tensors have the bytes the weights will hold once loaded (the dtype, or
  bitsandbytes 4/8-bit with scales and 512-byte allocator blocks: the rules of
  `torchfit.quantize.quantized_footprint`, exact per tensor), and each decoder layer
  also carries its KV cache (`torchfit.memory.estimate`, ``mode="inference"``, divided
  by the layers), so a layer's cache goes where the layer goes;
* the budget of GPU ``i`` is::

      max_memory[i] = allocatable(card_i - CUDA context - reserve)
                      - cuBLAS workspace - activations_i - overhead_i

  where ``allocatable`` inverts the allocator model (`approximate_reserved`: +5%
  fragmentation, 2 MiB rounding, a 20 MiB and a 2 MiB segment), ``activations_i`` is the
  estimate's largest block transient if GPU ``i`` runs blocks, or its logits if it runs
  the output head (the larger of the two if both), and ``overhead_i`` the step's input
  ids, mask and RoPE tables if it runs anything (plus, with ``offload=True``, the KV
  cache of offloaded layers on GPU 0, which runs them).

Which GPU runs blocks or the head depends on the placement, so the plan starts as if
every GPU ran both, places, recomputes the budgets from the placement and places again
until the placement is stable; should placements cycle, budgets from then on only
shrink, which ends the loop. The result is checked, GPU by GPU, with the same allocator
model (`to_device`): weights + KV cache + activations + overhead + workspace, reserved,
plus the context, within the card.

Overflow is an error by default: transformers refuses a CPU/GPU mix for 4/8-bit
bitsandbytes weights (unless ``llm_int8_enable_fp32_cpu_offload``), and CPU offload
makes generation many times slower. ``offload=True`` (unquantized weights only) lets
accelerate put the overflow on the CPU instead; those layers run on GPU 0, which then
holds their KV cache, and the result says ``fits=False``. Either way a GPU that cannot
hold the runtime of the layers it runs is an error: such a map would run out of memory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torchfit._core import checks
from torchfit._core.units import DType, format_bytes, parse_bytes
from torchfit.memory.analytic.formulas import parse_attention
from torchfit.memory.device_map.planner import Planner
from torchfit.memory.device_map.result import DeviceMap
from torchfit.memory.gpus import GPU

__all__ = ["evaluate_device_map", "plan_device_map"]

_MAX_ROUNDS = 64


#: The door's rules of `plan_device_map` and `evaluate_device_map` (one definition).
_RULES: dict[str, checks.Rule] = {
    "model": checks.model_ref(),
    "batch_size": checks.whole(at_least=1),
    "seq_len": checks.whole(at_least=1),
    "quant_type": checks.one_of("nf4", "fp4"),
    "attn_implementation": checks.parsed(parse_attention, kinds=(str,)),
    "reserve": checks.parsed(parse_bytes, kinds=(str, int, float)),
    "context_bytes": checks.parsed(parse_bytes, kinds=(str, int, float)),
}


def _overflow_error(planner: Planner, result: DeviceMap) -> ValueError:
    cards = [s.card for s in result.devices]
    gpus = f"{len(cards)} x {cards[0]}" if len(set(cards)) == 1 else " + ".join(cards)
    rt = planner.runtime
    weights = sum(planner.sizes.values())
    kv = len(planner.layer_keys) * rt.kv_per_layer
    offered = sum(planner.allocatable)
    fixed = sum(planner.workspaces) + len(cards) * rt.overhead + max(rt.transient, rt.head)
    if result.offloaded and "" not in result.offloaded:
        shown = ", ".join(result.offloaded[:3]) + (", ..." if len(result.offloaded) > 3 else "")
        why = f"{len(result.offloaded)} modules are left over ({shown})"
    elif result.offloaded:
        why = "no module fits on any card"
    else:
        over = [str(s.device) for s in result.devices if not s.fits]
        why = f"GPU {', '.join(over)} cannot hold the runtime of the layers it runs"
    return ValueError(
        f"{planner.name} ({planner.method} weights, batch {planner.batch}, seq {planner.seq}) "
        f"does not fit {gpus}: weights {format_bytes(weights)} + KV cache "
        f"{format_bytes(kv)} + activations, workspace and inputs about {format_bytes(fixed)}, "
        f"while the cards offer {format_bytes(offered)} after the CUDA context and the "
        f"allocator's slack; {why}. Add cards or use larger ones, quantize (bits=4), "
        "shorten seq or batch, or pass offload=True for unquantized weights (slow)"
    )


@checks.arguments(**_RULES)
def plan_device_map(
    model: Any,
    gpus: Sequence[str | GPU | int] | str | GPU | int,
    *,
    batch_size: int = 1,
    seq_len: int | None = None,
    dtype: str | DType = "auto",
    bits: int | None = None,
    quant_type: str = "nf4",
    double_quant: bool = True,
    kv_cache: bool = True,
    attn_implementation: str = "sdpa",
    reserve: int | str = 0,
    context_bytes: int | str | None = None,
    offload: bool = False,
) -> DeviceMap:
    """Place a model's layers on several GPUs so each holds its weights *and* runtime.

    The rule for ``max_memory`` and the iteration are in the module docstring. The map is
    accelerate's own (``infer_auto_device_map``, layers kept whole by the model's
    ``_no_split_modules``), so ``from_pretrained`` and `torchfit.quantize.load_quantized`
    take it as is; load with the dtype it was sized for (`DeviceMap.load_kwargs`).

    Args:
        model: A catalog name (``"llama-2-13b"``), a transformers config, a local model
            folder or ``config.json``, or a transformers model (only its config is used).
        gpus: The cards, in device-index order: names (``"A100 40GB"``), `GPU` records,
            or byte budgets (``"24GiB"``, ``25769803776``). One card alone is a list of one.
        batch_size: Sequences per forward.
        seq_len: Tokens per sequence, prompt plus generated ones (the KV cache's length);
            default: the model's maximum.
        dtype: Unquantized weights, compute and KV cache: ``"auto"`` (bf16 if every card
            has native bf16, else fp16), ``"fp32"``, ``"fp16"`` or ``"bf16"``.
        bits: ``None`` (weights in ``dtype``), 4 (NF4/FP4) or 8 (LLM.int8), as
            `load_quantized` loads them with its default skip list.
        quant_type: ``"nf4"`` or ``"fp4"`` (4-bit).
        double_quant: 4-bit with double quantization.
        kv_cache: Keep a KV cache (``generate`` does).
        attn_implementation: ``"sdpa"``, ``"eager"`` or ``"flash"``.
        reserve: Bytes to keep free on every card (``"1GiB"``), beyond the prediction.
        context_bytes: CUDA context per card; default `cuda_context_bytes` of the card.
        offload: Put what does not fit on the CPU instead of raising (not with ``bits``).

    Returns:
        A `DeviceMap`: the map, the ``max_memory`` accelerate got, and each GPU's share.

    Raises:
        ImportError: transformers or accelerate is missing (``pip install 'torchfit[hf]'``).
        ValueError: an unknown card, an empty ``gpus``, a bad ``batch_size``/``seq_len``/``dtype``/
            ``bits``, ``offload`` with ``bits``, or a model that does not fit the cards.
        TypeError: ``model`` or ``gpus`` of the wrong kind.

    Example:
        >>> plan = plan_device_map("llama-2-13b", ["A100 40GB"] * 2, seq_len=4096, batch_size=8)
        >>> plan.fits, [len(share.layers) for share in plan.devices]
        (True, [26, 14])
        >>> plan.device_map["model.layers.0"], plan.device_map["lm_head"]
        (0, 1)
    """
    if not isinstance(offload, bool):
        raise TypeError(f"offload must be True or False; got {offload!r}")
    if offload and bits is not None:
        raise ValueError(
            f"offload=True with bits={bits}: transformers refuses to put bitsandbytes "
            "weights on the CPU beside GPU ones (it needs llm_int8_enable_fp32_cpu_offload, "
            "which load_quantized does not set); drop offload, or add GPUs"
        )
    planner = Planner(
        model,
        gpus,
        batch=batch_size,
        seq=seq_len,
        dtype=dtype,
        bits=bits,
        quant_type=quant_type,
        double_quant=double_quant,
        kv_cache=kv_cache,
        attn=attn_implementation,
        reserve=reserve,
        context_bytes=context_bytes,
    )
    planner.offload_runs_on_zero = offload
    max_memory = planner.first_guess()
    seen: list[dict[str, int | str]] = []
    shrink_only = False
    rounds = 0
    while True:
        rounds += 1
        if rounds > _MAX_ROUNDS:  # pragma: no cover - shrinking max_memory ends in a few rounds
            raise RuntimeError(f"the device map did not settle in {_MAX_ROUNDS} placements")
        placed, warned = planner.place(max_memory, offload=offload)
        needed = planner.limits(placed)
        if shrink_only:
            needed = {i: min(max_memory[i], needed[i]) for i in needed}
        if all(max_memory[i] <= needed[i] for i in needed) and (
            shrink_only or needed == max_memory
        ):
            break
        if placed in seen:  # a cycle: from now on max_memory only shrinks, so it ends
            shrink_only = True
            needed = {i: min(max_memory[i], needed[i]) for i in needed}
        seen.append(placed)
        max_memory = needed
    notes = [f"accelerate: {w}" for w in warned]
    notes.append(
        "max_memory (weights + KV cache of the layers placed) = card - CUDA context - "
        "allocator slack - reserve - cuBLAS workspace - activations and inputs; accelerate "
        "also keeps room for its largest layer on GPU 0"
    )
    result = planner.result(placed, max_memory, given=False, rounds=rounds, notes=notes)
    if (result.offloaded and not offload) or not all(s.fits for s in result.devices):
        raise _overflow_error(planner, result)
    return result


@checks.arguments(**_RULES)
def evaluate_device_map(
    model: Any,
    device_map: Mapping[str, int | str],
    gpus: Sequence[str | GPU | int] | str | GPU | int,
    *,
    batch_size: int = 1,
    seq_len: int | None = None,
    dtype: str | DType = "auto",
    bits: int | None = None,
    quant_type: str = "nf4",
    double_quant: bool = True,
    kv_cache: bool = True,
    attn_implementation: str = "sdpa",
    reserve: int | str = 0,
    context_bytes: int | str | None = None,
) -> DeviceMap:
    """What each GPU will hold under a device map you already have (accelerate's, yours).

    Same arguments as `plan_device_map`, plus ``device_map`` (module name -> GPU index,
    ``"cuda:N"``, ``"cpu"`` or ``"disk"``); nothing is placed. The result's ``fits`` says
    whether every GPU holds its weights and runtime.

    Example:
        >>> from accelerate.utils import infer_auto_device_map
        >>> from torchfit.memory.catalog import build_model
        >>> cards = ["A100 40GB"] * 2
        >>> plain = infer_auto_device_map(build_model("llama-2-13b", dtype="bf16"),
        ...     max_memory={0: "40GiB", 1: "40GiB"}, no_split_module_classes=["LlamaDecoderLayer"])
        >>> evaluate_device_map("llama-2-13b", plain, cards, seq_len=4096, batch_size=8).fits
        False
    """
    planner = Planner(
        model,
        gpus,
        batch=batch_size,
        seq=seq_len,
        dtype=dtype,
        bits=bits,
        quant_type=quant_type,
        double_quant=double_quant,
        kv_cache=kv_cache,
        attn=attn_implementation,
        reserve=reserve,
        context_bytes=context_bytes,
    )
    return planner.result(dict(device_map), {}, given=True, rounds=0, notes=())
