"""What ``torchfit plan`` adds to a plan on request.

The model config read with its repository's code (``--trust-remote-code``), an inference
device map (``--device-map``) and the traced step (``--trace``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["device_map", "model_of", "traced"]


def model_of(args: argparse.Namespace) -> Any:
    """The name, or with --trust-remote-code the config read with the repository's code."""
    if not args.trust_remote_code:
        return args.model
    from torchfit.memory.catalog import model_config  # noqa: PLC0415

    print(
        f"torchfit: --trust-remote-code: {args.model!r} may run its repository's Python code",
        file=sys.stderr,
    )
    return model_config(args.model, trust_remote_code=True)


def device_map(args: argparse.Namespace, plan: Any) -> Any:
    """The inference device map over ``--gpus`` cards for the plan's settings."""
    from torchfit.memory.device_map import plan_device_map  # noqa: PLC0415

    settings = plan.settings
    if settings.mode != "inference":
        raise ValueError(
            "--device-map places the layers for inference (weights, KV cache, activations); "
            "add --inference, or use --strategy for training across GPUs"
        )
    bits = {"int8": 8, "nf4": 4}.get(str(settings.dtype))
    return plan_device_map(
        args.model,
        [args.gpu] * args.gpus,
        batch_size=settings.batch_size,
        seq_len=settings.seq_len,
        dtype="auto" if bits else settings.dtype,
        bits=bits,
        attn_implementation=args.attn,
    )


def traced(args: argparse.Namespace, plan: Any) -> Any:
    """Trace the planned step of the model built on the meta device."""
    import torch  # noqa: PLC0415

    from torchfit.memory.catalog import build_model  # noqa: PLC0415
    from torchfit.memory.catalog.build import transformers_without_data  # noqa: PLC0415
    from torchfit.memory.catalog.inputs import example_batch  # noqa: PLC0415
    from torchfit.memory.tracing.tracer import trace  # noqa: PLC0415

    settings = plan.settings
    if settings.dtype not in {"fp32", "bf16", "fp16"}:
        raise ValueError(f"--trace supports fp32, bf16 and fp16; got --dtype {settings.dtype}")
    untraceable = {
        "--trainable-params": settings.trainable_params is not None,
        "--lora-rank/--lora-targets": bool(settings.lora_rank or settings.lora_targets),
        "--loss-chunk": settings.loss_chunk_size is not None,
        "--new-tokens": settings.max_new_tokens is not None,
        "--gpus/--strategy": settings.world_size > 1 or settings.strategy is not None,
        "--offload-optimizer/--offload-params": (
            settings.offload_optimizer or settings.offload_params
        ),
    }
    asked = [flag for flag, on in untraceable.items() if on]
    if asked:
        raise ValueError(
            f"--trace runs the plain model's step and cannot follow {', '.join(asked)}; "
            "drop --trace, or trace your own step with torchfit.memory.trace"
        )
    train = settings.mode == "train"
    model = build_model(model_of(args), device="meta", dtype="fp32" if train else settings.dtype)
    if train and settings.gradient_checkpointing:
        enable = getattr(model, "gradient_checkpointing_enable", None)
        if enable is None:
            raise ValueError(
                f"--trace with --checkpointing needs a transformers model; "
                f"{type(model).__name__} has no gradient_checkpointing_enable()"
            )
        enable()
    if settings.seq_len is not None:
        batch = settings.batch_size
        inputs: object = example_batch(
            model, batch_size=batch, seq_len=settings.seq_len, training=train
        )
    else:
        inputs = torch.zeros(settings.batch_size, *settings.input_shape, device="meta")
    mixed = train and settings.dtype != "fp32" and settings.precision is None
    loop = (
        {
            "gradient_accumulation_steps": settings.gradient_accumulation_steps,
            "set_to_none": settings.set_to_none,
            "keep_output": settings.keep_output,
            "optimizer_in_backward": settings.optimizer_in_backward,
        }
        if train
        else {}
    )
    with transformers_without_data():
        return trace(
            model,
            inputs,
            mode=settings.mode,
            optimizer=None if settings.optimizer == "none" else settings.optimizer,
            autocast_dtype={"bf16": torch.bfloat16, "fp16": torch.float16}[settings.dtype]
            if mixed
            else None,
            precision=settings.precision if train else None,
            device="cuda",
            progress=True,
            gpu=plan.gpu,
            **loop,
        )
