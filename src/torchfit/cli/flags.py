"""``torchfit plan``'s flags for the training loop, LoRA and the CUDA stack."""

from __future__ import annotations

import argparse

from torchfit.cli import values

__all__ = ["add_step_flags", "refuse_idle_flags"]


def add_step_flags(plan: argparse.ArgumentParser) -> None:
    """Flags for how the training loop runs and what the CUDA stack is."""
    plan.add_argument(
        "--precision",
        default=None,
        type=values.precision,
        help="Lightning's names: 32-true, 16-mixed, bf16-mixed, 16-true, bf16-true "
        "(with it, --dtype stays auto or names a quantized base: nf4, int8)",
    )
    plan.add_argument(
        "--accumulate",
        type=values.count,
        default=1,
        metavar="N",
        help="gradient accumulation steps (--batch is one micro-batch); gradients stay alive",
    )
    plan.add_argument(
        "--zero-grad-in-place",
        dest="set_to_none",
        action="store_false",
        help="zero_grad(set_to_none=False): gradients stay allocated between steps",
    )
    plan.add_argument(
        "--keep-output",
        action="store_true",
        help="the forward's output stays referenced through backward (outputs.loss.backward())",
    )
    plan.add_argument(
        "--optimizer-in-backward",
        action="store_true",
        help="each parameter steps during backward and its gradient is freed (torchtune)",
    )
    plan.add_argument(
        "--cuda-version",
        default=None,
        type=values.cuda_version,
        help="the job's CUDA version (torch.version.cuda); before 11.7 the context is larger",
    )
    plan.add_argument(
        "--context",
        default=None,
        type=values.context,
        metavar="SIZE",
        help="the CUDA context you measured, e.g. 420MiB, or 'measure' (on this machine's GPU)",
    )
    plan.add_argument(
        "--lora-rank",
        type=values.count,
        default=None,
        metavar="R",
        help="LoRA rank (PEFT's default 8)",
    )
    plan.add_argument(
        "--lora-targets",
        default=None,
        type=values.names,
        metavar="NAMES",
        help="comma-separated Linears with adapters, e.g. q_proj,v_proj or all-linear "
        "(PEFT's default for the model; a 4/8-bit --train plan assumes it)",
    )
    plan.add_argument(
        "--bitsandbytes-version",
        default=None,
        type=values.bitsandbytes_version,
        metavar="X.Y.Z",
        help="the bitsandbytes of a 4-bit run (before 0.43.2 4-bit layers keep their input)",
    )
    plan.add_argument(
        "--no-double-quant",
        dest="double_quant",
        action="store_false",
        help="4-bit weights without double quantization (one fp32 absmax per 64 weights)",
    )
    plan.add_argument(
        "--base-dtype",
        default=None,
        type=values.dtype,
        help="a frozen LoRA base's dtype under mixed precision (default: the checkpoint's); "
        "with 4-bit weights, the dtype they were quantized from (fp16 for Lightning Fabric)",
    )
    plan.add_argument(
        "--quantize-head",
        action="store_true",
        help="with --dtype nf4/int8: the output head quantized too (kept 16-bit by default)",
    )
    plan.add_argument(
        "--loss-chunk",
        type=values.count,
        default=None,
        metavar="N",
        help="the loss is computed N positions at a time (torchtune's chunked CE, LitGPT: 128)",
    )
    plan.add_argument(
        "--new-tokens",
        type=values.count,
        default=None,
        metavar="N",
        help="with --inference: generate N tokens after the --seq prompt (model.generate)",
    )


_FOUR_BIT = frozenset({"nf4", "fp4", "int4"})


def refuse_idle_flags(args: argparse.Namespace) -> None:
    """Refuse a flag that this plan would ignore (its value would be printed, not used).

    Raises:
        ValueError: naming the flag, what it needs, and what to change.
    """
    four_bit = str(args.dtype).strip().lower() in _FOUR_BIT
    lora = any(v is not None for v in (args.lora_rank, args.lora_targets, args.trainable_params))
    bits = "4-bit weights (--dtype nf4, fp4 or int4)"
    idle = [
        (not args.double_quant and not four_bit, "--no-double-quant", bits),
        (args.bitsandbytes_version is not None and not four_bit, "--bitsandbytes-version", bits),
        (args.base_dtype is not None and not (lora or four_bit), "--base-dtype",
         "a frozen base (--lora-rank, --lora-targets or --trainable-params) or 4-bit weights"),
        (args.gpus_per_node is not None and args.strategy is None, "--gpus-per-node",
         "a --strategy (hsdp shards within a node; offload shares a node's memory)"),
    ]  # fmt: skip
    for ignored, flag, needs in idle:
        if ignored:
            raise ValueError(
                f"{flag} applies to {needs}, which this plan does not have; add that or "
                f"leave {flag} out"
            )
