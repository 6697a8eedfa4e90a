"""What ``torchfit plan`` adds to a plan on request.

The model config read with its repository's code (``--trust-remote-code``), an inference
device map (``--device-map``), the traced step (``--trace``) and the host's side of the
run (``--machine``).
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

    step = plan.step
    if step.training:
        raise ValueError(
            "--device-map places the layers for inference (weights, KV cache, activations); "
            "add --inference, or use --strategy for training across GPUs"
        )
    bits = {"int8": 8, "nf4": 4}.get(str(step.quantization))
    return plan_device_map(
        args.model,
        [args.gpu[0]] * args.gpus,
        batch_size=step.batch_size,
        seq_len=step.seq_len,
        dtype="auto" if bits else step.compute.value,
        bits=bits,
        attn_implementation=step.attn_implementation,
    )


def traced(args: argparse.Namespace, plan: Any) -> Any:
    """Trace the planned step of the model built on the meta device."""
    import torch  # noqa: PLC0415

    from torchfit._core.torch_rules import autograd_of  # noqa: PLC0415
    from torchfit.memory.catalog import build_model  # noqa: PLC0415
    from torchfit.memory.catalog.build import (  # noqa: PLC0415
        checkpointing_on,
        transformers_without_data,
    )
    from torchfit.memory.catalog.inputs import example_batch  # noqa: PLC0415
    from torchfit.memory.step.run import loop_keywords  # noqa: PLC0415
    from torchfit.memory.tracing.tracer import trace  # noqa: PLC0415

    settings, step = plan.settings, plan.step
    if step.quantization is not None:
        raise ValueError(f"--trace supports fp32, bf16 and fp16; got --dtype {step.quantization}")
    untraceable = {
        "--trainable-params": step.trainable_params is not None,
        "--lora-rank/--lora-targets": step.wants_lora,
        "--loss-chunk": step.loss_chunk_size is not None,
        "--new-tokens": step.max_new_tokens is not None,
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
    train = step.training
    # training: fp32 weights, the precision applied by the trace; inference: held in it
    weights = "fp32" if train else step.compute.value
    model = build_model(model_of(args), device="meta", dtype=weights)
    if train and step.gradient_checkpointing:
        try:
            checkpointing_on(model)
        except ValueError as error:
            raise ValueError(f"--trace with --checkpointing: {error}") from None
    if step.seq_len is not None:
        inputs: object = example_batch(
            model, batch_size=step.batch_size, seq_len=step.seq_len, training=train
        )
    else:
        inputs = torch.zeros(step.batch_size, *(step.input_shape or ()), device="meta")
    loop = loop_keywords(step) if train else {}
    with transformers_without_data(), autograd_of(step.torch_version):
        return trace(
            model,
            inputs,
            mode=step.mode,
            optimizer=step.optimizer if train else None,
            precision=step.precision if train else None,
            device="cuda",
            progress=True,
            gpu=plan.gpu,
            **loop,
        )
