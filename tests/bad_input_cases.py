"""Every public callable of torchfit with valid base arguments and a `Kind` per parameter.

tests/test_bad_input.py checks that this table covers every name of every public
``__all__`` (records that torchfit builds and returns are listed in `RECORDS`) and every
parameter of each signature, then calls each with one wrong value at a time.
"""

from __future__ import annotations

import torchfit
from bad_input_common import (
    BUDGET,
    ESTIMATE,
    LOADER,
    QUANT,
    mp_backward,
    mp_step,
    step,
    tiny,
)
from bad_input_memory import MEMORY
from bad_inputs import (
    CALLABLE,
    CAPACITY,
    CARD,
    COUNT,
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
    SIZE,
    TEXT,
    Case,
    Kind,
)
from torchfit import precision, quantize
from torchfit.loaders import check_shm, diagnose, tuned_loader, tuned_loader_and_report

#: Records torchfit builds and returns (results, reports, enums): users read them.
RECORDS = frozenset({
    "Plan", "Advice", "ActivationReport", "LayerMemory", "TransformerSpec", "Trace",
    "Measurement", "BatchSizeResult", "BatchTrial", "TrialOutcome", "SimulatedGPU",
    "ModelEntry", "ModelTask", "AllocatorStats", "DeviceMap", "DeviceShare", "Strategy",
    "DType", "NonFiniteCheck", "StepOutcome", "Precision", "PrecisionChoice", "NonFinite",
    "NonFiniteCause", "LoaderReport", "LoaderTrial", "LoaderWarning", "MachineBudget",
    "Bound", "Diagnosis", "QuantType", "Footprint", "FootprintRow", "CATEGORIES",
    "DEFAULT_CUDA_CONTEXT_BYTES", "__version__", "loaders", "memory", "precision",
    "quantize", "host", "speed", "StepTime", "Comparison",
})  # fmt: skip


_TOP: list[Case] = [
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
        kinds={"model": ESTIMATE["model"]},
        partial=True,  # **keywords: torchfit.Step's fields, checked by the Step case
    ),
    Case(
        "Step",
        lambda: torchfit.Step,
        kwargs={"batch_size": 2, "seq_len": 64},
        kinds={
            k: v
            for k, v in ESTIMATE.items()
            # optimizer may be a factory, lora_targets are the model's names: estimate's
            if k not in {"model", "dtype", "mixed_precision", "optimizer", "lora_targets"}
        }
        | {"use_cache": FLAG, "device": NAME, "frozen_base": FLAG, "kbit_prepare": FLAG},
        bases={"input_shape": {"batch_size": 2, "input_shape": (8,)}},
        partial=True,  # lora, quantization: objects, checked in tests/memory/test_step.py
    ),
    Case(
        "step_time",
        lambda: torchfit.step_time,
        kwargs={"model": "gpt2", "gpu_name": "H200", "batch_size": 2, "seq_len": 64},
        kinds={
            "model": ESTIMATE["model"],
            "gpu_name": CARD,
            "step": Kind("step", (3, "train", {"batch_size": 2}, [1])),
            "channels_last": FLAG,
        },
        partial=True,  # **keywords: torchfit.Step's fields, checked by the Step case
    ),
    Case(
        "compare_gpus",
        lambda: torchfit.compare_gpus,
        kwargs={"model": "gpt2", "gpus": ["H200"], "seq_len": 64},
        kinds={
            "model": ESTIMATE["model"],
            "gpus": Kind("cards", ("", 42, [], ["no such card"], True)),
            "step": Kind("step", (3, "train", {"batch_size": 2}, [1])),
            "at_largest_batch": FLAG,
            "tokens": POSITIVE,
            "samples": POSITIVE,
            "price_per_hour": Kind("prices", (3, {"H200": -1.0}, {"H200": "x"}, {"nope": 1.0})),
            "channels_last": FLAG,
        },
        names={"price_per_hour": ("price",)},
        partial=True,  # **keywords: torchfit.Step's fields, checked by the Step case
    ),
    Case(
        "fits",
        lambda: torchfit.fits,
        kwargs={"model": "gpt2", "gpu": "RTX 3060", "seq_len": 64},
        kinds={
            "model": ESTIMATE["model"],
            "step": Kind("step", (3, "train", {"batch_size": 2}, [1])),
            "gpu": CARD,
            "strategy": NAME,
            "offload_optimizer": FLAG,
            "offload_params": FLAG,
            "param_dtype": DTYPE,
            "gpus_per_node": COUNT,
            "cuda_version": NAME,
            "context_bytes": SIZE,
        },
        partial=True,  # **keywords: torchfit.Step's fields, checked by the Step case
    ),
    Case(
        "fits (time, machine)",
        lambda: torchfit.fits,
        kwargs={
            "model": "gpt2",
            "gpu": "RTX 3060",
            "seq_len": 64,
            "time": True,
            "machine": "desktop-3060",
        },
        kinds={
            "time": FLAG,
            "machine": NAME,
            "loader": Kind("loader", (3, "fast", {"per_sample": 1.0})),
        },
        partial=True,  # the rest: the "fits" case
    ),
    Case(
        "host_fits",
        lambda: torchfit.host_fits,
        args=("gpt2", "desktop-3060"),
        kinds={
            "model": MODEL,
            "machine_or_name": NAME,
            "dtype": DTYPE,
            "bits": Kind("bits", (3, 0, 16, -4, 2.5, "4", True)),
            "device_map": Kind("device map", ("", " ", "tpu", "disk", 2.5, True, [0])),
            "checkpoint": Kind("checkpoint", ("", " ", 3, 2.5, True, [1], "/nonexistent/qq")),
            "mmap": FLAG,
            "workers": Kind("worker memory", (3, "x", 2.5, True, [1])),
            "offloaded": NON_NEGATIVE,
            "cost": Kind("sample cost", (3, "x", 2.5, True, [1])),
            "batch_size": COUNT,
            "step_seconds": POSITIVE,
            "baseline": NON_NEGATIVE,
        },
        names={"machine_or_name": ("machine",)},
    ),
    Case(
        "find_batch_size",
        lambda: lambda *a, **k: torchfit.find_batch_size(*a, **k)(),
        args=(step,),
        kwargs={"start": 4, "budget": "1GB"},
        spec=torchfit.find_batch_size,
        kinds={
            "step": CALLABLE,
            "start": COUNT,
            "predict": Kind("predictor", (3, "line", 2.5, [1])),
            "budget": CAPACITY,
            "batch_limit": COUNT,
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
        "tuned_loader_and_report",
        lambda: tuned_loader_and_report,
        kwargs={"dataset": LOADER, "batch_size": 2, "time_budget": 0.2, "max_workers": 0},
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
        kwargs={"dataset": LOADER, "batch_size": 2, "time_budget": 0.2, "max_workers": 0},
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
        kwargs={"loader": LOADER, "step_fn": lambda b: None, "steps": 2, "warmup": 0},
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
        kwargs={"num_workers": 2, "prefetch_factor": 2, "batch_bytes": 1024, "machine": BUDGET},
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
            "sm_count": COUNT,
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
            "sm_count": COUNT,
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
                    "oom_line",
                ),
                NON_NEGATIVE,
            ),
            "device": NAME,
            "notes": Kind("notes", ("x", [3], 3)),
            "layers": Kind("layers", ("x", [3], 3)),
            "peak_at": Kind("peak_at", (3, None, ["x"])),
            "outline": Kind("outline", (3, "x", [3])),
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
        lambda: mp_step("bf16"),
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
        lambda: mp_step("fp16"),
        spec=torchfit.MixedPrecision.step,
        partial=True,
        kinds={"optimizers": Kind("optimizers", (None, 3, [], [None])), "clip_grad_norm": POSITIVE},
    ),
    Case(
        "MixedPrecision.backward",
        mp_backward,
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

_REST: list[Case] = [
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
    Case("QuantSettings", lambda: quantize.QuantSettings, kwargs={}, kinds=QUANT),
    Case(
        "load_quantized",
        lambda: quantize.load_quantized,
        kwargs={"path_or_model_or_id": tiny(), "device_map": None},
        kinds=QUANT
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
        kinds=QUANT
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
        kinds=QUANT
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

CASES: list[Case] = [*_TOP, *MEMORY, *_REST]
