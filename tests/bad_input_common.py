"""Shared pieces of the bad-input tables: small objects to call with, and parameter kinds.

`bad_input_cases` (the table's torchfit, precision, loaders and quantize rows) and
`bad_input_memory` (torchfit.memory's rows) build their cases from these.
"""

from __future__ import annotations

import torch

import torchfit
from bad_inputs import (
    AUTOCAST,
    CALLABLE,
    COUNT,
    DTYPE,
    FLAG,
    FRACTION,
    FREE,
    MODEL,
    NAME,
    NON_NEGATIVE,
    POSITIVE,
    SHAPE,
    SIZE,
    Kind,
)
from torchfit import memory
from torchfit.loaders import MachineBudget


def tiny() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def line() -> memory.result.AffineEstimate:
    return memory.result.AffineEstimate(
        memory.MemoryEstimate(weights=1000), memory.MemoryEstimate(activations=10)
    )


def step(batch_size):
    return batch_size


def mp_after_backward(dtype: str = "bf16"):
    model = tiny()
    mp = torchfit.MixedPrecision(dtype, device="cpu")
    with mp.autocast():
        loss = model(torch.randn(4, 8)).float().square().mean()
    mp.backward(loss)
    return mp, torch.optim.SGD(model.parameters(), lr=0.1)


def mp_step(dtype: str = "bf16"):
    mp, opt = mp_after_backward(dtype)
    return lambda *a, **k: mp.step(*a, **k) if a or "optimizers" in k else mp.step(opt, **k)


def mp_backward():
    model = tiny()
    mp = torchfit.MixedPrecision("bf16", device="cpu")
    loss = model(torch.randn(4, 8)).square().mean()
    return lambda **k: mp.backward(**{"loss": loss, **k})


def allocated():
    allocator = memory.allocator.CachingAllocator()
    handle = allocator.malloc(1024)
    return lambda handle=handle: allocator.free(handle)


LOADER = [torch.zeros(2)] * 4
BUDGET = MachineBudget(4, 4, None, 1, "test", shm_free_bytes=2**30)
TRAIN = {
    "mode": NAME, "optimizer": NAME, "loss_fn": CALLABLE, "autocast_dtype": AUTOCAST,
    "set_to_none": FLAG, "precision": NAME, "gradient_accumulation_steps": COUNT,
    "keep_output": FLAG, "optimizer_in_backward": FLAG, "fp32_output": FLAG,
}  # fmt: skip
ESTIMATE = {
    "model": MODEL, "batch_size": COUNT, "seq_len": COUNT, "input_shape": SHAPE,
    "dtype": DTYPE, "mode": NAME, "optimizer": NAME, "gradient_checkpointing": FLAG,
    "attn_implementation": NAME, "mixed_precision": FLAG, "trainable_params": NON_NEGATIVE,
    "precision": NAME, "gradient_accumulation_steps": COUNT, "set_to_none": FLAG,
    "keep_output": FLAG, "optimizer_in_backward": FLAG, "loss_chunk_size": COUNT,
    "fp32_output": FLAG, "lora": FREE, "lora_rank": COUNT, "lora_targets": NAME,
    "lora_dropout": FRACTION,
    "bitsandbytes_version": NAME, "torch_version": NAME, "double_quant": FLAG,
    "quantize_head": FLAG,
    "base_dtype": DTYPE, "max_new_tokens": COUNT,
}  # fmt: skip
SHARD = {
    "estimate": Kind("estimate", (1000, "1GB", None, {"weights": 1})),
    "strategy": NAME, "backward_start": Kind("estimate", (1000, "1GB", {"weights": 1})),
    "params": NON_NEGATIVE, "largest_layer_params": NON_NEGATIVE,
    "bucket_bytes": NON_NEGATIVE, "reshard_after_forward": FLAG,
    "offload_optimizer": FLAG, "offload_params": FLAG, "param_bytes": POSITIVE,
    "grad_bytes": POSITIVE, "autocast_copies": NON_NEGATIVE,
}  # fmt: skip
DEVICE_MAP = {
    "model": MODEL, "gpus": Kind("gpus", ([], "", [""], 2.5, [2.5], True, [-1], [None])),
    "batch_size": COUNT, "seq_len": COUNT, "dtype": DTYPE,
    "bits": Kind("bits", (3, 16, 0, -4, 4.0, "4", True)), "quant_type": NAME,
    "double_quant": FLAG, "kv_cache": FLAG, "attn_implementation": NAME, "reserve": SIZE,
    "context_bytes": SIZE,
}  # fmt: skip
QUANT = {"bits": Kind("bits", (3, 16, 0, -4, 4.0, "4", True)), "quant_type": NAME,
          "double_quant": FLAG}  # fmt: skip
