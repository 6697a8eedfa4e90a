"""Every public callable of torchfit with valid base arguments and a `Kind` per parameter.

tests/test_bad_input.py checks that this table covers every name of every public
``__all__`` (records that torchfit builds and returns are listed in `RECORDS`) and every
parameter of each signature, then calls each with one wrong value at a time.
"""

from __future__ import annotations

import torch

import torchfit
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
    INF,
    MODEL,
    MODULE,
    NAME,
    NAN,
    NON_NEGATIVE,
    POSITIVE,
    REAL,
    SHAPE,
    SIZE,
    TEXT,
    Case,
    Kind,
)
from torchfit import memory, precision, quantize
from torchfit.loaders import MachineBudget, check_shm, diagnose, tune_loader, tuned_loader

#: Records torchfit builds and returns (results, reports, enums): users read them.
RECORDS = frozenset({
    "Plan", "Advice", "ActivationReport", "LayerMemory", "TransformerSpec", "Trace",
    "Measurement", "BatchSizeResult", "BatchTrial", "TrialOutcome", "SimulatedGPU",
    "ModelEntry", "ModelTask", "AllocatorStats", "DeviceMap", "DeviceShare", "Strategy",
    "DType", "NonFiniteCheck", "StepOutcome", "Precision", "PrecisionChoice", "NonFinite",
    "NonFiniteCause", "LoaderReport", "LoaderTrial", "LoaderWarning", "MachineBudget",
    "Bound", "Diagnosis", "QuantType", "Footprint", "FootprintRow", "CATEGORIES",
    "DEFAULT_CUDA_CONTEXT_BYTES", "__version__", "loaders", "memory", "precision",
    "quantize",
})  # fmt: skip


def tiny() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def line() -> memory.AffineEstimate:
    return memory.AffineEstimate(
        memory.MemoryEstimate(weights=1000), memory.MemoryEstimate(activations=10)
    )


def _step(batch_size):
    return batch_size


def _mp_after_backward(dtype: str = "bf16"):
    model = tiny()
    mp = torchfit.MixedPrecision(dtype, device="cpu")
    with mp.autocast():
        loss = model(torch.randn(4, 8)).float().square().mean()
    mp.backward(loss)
    return mp, torch.optim.SGD(model.parameters(), lr=0.1)


def _mp_step(dtype: str = "bf16"):
    mp, opt = _mp_after_backward(dtype)
    return lambda *a, **k: mp.step(*a, **k) if a or "optimizers" in k else mp.step(opt, **k)


def _mp_backward():
    model = tiny()
    mp = torchfit.MixedPrecision("bf16", device="cpu")
    loss = model(torch.randn(4, 8)).square().mean()
    return lambda **k: mp.backward(**{"loss": loss, **k})


def _allocated():
    allocator = memory.CachingAllocator()
    handle = allocator.malloc(1024)
    return lambda handle=handle: allocator.free(handle)


_LOADER = [torch.zeros(2)] * 4
_BUDGET = MachineBudget(4, 4, None, 1, "test", shm_free_bytes=2**30)
_TRAIN = {
    "mode": NAME, "optimizer": NAME, "loss_fn": CALLABLE, "autocast_dtype": AUTOCAST,
    "set_to_none": FLAG, "precision": NAME, "gradient_accumulation_steps": COUNT,
    "keep_output": FLAG, "optimizer_in_backward": FLAG,
}  # fmt: skip
_ESTIMATE = {
    "model": MODEL, "batch_size": COUNT, "seq_len": COUNT, "input_shape": SHAPE,
    "dtype": DTYPE, "mode": NAME, "optimizer": NAME, "gradient_checkpointing": FLAG,
    "attn_implementation": NAME, "mixed_precision": FLAG, "trainable_params": NON_NEGATIVE,
    "precision": NAME, "gradient_accumulation_steps": COUNT, "set_to_none": FLAG,
    "keep_output": FLAG, "optimizer_in_backward": FLAG, "loss_chunk_size": COUNT,
    "lora": FREE, "lora_rank": COUNT, "lora_targets": NAME, "lora_dropout": FRACTION,
    "bitsandbytes_version": NAME, "double_quant": FLAG, "quantize_head": FLAG,
    "base_dtype": DTYPE, "max_new_tokens": COUNT,
}  # fmt: skip
_SHARD = {
    "estimate": Kind("estimate", (1000, "1GB", None, {"weights": 1})),
    "strategy": NAME, "backward_start": Kind("estimate", (1000, "1GB", {"weights": 1})),
    "params": NON_NEGATIVE, "largest_layer_params": NON_NEGATIVE,
    "bucket_bytes": NON_NEGATIVE, "reshard_after_forward": FLAG,
    "offload_optimizer": FLAG, "offload_params": FLAG, "param_bytes": POSITIVE,
    "grad_bytes": POSITIVE, "autocast_copies": NON_NEGATIVE,
}  # fmt: skip
_DEVICE_MAP = {
    "model": MODEL, "gpus": Kind("gpus", ([], "", [""], 2.5, [2.5], True, [-1], [None])),
    "batch_size": COUNT, "seq_len": COUNT, "dtype": DTYPE,
    "bits": Kind("bits", (3, 16, 0, -4, 4.0, "4", True)), "quant_type": NAME,
    "double_quant": FLAG, "kv_cache": FLAG, "attn_implementation": NAME, "reserve": SIZE,
    "context_bytes": SIZE,
}  # fmt: skip
_QUANT = {"bits": Kind("bits", (3, 16, 0, -4, 4.0, "4", True)), "quant_type": NAME,
          "double_quant": FLAG}  # fmt: skip

CASES: list[Case] = [
    # -- torchfit ------------------------------------------------------------------------
    Case(
        "format_bytes",
        lambda: torchfit.format_bytes,
        kwargs={"num_bytes": 1024},
        kinds={"num_bytes": REAL},
    ),
    Case(
        "parse_bytes",
        lambda: torchfit.parse_bytes,
        kwargs={"value": "12GB"},
        kinds={"value": SIZE},
        names={"value": ("size",)},
    ),
    Case(
        "parse_dtype",
        lambda: torchfit.parse_dtype,
        kwargs={"value": "bf16"},
        kinds={"value": DTYPE},
        names={"value": ("dtype",)},
    ),
    Case("gpu", lambda: torchfit.gpu, kwargs={"name": "RTX 3060"}, kinds={"name": CARD}),
    Case(
        "simulate_gpu",
        lambda: torchfit.simulate_gpu,
        kwargs={"gpu_or_bytes": "1GB"},
        kinds={"gpu_or_bytes": CAPACITY, "track": FREE, "used": SIZE},
    ),
    Case(
        "estimate",
        lambda: torchfit.estimate,
        kwargs={"model": "gpt2", "batch_size": 2, "seq_len": 64},
        kinds=_ESTIMATE | {"use_cache": FLAG, "device": NAME, "frozen_base": FLAG},
        bases={"input_shape": {"model": tiny(), "batch_size": 2, "input_shape": (8,)}},
    ),
    Case(
        "fits",
        lambda: torchfit.fits,
        kwargs={"model": "gpt2", "gpu": "RTX 3060", "seq_len": 64},
        kinds={k: v for k, v in _ESTIMATE.items() if k != "mixed_precision"}
        | {
            "gpu": CARD,
            "strategy": NAME,
            "offload_optimizer": FLAG,
            "offload_params": FLAG,
            "param_dtype": DTYPE,
            "gpus_per_node": COUNT,
            "cuda_version": NAME,
            "context_bytes": SIZE,
        },
        bases={
            "input_shape": {"model": "resnet-50", "gpu": "RTX 3060", "input_shape": (3, 64, 64)}
        },
    ),
    Case(
        "find_batch_size",
        lambda: lambda *a, **k: torchfit.find_batch_size(*a, **k)(),
        args=(_step,),
        kwargs={"start": 4, "budget": "1GB"},
        spec=torchfit.find_batch_size,
        kinds={
            "step": CALLABLE,
            "start": COUNT,
            "predict": Kind("predictor", (3, "line", 2.5, [1])),
            "budget": CAPACITY,
            "max_batch_size": COUNT,
            "probe_upward": FLAG,
            "effective_batch_size": COUNT,
            "margin": FRACTION,
            "restore": Kind("restore", (3, "model", 2.5, [3])),
            "warmup": FLAG,
            "max_trials": COUNT,
        },
        names={"margin": ("Margin.fraction",)},  # its own message, kept from before
    ),
    Case(
        "find_nonfinite",
        lambda: torchfit.find_nonfinite,
        kwargs={"model": tiny()},
        kinds={"model": MODULE},
    ),
    Case(
        "measure_peak",
        lambda: torchfit.measure_peak,
        args=(lambda: None,),
        kinds={"fn": CALLABLE, "args": FREE, "track": FREE, "device": DEVICE, "kwargs": FREE},
    ),
    Case(
        "tune_loader",
        lambda: tune_loader,
        kwargs={"dataset": _LOADER, "batch_size": 2, "time_budget": 0.2, "max_workers": 0},
        kinds={
            "dataset": Kind("dataset", (3, 2.5, None, True)),
            "batch_size": COUNT,
            "shuffle": FLAG,
            "time_budget": POSITIVE,
            "device": DEVICE,
            "max_workers": NON_NEGATIVE,
            "dataloader_kwargs": FREE,
        },
    ),
    Case(
        "tuned_loader",
        lambda: tuned_loader,
        kwargs={"dataset": _LOADER, "batch_size": 2, "time_budget": 0.2, "max_workers": 0},
        kinds={
            "dataset": Kind("dataset", (3, 2.5, None, True)),
            "batch_size": COUNT,
            "shuffle": FLAG,
            "time_budget": POSITIVE,
            "device": DEVICE,
            "max_workers": NON_NEGATIVE,
            "dataloader_kwargs": FREE,
        },
    ),
    Case(
        "diagnose",
        lambda: diagnose,
        kwargs={"loader": _LOADER, "step_fn": lambda b: None, "steps": 2, "warmup": 0},
        kinds={
            "loader": Kind("loader", (3, 2.5, None, True)),
            "step_fn": CALLABLE,
            "steps": COUNT,
            "warmup": NON_NEGATIVE,
            "tune": FLAG,
            "time_budget": POSITIVE,
        },
    ),
    Case(
        "check_shm",
        lambda: check_shm,
        kwargs={"num_workers": 2, "prefetch_factor": 2, "batch_bytes": 1024, "machine": _BUDGET},
        kinds={
            "num_workers": NON_NEGATIVE,
            "prefetch_factor": COUNT,
            "batch_bytes": NON_NEGATIVE,
            "machine": Kind("machine", (3, "x", {"cpus": 1})),
        },
    ),
    Case(
        "GPU",
        lambda: torchfit.GPU,
        kwargs={"name": "x", "memory": 2**30},
        kinds={
            "name": TEXT,
            "memory": Kind("memory", (0, -1, 2.5, NAN, "1GB", True)),
            "vendor": TEXT,
            "architecture": TEXT,
            "compute_capability": Kind(
                "capability", ((8,), (8, -1), (8.0, 0), "8.0", 8, (8, 0, 1))
            ),
            "bf16": FLAG,
            "fp8": FLAG,
            "memory_bandwidth_gb_s": POSITIVE,
            "fp16_tflops": POSITIVE,
            "bf16_tflops": POSITIVE,
            "aliases": Kind("aliases", ("x", [3], ("",), 3)),
            "source": Kind("source", (3, None, ["x"])),
            "nvidia_smi_total": Kind("memory", (0, -1, 2.5, NAN, "1GB", True, 2**31)),
        },
    ),
    Case(
        "GPU.custom",
        lambda: torchfit.GPU.custom,
        kwargs={"name": "x", "memory": "8GiB"},
        kinds={
            "name": TEXT,
            "memory": CAPACITY,
            "vendor": TEXT,
            "architecture": TEXT,
            "compute_capability": Kind("capability", ((8,), (8, -1), "8.0", 8)),
            "bf16": FLAG,
            "fp8": FLAG,
            "memory_bandwidth_gb_s": POSITIVE,
            "fp16_tflops": POSITIVE,
            "bf16_tflops": POSITIVE,
            "aliases": Kind("aliases", ("x", [3], ("",), 3)),
            "source": Kind("source", (3, None, ["x"])),
        },
    ),
    Case(
        "MemoryEstimate",
        lambda: torchfit.MemoryEstimate,
        kwargs={"weights": 10},
        kinds={
            **dict.fromkeys(
                (
                    "weights",
                    "gradients",
                    "optimizer",
                    "activations",
                    "kv_cache",
                    "workspace",
                    "overhead",
                    "reserved",
                    "context",
                ),
                NON_NEGATIVE,
            ),
            "device": NAME,
            "notes": Kind("notes", ("x", [3], 3)),
            "layers": Kind("layers", ("x", [3], 3)),
            "peak_at": Kind("peak_at", (3, None, ["x"])),
        },
    ),
    Case(
        "MixedPrecision",
        lambda: torchfit.MixedPrecision,
        kwargs={"dtype": "fp16", "device": "cpu"},
        kinds={
            "dtype": DTYPE,
            "device": DEVICE,
            "accumulate": COUNT,
            "init_scale": POSITIVE,
            "growth_factor": Kind("growth", (1.0, 0.5, 0, -2.0, NAN, INF, "2", True)),
            "backoff_factor": Kind("backoff", (1.0, 0.0, 1.5, -0.5, NAN, INF, "0.5", True)),
            "growth_interval": COUNT,
            "skip_nonfinite": NAME,
        },
    ),
    Case(
        "MixedPrecision.step",
        lambda: _mp_step("bf16"),
        spec=torchfit.MixedPrecision.step,
        kinds={
            "optimizers": Kind("optimizers", (None, 3, "sgd", [], [None], tiny())),
            "scheduler": Kind("scheduler", (3, "cosine", [3])),
            "clip_grad_norm": POSITIVE,
            "flush": FLAG,
            "before_step": CALLABLE,
        },
    ),
    Case(
        "MixedPrecision.step fp16",
        lambda: _mp_step("fp16"),
        spec=torchfit.MixedPrecision.step,
        partial=True,
        kinds={"optimizers": Kind("optimizers", (None, 3, [], [None])), "clip_grad_norm": POSITIVE},
    ),
    Case(
        "MixedPrecision.backward",
        _mp_backward,
        spec=torchfit.MixedPrecision.backward,
        kinds={
            "loss": Kind("loss", (3, 2.5, None, "loss", [1.0])),
            "weight": POSITIVE,
            "retain_graph": FLAG,
        },
    ),
    Case(
        "MixedPrecision.check",
        lambda: torchfit.MixedPrecision("bf16", device="cpu").check,
        kwargs={"model": tiny()},
        kinds={
            "model": MODULE,
            "optimizers": Kind("optimizers", (3, "sgd", [3])),
            "scheduler": Kind("scheduler", (3, "cosine", [3])),
        },
    ),
]

_EVENTS = [("a", 1024), ("a",)]
_E = memory.MemoryEstimate(weights=4000, gradients=4000, optimizer=8000)

CASES += [
    # -- torchfit.memory: estimate ----------------------------------------------------------
    Case(
        "AffineEstimate",
        lambda: memory.AffineEstimate,
        kwargs={"fixed": _E, "per_sample": memory.MemoryEstimate(activations=10)},
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
        "AffineEstimate.max_batch_size",
        lambda: line().max_batch_size,
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
        lambda: memory.attention_bytes,
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
        "describe",
        lambda: memory.describe,
        kwargs={"config": memory.model_config("gpt2")},
        kinds={"config": Kind("config", (3, None, "", 2.5, [1]))},
    ),
    Case(
        "kv_cache_bytes",
        lambda: memory.kv_cache_bytes,
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
        lambda: memory.kv_cache_bytes_for,
        kwargs={"config": "gpt2", "batch_size": 2, "seq_len": 16},
        kinds={"config": MODEL, "batch_size": COUNT, "seq_len": COUNT, "dtype": DTYPE},
    ),
    Case(
        "model_state_bytes",
        lambda: memory.model_state_bytes,
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
        lambda: memory.optimizer_state_bytes,
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
        kinds=_TRAIN
        | {
            "model": MODULE,
            "example_inputs": Kind("inputs", (None,)),
            "device": NAME,
            "progress": FLAG,
            "gpu": CARD,
        },
    ),
    Case(
        "trace_events",
        lambda: memory.trace_events,
        kwargs={"model": tiny(), "example_inputs": torch.randn(2, 8), "optimizer": "sgd"},
        kinds=_TRAIN
        | {
            "model": MODULE,
            "example_inputs": Kind("inputs", (None,)),
            "device": NAME,
            "progress": FLAG,
        },
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
        kinds=_TRAIN
        | {"model": MODULE, "example_inputs": Kind("inputs", (None,)), "device": DEVICE},
    ),
    Case(
        "live_bytes",
        lambda: memory.live_bytes,
        args=(torch.zeros(2),),
        kinds={"objects": FREE, "device": DEVICE},
    ),
    # -- batch size ----------------------------------------------------------------------------
    Case(
        "Margin",
        lambda: memory.Margin,
        kwargs={"fraction": 0.1},
        kinds={"fraction": FRACTION, "reserve": NON_NEGATIVE},
    ),
    Case(
        "Margin.usable",
        lambda: memory.Margin(0.1).usable,
        kwargs={"budget_bytes": 1000},
        kinds={"budget_bytes": NON_NEGATIVE},
    ),
    Case(
        "is_oom",
        lambda: memory.is_oom,
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
        lambda: memory.solve_batch_size,
        kwargs={"line": line(), "budget_bytes": 2000},
        kinds={
            "line": Kind("line", (3, "line", None, 2.5, _E)),
            "budget_bytes": SIZE,
            "margin": FRACTION,
        },
    ),
    # -- catalog --------------------------------------------------------------------------------
    Case(
        "build_model",
        lambda: memory.build_model,
        kwargs={"model": "gpt2"},
        kinds={"model": MODEL, "device": DEVICE, "dtype": DTYPE, "task": NAME},
    ),
    Case(
        "count_parameters",
        lambda: memory.count_parameters,
        kwargs={"model": tiny()},
        kinds={"model": MODULE, "trainable_only": FLAG},
    ),
    Case(
        "current_gpu",
        lambda: memory.current_gpu,
        kwargs={"device": 0},
        base_raises=None if torch.cuda.is_available() else RuntimeError,
        kinds={"device": Kind("device", ("tpu", "", -1, 2.5, True, [0]))},
    ),
    Case("list_gpus", lambda: memory.list_gpus, kinds={"vendor": NAME}),
    Case("list_models", lambda: memory.list_models, kinds={"task": NAME}),
    Case(
        "model_config",
        lambda: memory.model_config,
        kwargs={"model": "gpt2"},
        kinds={"model": MODEL, "trust_remote_code": FLAG},
    ),
    Case("model_entry", lambda: memory.model_entry, kwargs={"name": "gpt2"}, kinds={"name": MODEL}),
    # -- allocator -----------------------------------------------------------------------------
    Case(
        "CachingAllocator",
        lambda: memory.CachingAllocator,
        kwargs={"capacity": 2**30},
        kinds={
            "capacity": Kind("capacity", (0, -1, 2.5, NAN, "1GB", True)),
            "max_split_size": NON_NEGATIVE,
            "roundup_power2_divisions": NON_NEGATIVE,
        },
    ),
    Case(
        "CachingAllocator.malloc",
        lambda: memory.CachingAllocator().malloc,
        kwargs={"nbytes": 1024},
        kinds={"nbytes": NON_NEGATIVE},
    ),
    Case(
        "CachingAllocator.free",
        _allocated,
        spec=memory.CachingAllocator.free,
        kinds={"handle": Kind("handle", (-1, 2.5, "0", None, 99))},
    ),
    Case(
        "cublas_workspace_bytes",
        lambda: memory.cublas_workspace_bytes,
        kinds={"compute_capability": Kind("capability", ("", "x.y", (-1, 0), True, [], NAN))},
    ),
    Case(
        "cuda_context_bytes",
        lambda: memory.cuda_context_bytes,
        kinds={
            "gpu": Kind("gpu", ("", 42, 2.5, True, [1])),
            "lazy_loading": FLAG,
            "cuda_version": Kind("cuda version", ("", "twelve", -1.0, (12,), True, NAN)),
        },
    ),
    Case(
        "measure_cuda_context",
        lambda: memory.measure_cuda_context,
        base_raises=None if torch.cuda.is_available() else RuntimeError,
        kinds={"device": Kind("device", ("", -1, 2.5, True, [1], NAN))},
    ),
    Case(
        "replay",
        lambda: memory.replay,
        kwargs={"events": _EVENTS},
        kinds={
            "events": Kind("events", (3, None, [("a", -1)], [("a", 2.5)], [(1, 2, 3)])),
            "capacity": Kind("capacity", (0, -1, 2.5, NAN, "1GB", True)),
            "max_split_size": NON_NEGATIVE,
            "roundup_power2_divisions": NON_NEGATIVE,
        },
    ),
    Case(
        "round_request",
        lambda: memory.round_request,
        kwargs={"nbytes": 1000},
        kinds={"nbytes": NON_NEGATIVE, "roundup_power2_divisions": NON_NEGATIVE},
    ),
    Case(
        "segment_size",
        lambda: memory.segment_size,
        kwargs={"nbytes": 1000},
        kinds={"nbytes": NON_NEGATIVE},
    ),
    Case(
        "to_device",
        lambda: memory.to_device,
        kwargs={"estimate": _E},
        kinds={
            "estimate": Kind("estimate", (3, None, "1GB", {"weights": 1})),
            "gpu": Kind("gpu", ("", 42, 2.5, True, [1])),
            "events": Kind("events", (3, [("a", -1)], [("a", 2.5)])),
            "context_bytes": SIZE,
            "workspace": FLAG,
            "fragmentation": FRACTION,
            "lazy_loading": FLAG,
            "cuda_version": Kind("cuda version", ("", "twelve", -1.0, (12,), True)),
        },
    ),
    # -- several GPUs ----------------------------------------------------------------------------
    Case(
        "deepspeed_zero_bytes",
        lambda: memory.deepspeed_zero_bytes,
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
        lambda: memory.min_gpus,
        kwargs={"estimate": _E, "gpu_memory_bytes": 6000, "strategy": "fsdp", "params": 1000},
        kinds=_SHARD | {"gpu_memory_bytes": Kind("bytes", (0, -1, 2.5, NAN, "6000", True))},
    ),
    Case(
        "shard_estimate",
        lambda: memory.shard_estimate,
        kwargs={
            "estimate": _E,
            "strategy": "fsdp",
            "world_size": 2,
            "params": 1000,
            "largest_layer_params": 100,
        },
        kinds=_SHARD | {"world_size": COUNT, "gpus_per_node": COUNT},
    ),
    Case(
        "parse_strategy",
        lambda: memory.parse_strategy,
        kwargs={"value": "fsdp"},
        kinds={"value": NAME},
        names={"value": ("strategy",)},
    ),
    Case(
        "plan_device_map",
        lambda: memory.plan_device_map,
        kwargs={"model": "gpt2", "gpus": ["RTX 3060"], "seq_len": 64},
        kinds=_DEVICE_MAP | {"offload": FLAG},
    ),
    Case(
        "evaluate_device_map",
        lambda: memory.evaluate_device_map,
        kwargs={"model": "gpt2", "device_map": {"": 0}, "gpus": ["RTX 3060"], "seq_len": 64},
        kinds=_DEVICE_MAP | {"device_map": Kind("device map", (3, None, "auto", [0], {"": -1}))},
    ),
    # -- precision ---------------------------------------------------------------------------------
    Case(
        "choose_precision",
        lambda: precision.choose_precision,
        kwargs={"device": "cpu"},
        kinds={"dtype": DTYPE, "device": DEVICE},
    ),
    Case(
        "parse_precision",
        lambda: precision.parse_precision,
        kwargs={"value": "bf16"},
        kinds={"value": DTYPE},
        names={"value": ("precision", "dtype")},
    ),
    Case(
        "NonFiniteProbe",
        lambda: precision.NonFiniteProbe,
        kwargs={"model": tiny()},
        kinds={"model": MODULE},
    ),
    # -- loaders -----------------------------------------------------------------------------------
    Case(
        "LoaderConfig",
        lambda: torchfit.loaders.LoaderConfig,
        kwargs={"num_workers": 2},
        kinds={
            "num_workers": NON_NEGATIVE,
            "prefetch_factor": COUNT,
            "pin_memory": FLAG,
            "persistent_workers": FLAG,
        },
    ),
    # -- quantize ----------------------------------------------------------------------------------
    Case("QuantSettings", lambda: quantize.QuantSettings, kwargs={}, kinds=_QUANT),
    Case(
        "load_quantized",
        lambda: quantize.load_quantized,
        kwargs={"path_or_model_or_id": tiny(), "device_map": None},
        kinds=_QUANT
        | {
            "path_or_model_or_id": MODEL,
            "compute_dtype": DTYPE,
            "skip_modules": Kind("skip", ("lm_head", 3, [3], [""])),
            "device_map": FREE,
            "model_class": FREE,
            "from_pretrained_kwargs": FREE,
        },
    ),
    Case(
        "quantize_model",
        lambda: quantize.quantize_model,
        kwargs={"model": tiny()},
        kinds=_QUANT
        | {
            "model": MODULE,
            "compute_dtype": DTYPE,
            "skip_modules": Kind("skip", ("lm_head", 3, [3], [""])),
            "device": DEVICE,
        },
    ),
    Case(
        "footprint", lambda: quantize.footprint, kwargs={"model": tiny()}, kinds={"model": MODULE}
    ),
    Case(
        "quantized_footprint",
        lambda: quantize.quantized_footprint,
        kwargs={"config_or_name": "gpt2", "device": "cpu"},
        kinds=_QUANT
        | {
            "config_or_name": MODEL,
            "skip_modules": Kind("skip", ("lm_head", 3, [3], [""])),
            "dtype": DTYPE,
            "model_class": FREE,
            "device": NAME,
            "cpu_packed": FLAG,
        },
    ),
    Case(
        "weights_footprint",
        lambda: quantize.weights_footprint,
        kwargs={"config_or_name": "gpt2", "dtype": "nf4", "device": "cpu"},
        kinds={"config_or_name": MODEL, "dtype": DTYPE, "device": NAME, "double_quant": FLAG},
    ),
]
