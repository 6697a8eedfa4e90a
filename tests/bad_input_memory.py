"""The bad-input table's rows for torchfit.memory (see `bad_input_cases`)."""

from __future__ import annotations

import torch

import torchfit
from bad_input_common import (
    DEVICE_MAP,
    SHARD,
    TRAIN,
    allocated,
    line,
    tiny,
)
from bad_inputs import (
    AUTOCAST,
    CALLABLE,
    CAPACITY,
    CARD,
    COUNT,
    COUNTS,
    DEVICE,
    DTYPE,
    FLAG,
    FRACTION,
    FREE,
    MODEL,
    MODULE,
    NAME,
    NAN,
    NON_NEGATIVE,
    SIZE,
    Case,
    Kind,
)
from torchfit import memory

EVENTS = [("a", 1024), ("a",)]
#: What `trace` and `trace_events` share (trace also takes a card).
TRACED = TRAIN | {
    "model": MODULE,
    "example_inputs": Kind("inputs", (None,)),
    "device": NAME,
    "progress": FLAG,
}
#: Something that is not a `torchfit.Step` where one goes.
STEP = Kind("step", (3, "train", {"batch_size": 2}, [1]))
RECORD = memory.MemoryEstimate(weights=4000, gradients=4000, optimizer=8000)

MEMORY: list[Case] = [
    # -- torchfit.memory: estimate ----------------------------------------------------------
    Case(
        "AffineEstimate",
        lambda: memory.result.AffineEstimate,
        kwargs={"fixed": RECORD, "per_sample": memory.MemoryEstimate(activations=10)},
        kinds={
            "fixed": Kind("estimate", (3, None, "1GB")),
            "per_sample": Kind("estimate", (3, None, "1GB")),
        },
    ),
    Case(
        "AffineEstimate.at",
        lambda: line().at,
        kwargs={"batch_size": 4},
        kinds={"batch_size": NON_NEGATIVE},
    ),
    Case(
        "AffineEstimate.batch_within",
        lambda: line().batch_within,
        kwargs={"budget_bytes": 2000},
        kinds={"budget_bytes": NON_NEGATIVE},
    ),
    Case(
        "activation_bytes",
        lambda: memory.activation_bytes,
        kwargs={"model": tiny(), "example_input": torch.randn(2, 8)},
        kinds={
            "model": MODULE,
            "example_input": Kind("input", (None,)),
            "dtype": DTYPE,
            "training": FLAG,
            "device": NAME,
            "kernel_calls": FLAG,
        },
    ),
    Case(
        "attention_bytes",
        lambda: memory.analytic.attention_bytes,
        kwargs={"batch_size": 2, "seq_len": 16, "num_heads": 2, "head_dim": 8},
        kinds={
            "batch_size": COUNT,
            "seq_len": COUNT,
            "num_heads": COUNT,
            "head_dim": COUNT,
            "dtype": DTYPE,
            "implementation": NAME,
            "training": FLAG,
            "dropout": FRACTION,
            "num_kv_heads": COUNT,
            "device": NAME,
            "fp32_softmax": FLAG,
        },
    ),
    Case(
        "spec_from_config",
        lambda: memory.analytic.spec_from_config,
        kwargs={"config": memory.catalog.model_config("gpt2")},
        kinds={"config": Kind("config", (3, None, "", 2.5, [1]))},
    ),
    Case(
        "kv_cache_bytes",
        lambda: memory.analytic.kv_cache_bytes,
        kwargs={"batch_size": 2, "seq_len": 16, "num_layers": 2, "num_kv_heads": 2, "head_dim": 8},
        kinds={
            "batch_size": COUNT,
            "seq_len": COUNT,
            "num_layers": COUNT,
            "num_kv_heads": COUNT,
            "head_dim": COUNT,
            "dtype": DTYPE,
            "sliding_window": COUNT,
        },
    ),
    Case(
        "kv_cache_bytes_for",
        lambda: memory.analytic.kv_cache_bytes_for,
        kwargs={"config": "gpt2", "batch_size": 2, "seq_len": 16},
        kinds={"config": MODEL, "batch_size": COUNT, "seq_len": COUNT, "dtype": DTYPE},
    ),
    Case(
        "model_state_bytes",
        lambda: memory.analytic.model_state_bytes,
        kwargs={"params": 1000},
        kinds={
            "params": NON_NEGATIVE,
            "trainable": NON_NEGATIVE,
            "dtype": DTYPE,
            "mixed_precision": FLAG,
            "optimizer": NAME,
            "training": FLAG,
            "num_tensors": NON_NEGATIVE,
            "autocast_params": NON_NEGATIVE,
            "shapes": Kind("shapes", ("x", [(-1, 2)], [(2.5,)], [3], 3)),
        },
    ),
    Case(
        "optimizer_state_bytes",
        lambda: memory.analytic.optimizer_state_bytes,
        kwargs={"optimizer": "adamw", "trainable": 1000, "param_dtype": torchfit.DType.FP32},
        kinds={
            "optimizer": NAME,
            "trainable": NON_NEGATIVE,
            "param_dtype": Kind("dtype", ("", "qqnope", 3, torch.int32, True)),
            "num_tensors": NON_NEGATIVE,
            "large_tensor_params": NON_NEGATIVE,
            "shapes": Kind("shapes", ("x", [(-1, 2)], [(2.5,)], [3], 3)),
        },
    ),
    # -- trace and measure --------------------------------------------------------------------
    Case(
        "trace",
        lambda: memory.trace,
        kwargs={"model": tiny(), "example_inputs": torch.randn(2, 8), "optimizer": "sgd"},
        kinds=TRACED | {"gpu": CARD, "step": STEP},
    ),
    Case(
        "trace_events",
        lambda: memory.tracing.trace_events,
        kwargs={"model": tiny(), "example_inputs": torch.randn(2, 8), "optimizer": "sgd"},
        kinds=TRACED,
    ),
    Case(
        "trace_step",
        lambda: memory.trace_step,
        args=(lambda: None,),
        kinds={
            "fn": CALLABLE,
            "args": FREE,
            "device": NAME,
            "warmup": NON_NEGATIVE,
            "autocast_dtype": AUTOCAST,
            "progress": FLAG,
            "kwargs": FREE,
        },
    ),
    Case(
        "measure_step",
        lambda: memory.measure_step,
        kwargs={
            "model": tiny(),
            "example_inputs": torch.randn(2, 8),
            "optimizer": "sgd",
            "device": "cpu",
        },
        kinds=TRAIN
        | {
            "model": MODULE,
            "example_inputs": Kind("inputs", (None,)),
            "device": DEVICE,
            "step": STEP,
        },
    ),
    Case(
        "live_bytes",
        lambda: memory.measure.live_bytes,
        args=(torch.zeros(2),),
        kinds={"objects": FREE, "device": DEVICE},
    ),
    # -- batch size ----------------------------------------------------------------------------
    Case(
        "Margin",
        lambda: memory.batch.Margin,
        kwargs={"fraction": 0.1},
        kinds={"fraction": FRACTION, "reserve": NON_NEGATIVE},
    ),
    Case(
        "Margin.usable",
        lambda: memory.batch.Margin(0.1).usable,
        kwargs={"budget_bytes": 1000},
        kinds={"budget_bytes": NON_NEGATIVE},
    ),
    Case(
        "is_oom",
        lambda: memory.batch.is_oom,
        kwargs={"exc": RuntimeError("x")},
        kinds={"exc": Kind("exception", (3, "out of memory", None, RuntimeError))},
    ),
    Case(
        "max_batch_size",
        lambda: memory.max_batch_size,
        kwargs={"predict": line(), "budget": "1MB"},
        kinds={
            "predict": Kind("predictor", (3, "line", None, 2.5)),
            "budget": CAPACITY,
            "margin": FRACTION,
            "batch_sizes": COUNTS,
        },
    ),
    Case(
        "solve_batch_size",
        lambda: memory.batch.solve_batch_size,
        kwargs={"line": line(), "budget_bytes": 2000},
        kinds={
            "line": Kind("line", (3, "line", None, 2.5, RECORD)),
            "budget_bytes": SIZE,
            "margin": FRACTION,
        },
    ),
    # -- catalog --------------------------------------------------------------------------------
    Case(
        "build_model",
        lambda: memory.catalog.build_model,
        kwargs={"model": "gpt2"},
        kinds={"model": MODEL, "device": DEVICE, "dtype": DTYPE, "task": NAME},
    ),
    Case(
        "count_parameters",
        lambda: memory.catalog.count_parameters,
        kwargs={"model": tiny()},
        kinds={"model": MODULE, "trainable_only": FLAG},
    ),
    Case(
        "current_gpu",
        lambda: memory.gpus.current_gpu,
        kwargs={"device": 0},
        base_raises=None if torch.cuda.is_available() else RuntimeError,
        kinds={"device": Kind("device", ("tpu", "", -1, 2.5, True, [0]))},
    ),
    Case("list_gpus", lambda: memory.list_gpus, kinds={"vendor": NAME}),
    Case("list_models", lambda: memory.list_models, kinds={"task": NAME}),
    Case(
        "model_config",
        lambda: memory.catalog.model_config,
        kwargs={"model": "gpt2"},
        kinds={"model": MODEL, "trust_remote_code": FLAG},
    ),
    Case(
        "model_entry",
        lambda: memory.catalog.model_entry,
        kwargs={"name": "gpt2"},
        kinds={"name": MODEL},
    ),
    # -- allocator -----------------------------------------------------------------------------
    Case(
        "CachingAllocator",
        lambda: memory.allocator.CachingAllocator,
        kwargs={"capacity": 2**30},
        kinds={
            "capacity": Kind("capacity", (0, -1, 2.5, NAN, "1GB", True)),
            "max_split_size": NON_NEGATIVE,
            "roundup_power2_divisions": NON_NEGATIVE,
            "placement": Kind("placement", (3, "x", 2.5, True, [])),
        },
    ),
    Case(
        "CachingAllocator.malloc",
        lambda: memory.allocator.CachingAllocator().malloc,
        kwargs={"nbytes": 1024},
        kinds={"nbytes": NON_NEGATIVE},
    ),
    Case(
        "CachingAllocator.free",
        allocated,
        spec=memory.allocator.CachingAllocator.free,
        kinds={"handle": Kind("handle", (-1, 2.5, "0", None, 99))},
    ),
    Case(
        "cublas_workspace_bytes",
        lambda: memory.allocator.cublas_workspace_bytes,
        kinds={"compute_capability": Kind("capability", ("", "x.y", (-1, 0), True, [], NAN))},
    ),
    Case(
        "cuda_context_bytes",
        lambda: memory.allocator.cuda_context_bytes,
        kinds={
            "gpu": Kind("gpu", ("", 42, 2.5, True, [1])),
            "lazy_loading": FLAG,
            "cuda_version": Kind("cuda version", ("", "twelve", -1.0, (12,), True, NAN)),
        },
    ),
    Case(
        "measure_cuda_context",
        lambda: memory.allocator.measure_cuda_context,
        base_raises=None if torch.cuda.is_available() else RuntimeError,
        kinds={"device": Kind("device", ("", -1, 2.5, True, [1], NAN))},
    ),
    Case(
        "replay",
        lambda: memory.allocator.replay,
        kwargs={"events": EVENTS},
        kinds={
            "events": Kind("events", (3, None, [("a", -1)], [("a", 2.5)], [(1, 2, 3)])),
            "warmup": Kind("warmup", (3, [("a", -1)], [("a", 2.5)], [(1, 2, 3)], [("a",)])),
            "capacity": Kind("capacity", (0, -1, 2.5, NAN, "1GB", True)),
            "max_split_size": NON_NEGATIVE,
            "roundup_power2_divisions": NON_NEGATIVE,
        },
    ),
    Case(
        "round_request",
        lambda: memory.allocator.round_request,
        kwargs={"nbytes": 1000},
        kinds={"nbytes": NON_NEGATIVE, "roundup_power2_divisions": NON_NEGATIVE},
    ),
    Case(
        "segment_size",
        lambda: memory.allocator.segment_size,
        kwargs={"nbytes": 1000},
        kinds={"nbytes": NON_NEGATIVE},
    ),
    Case(
        "to_device",
        lambda: memory.to_device,
        kwargs={"estimate": RECORD},
        kinds={
            "estimate": Kind("estimate", (3, None, "1GB", {"weights": 1})),
            "gpu": Kind("gpu", ("", 42, 2.5, True, [1])),
            "events": Kind("events", (3, [("a", -1)], [("a", 2.5)])),
            "warmup": Kind("warmup", (3, [("a", -1)], [("a", 2.5)])),
            "context_bytes": SIZE,
            "workspace": FLAG,
            "training": FLAG,
            "fragmentation": FRACTION,
            "oom_line": FLAG,
            "lazy_loading": FLAG,
            "cuda_version": Kind("cuda version", ("", "twelve", -1.0, (12,), True)),
        },
    ),
    # -- several GPUs ----------------------------------------------------------------------------
    Case(
        "deepspeed_zero_bytes",
        lambda: memory.sharding.deepspeed_zero_bytes,
        kwargs={"params": 1000, "world_size": 2, "stage": 2},
        kinds={
            "params": NON_NEGATIVE,
            "world_size": COUNT,
            "stage": Kind("stage", (-1, 4, 2.5, "2", True, NAN)),
            "largest_layer_params": NON_NEGATIVE,
            "offload_optimizer": FLAG,
            "offload_params": FLAG,
        },
    ),
    Case(
        "min_gpus",
        lambda: memory.sharding.min_gpus,
        kwargs={"estimate": RECORD, "gpu_memory_bytes": 6000, "strategy": "fsdp", "params": 1000},
        kinds=SHARD
        | {
            "gpu_memory_bytes": Kind("bytes", (0, -1, 2.5, NAN, "6000", True)),
            "root_bytes": NON_NEGATIVE,
            "root_trainable_params": NON_NEGATIVE,
            "root_head_params": NON_NEGATIVE,
            "unit_bytes": NON_NEGATIVE,
        },
    ),
    Case(
        "shard_estimate",
        lambda: memory.shard_estimate,
        kwargs={
            "estimate": RECORD,
            "strategy": "fsdp",
            "world_size": 2,
            "params": 1000,
            "largest_layer_params": 100,
        },
        kinds=SHARD
        | {
            "world_size": COUNT,
            "gpus_per_node": COUNT,
            "unit_trainable_params": NON_NEGATIVE,
            "root_bytes": NON_NEGATIVE,
            "root_trainable_params": NON_NEGATIVE,
            "root_head_params": NON_NEGATIVE,
            "unit_bytes": NON_NEGATIVE,
        },
    ),
    Case(
        "parse_strategy",
        lambda: memory.sharding.parse_strategy,
        kwargs={"value": "fsdp"},
        kinds={"value": NAME},
        names={"value": ("strategy",)},
    ),
    Case(
        "plan_device_map",
        lambda: memory.plan_device_map,
        kwargs={"model": "gpt2", "gpus": ["RTX 3060"], "seq_len": 64},
        kinds=DEVICE_MAP | {"offload": FLAG},
    ),
    Case(
        "evaluate_device_map",
        lambda: memory.device_map.evaluate_device_map,
        kwargs={"model": "gpt2", "device_map": {"": 0}, "gpus": ["RTX 3060"], "seq_len": 64},
        kinds=DEVICE_MAP | {"device_map": Kind("device map", (3, None, "auto", [0], {"": -1}))},
    ),
]
