"""The GPU validation harness: real allocations, reserved memory, context and step times.

Run on a machine with a CUDA GPU (about 3 minutes on an H200; no torchfit code runs in the
measured path, so the numbers are the card's own):

    python benchmarks/gpu_check.py OUTDIR            # measure on the GPU
    python benchmarks/gpu_check.py OUTDIR --dry      # tiny sizes on CPU: checks the code paths
    python benchmarks/gpu_report.py OUTDIR/gpu_check.jsonl   # torchfit's predictions beside them

What it writes in OUTDIR:

- ``gpu_check.jsonl``: one JSON record per case. The first (``ENV``) names the card, driver,
  torch, CUDA and library versions and the CUDA context at each stage of a fresh process
  (before any kernel, after the first matmul, a convolution, a bf16 SDPA); each other
  record holds the exact recipe (model config, batch, sequence, precision, optimizer,
  checkpointing, LoRA, quantization) beside what was measured: the allocated and reserved
  peaks of a warm-up step and of the measured step (peaks reset between them), the bytes
  allocated before each, what the device has in use after (``mem_get_info``), and the
  median of timed steps (warm-up first, each step synchronised, no memory history); for
  the cases marked ``profile``, one more step under ``torch.profiler``: the GPU's busy
  time (against the timed median: how long it waited for the host) and the heaviest
  kernels by name with their summed times.
- ``gpu_check.md``: the same as a Markdown table.
- ``snapshots.tar.gz``: ``torch.cuda.memory._dump_snapshot()`` of each measured step (every
  allocation and free with its size, and the allocator's segments): open one at
  pytorch.org/memory_viz, or replay it through `torchfit.memory.allocator`.

Cases run in priority order and each stands alone (an error is recorded, the run goes
on); past ``--budget`` seconds the rest are recorded as skipped. The capped-card cases set
``torch.cuda.set_per_process_memory_fraction`` and find the true largest batch by real
steps (doubling, then bisection), which is what the finder and ``max_batch_size`` are
judged against.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gc
import json
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

TIMED_STEPS = 5


# ----------------------------------------------------------------------------- models
LLAMA_1B = {
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "head_dim": 64,
}
# name -> (transformers config class, keyword arguments): the published sizes.
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "gpt2": ("GPT2Config", {}),
    "gpt2-medium": ("GPT2Config", {"n_layer": 24, "n_embd": 1024, "n_head": 16}),
    "llama-3.2-1b": ("LlamaConfig", {**LLAMA_1B, "tie_word_embeddings": True}),
    "llama-3.2-1b-untied": ("LlamaConfig", {**LLAMA_1B, "tie_word_embeddings": False}),
    "llama-3.2-3b": (
        "LlamaConfig",
        {
            **LLAMA_1B,
            "hidden_size": 3072,
            "num_hidden_layers": 28,
            "num_attention_heads": 24,
            "head_dim": 128,
            "tie_word_embeddings": True,
        },
    ),
    "qwen2.5-0.5b": (
        "Qwen2Config",
        {
            "hidden_size": 896,
            "intermediate_size": 4864,
            "num_hidden_layers": 24,
            "num_attention_heads": 14,
            "num_key_value_heads": 2,
            "vocab_size": 151936,
            "max_position_embeddings": 32768,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "tie_word_embeddings": True,
        },
    ),
    "qwen3-0.6b": (
        "Qwen3Config",
        {
            "hidden_size": 1024,
            "intermediate_size": 3072,
            "num_hidden_layers": 28,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "vocab_size": 151936,
            "max_position_embeddings": 40960,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "tie_word_embeddings": True,
        },
    ),
    "bert-base": ("BertConfig", {}),
    "llama-3.1-8b": (
        "LlamaConfig",
        {
            **LLAMA_1B,
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_hidden_layers": 32,
            "head_dim": 128,
            "tie_word_embeddings": False,
        },
    ),
    "gemma-2-2b": (
        "Gemma2Config",
        {
            "hidden_size": 2304,
            "intermediate_size": 9216,
            "num_hidden_layers": 26,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "head_dim": 256,
            "vocab_size": 256000,
            "sliding_window": 4096,
            "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": 30.0,
            "query_pre_attn_scalar": 256,
            "tie_word_embeddings": True,
            "attn_implementation": "eager",
        },
    ),
}
# --dry: the same architectures, tiny.
SHRINK = {
    "num_hidden_layers": 2,
    "n_layer": 2,
    "hidden_size": 64,
    "n_embd": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "n_head": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "head_dim": 16,
}


@dataclasses.dataclass(frozen=True)
class Case:
    """One measured run, written beside its numbers so predictions can be made anywhere."""

    id: str
    kind: str  # "train", "forward", "generate", "capped"
    model: str  # a CONFIGS name or "torchvision/<name>"
    batch: int
    seq: int | None = None
    task: str = "causal"  # causal, mlm (transformers); vision
    weights: str = "fp32"  # the dtype the model is built in: fp32 or bf16
    autocast: str | None = None  # torch.autocast's dtype around the forward: bf16, fp16
    optimizer: str = "adamw"  # adamw (foreach), adamw-fused, adamw-loop, adamw-8bit, sgd-momentum
    gradient_checkpointing: bool = False
    lora: dict[str, Any] | None = None  # LoraConfig keywords; base dtype from precision
    qlora: bool = False  # nf4 + double quant, bf16 compute, prepare_model_for_kbit_training
    new_tokens: int = 0  # generate
    cap_gib: float | None = None  # capped: per-process limit for the allocator
    profile: bool = False  # one more step under torch.profiler: GPU busy time, top kernels


_ALL_LINEAR = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "target_modules": "all-linear"}

CASES: list[Case] = [
    Case("F1_gpt2_fp32_adamw_s1024_cap16", "capped", "gpt2", 0, 1024, cap_gib=16),
    Case(
        "F2_llama1b_bf16true_gc_s2048_cap20",
        "capped",
        "llama-3.2-1b",
        0,
        2048,
        weights="bf16",
        gradient_checkpointing=True,
        cap_gib=20,
    ),
    Case(
        "F3_resnet50_fp32_sgdm_cap8",
        "capped",
        "torchvision/resnet50",
        0,
        optimizer="sgd-momentum",
        task="vision",
        cap_gib=8,
    ),
    Case(
        "Q1_llama1b_untied_qlora16_gc_b4_s2048",
        "train",
        "llama-3.2-1b-untied",
        4,
        2048,
        autocast="bf16",
        gradient_checkpointing=True,
        qlora=True,
        lora=_ALL_LINEAR,
        profile=True,
    ),
    Case(
        "L1_llama1b_untied_lora16_bf16base_autocast_b4_s2048",
        "train",
        "llama-3.2-1b-untied",
        4,
        2048,
        weights="bf16",
        autocast="bf16",
        lora=_ALL_LINEAR,
    ),
    Case(
        "T1_llama3b_bf16true_gc_b4_s4096",
        "train",
        "llama-3.2-3b",
        4,
        4096,
        weights="bf16",
        gradient_checkpointing=True,
    ),
    Case("T2_qwen05b_bf16mixed_b8_s1024", "train", "qwen2.5-0.5b", 8, 1024, autocast="bf16"),
    Case("T3_gpt2medium_fp32_b8_s1024", "train", "gpt2-medium", 8, 1024),
    Case(
        "T4_bert_mlm_16mixed_scaler_b32_s512",
        "train",
        "bert-base",
        32,
        512,
        task="mlm",
        autocast="fp16",
        profile=True,
    ),
    Case(
        "T5_resnet101_fp32_sgdm_b64",
        "train",
        "torchvision/resnet101",
        64,
        task="vision",
        optimizer="sgd-momentum",
        profile=True,
    ),
    Case(
        "T6_vitl16_bf16mixed_adamw_b32",
        "train",
        "torchvision/vit_l_16",
        32,
        task="vision",
        autocast="bf16",
        profile=True,
    ),
    Case(
        "T7_qwen3_06b_bf16true_adamw8bit_b8_s2048",
        "train",
        "qwen3-0.6b",
        8,
        2048,
        weights="bf16",
        optimizer="adamw-8bit",
        profile=True,
    ),
    Case("T8_gpt2_fp32_adamwloop_b8_s1024", "train", "gpt2", 8, 1024, optimizer="adamw-loop"),
    Case(  # run a's worst step time (timed 42-48 ms, 34 ms in another run): profiled
        "T11_vitb16_bf16mixed_adamw_b64",
        "train",
        "torchvision/vit_b_16",
        64,
        task="vision",
        autocast="bf16",
        profile=True,
    ),
    Case(
        "T9_llama1b_bf16true_fused_b4_s2048",
        "train",
        "llama-3.2-1b",
        4,
        2048,
        weights="bf16",
        optimizer="adamw-fused",
    ),
    # The second run: tighter caps over more recipes, Gemma 2, and an 8B QLoRA.
    Case(
        "F4_qwen05b_bf16mixed_s1024_cap24",
        "capped",
        "qwen2.5-0.5b",
        0,
        1024,
        autocast="bf16",
        cap_gib=24,
    ),
    Case(
        "F5_llama1b_untied_qlora_gc_s2048_cap12",
        "capped",
        "llama-3.2-1b-untied",
        0,
        2048,
        autocast="bf16",
        gradient_checkpointing=True,
        qlora=True,
        lora=_ALL_LINEAR,
        cap_gib=12,
    ),
    Case("F6_gpt2medium_fp32_s1024_cap20", "capped", "gpt2-medium", 0, 1024, cap_gib=20),
    Case(
        "F7_resnet101_fp32_sgdm_cap12",
        "capped",
        "torchvision/resnet101",
        0,
        task="vision",
        optimizer="sgd-momentum",
        cap_gib=12,
    ),
    Case(
        "F8_bert_mlm_fp16_s512_cap10",
        "capped",
        "bert-base",
        0,
        512,
        task="mlm",
        autocast="fp16",
        cap_gib=10,
    ),
    Case(
        "F9_llama3b_bf16true_gc_s4096_cap40",
        "capped",
        "llama-3.2-3b",
        0,
        4096,
        weights="bf16",
        gradient_checkpointing=True,
        cap_gib=40,
    ),
    Case("T10_gemma2_2b_eager_bf16true_b2_s2048", "train", "gemma-2-2b", 2, 2048, weights="bf16"),
    Case(  # no closed form: the meta-device pass with checkpointing, over a 4-bit base
        "Q4_gemma2_2b_qlora16_gc_b2_s2048",
        "train",
        "gemma-2-2b",
        2,
        2048,
        autocast="bf16",
        gradient_checkpointing=True,
        qlora=True,
        lora=_ALL_LINEAR,
    ),
    Case(
        "Q3_llama8b_untied_qlora16_gc_b1_s2048",
        "train",
        "llama-3.1-8b",
        1,
        2048,
        autocast="bf16",
        gradient_checkpointing=True,
        qlora=True,
        lora=_ALL_LINEAR,
        profile=True,
    ),
    Case("I1_qwen05b_forward_bf16_b4_s8192", "forward", "qwen2.5-0.5b", 4, 8192),
    Case(
        "I2_llama3b_generate_bf16_b4_p2048_n128",
        "generate",
        "llama-3.2-3b",
        4,
        2048,
        new_tokens=128,
    ),
    Case(  # cuDNN's workspaces in 16 bits (torchfit.memory.kernels.cudnn: padded NHWC copies)
        "T12_resnet50_bf16mixed_sgdm_b128",
        "train",
        "torchvision/resnet50",
        128,
        task="vision",
        optimizer="sgd-momentum",
        autocast="bf16",
    ),
]


# ----------------------------------------------------------------------------- the run
class Run:
    """The device, the output folder and the clock of one harness run."""

    def __init__(self, out: str, *, dry: bool, budget_s: float) -> None:
        self.out = out
        self.dry = dry
        self.device = "cpu" if dry else "cuda"
        self.budget_s = budget_s
        self.t0 = time.time()
        self.snaps = Path(out) / "snaps"
        self.snaps.mkdir(parents=True, exist_ok=True)
        self.log = (Path(out) / "gpu_check.jsonl").open("w")

    def emit(self, record: dict[str, Any]) -> None:
        record["t"] = round(time.time() - self.t0, 1)
        self.log.write(json.dumps(record) + "\n")
        self.log.flush()
        print(json.dumps(record)[:400], flush=True)

    def sync(self) -> None:
        if not self.dry:
            torch.cuda.synchronize()

    def clean(self) -> None:
        gc.collect()
        if not self.dry:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()

    def stats(self) -> dict[str, int]:
        if self.dry:
            return {"alloc": 0, "reserved": 0, "peak_alloc": 0, "peak_reserved": 0}
        return {
            "alloc": torch.cuda.memory_allocated(),
            "reserved": torch.cuda.memory_reserved(),
            "peak_alloc": torch.cuda.max_memory_allocated(),
            "peak_reserved": torch.cuda.max_memory_reserved(),
        }

    def used_on_device(self) -> int:
        if self.dry:
            return 0
        free, total = torch.cuda.mem_get_info()
        return total - free

    @contextlib.contextmanager
    def snapshot(self, case_id: str) -> Iterator[None]:
        """Record the allocator's history over the block and dump it as a snapshot."""
        if self.dry:
            yield
            return
        torch.cuda.memory._record_memory_history(  # noqa: SLF001
            max_entries=400000, context="alloc", stacks="python"
        )
        try:
            yield
        finally:
            torch.cuda.memory._dump_snapshot(str(self.snaps / f"{case_id}.pickle"))  # noqa: SLF001
            torch.cuda.memory._record_memory_history(enabled=None)  # noqa: SLF001


# ----------------------------------------------------------------------------- building
def hf_config(name: str, *, dry: bool) -> Any:
    import transformers  # noqa: PLC0415

    cls, kwargs = CONFIGS[name]
    if dry:  # shrunk before the config checks itself (Gemma 2's per-layer layer_types)
        kwargs = {**kwargs, **{k: v for k, v in SHRINK.items() if k in kwargs}}
    config = getattr(transformers, cls)(**kwargs)
    if dry:
        for key, value in SHRINK.items():
            if hasattr(config, key):
                setattr(config, key, value)
        if isinstance(getattr(config, "layer_types", None), list):
            config.layer_types = config.layer_types[: config.num_hidden_layers]
    return config


def build(run: Run, case: Case, dtype: torch.dtype) -> tuple[torch.nn.Module, Any]:
    """The case's model on the device with random weights (no download), and its config."""
    torch.manual_seed(0)
    if case.model.startswith("torchvision/"):
        import torchvision  # noqa: PLC0415

        with torch.device(run.device):
            return getattr(torchvision.models, case.model.split("/", 1)[1])(weights=None), None
    import transformers  # noqa: PLC0415

    config = hf_config(case.model, dry=run.dry)
    cls = {"causal": transformers.AutoModelForCausalLM, "mlm": transformers.AutoModelForMaskedLM}
    with torch.device(run.device):
        model = cls[case.task].from_config(config, dtype=dtype)
    return model, config


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def weights_dtype(case: Case) -> torch.dtype:
    return DTYPES[case.weights]


def autocast_dtype(case: Case) -> torch.dtype | None:
    return DTYPES[case.autocast] if case.autocast else None


def make_optimizer(case: Case, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    trained = [p for p in params if p.requires_grad]
    if case.optimizer == "sgd-momentum":
        return torch.optim.SGD(trained, lr=0.01, momentum=0.9)
    if case.optimizer == "adamw-8bit":
        import bitsandbytes  # noqa: PLC0415

        return bitsandbytes.optim.AdamW8bit(trained, lr=1e-5)  # type: ignore[no-any-return]
    if case.optimizer == "adamw-fused":
        return torch.optim.AdamW(trained, lr=1e-5, fused=True)
    if case.optimizer == "adamw-loop":
        return torch.optim.AdamW(trained, lr=1e-5, foreach=False)
    return torch.optim.AdamW(trained, lr=1e-5)  # foreach on CUDA: PyTorch's default


def make_batch(run: Run, case: Case, config: Any, batch: int) -> Any:
    g = torch.Generator(device="cpu").manual_seed(1)
    if case.task == "vision":
        size = 224
        x = torch.randn(batch, 3, size, size, generator=g).to(run.device)
        y = torch.randint(0, 1000, (batch,), generator=g).to(run.device)
        return (x, y)
    seq = 32 if run.dry else case.seq
    assert seq is not None
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=g).to(run.device)
    return {"input_ids": ids, "labels": ids}


def lora_model(case: Case, model: torch.nn.Module) -> torch.nn.Module:
    import peft  # noqa: PLC0415

    assert case.lora is not None
    config = peft.LoraConfig(task_type="CAUSAL_LM", **case.lora)
    return peft.get_peft_model(model, config)  # type: ignore[no-any-return]


def qlora_model(run: Run, case: Case) -> tuple[torch.nn.Module, Any, dict[str, Any]]:
    """Save the bf16 model, load it in nf4 (double quant, bf16 compute), prepare, adapt."""
    import peft  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    model, config = build(run, case, torch.bfloat16)
    folder = tempfile.mkdtemp()
    model.save_pretrained(folder)
    del model
    run.clean()
    quant = transformers.BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )
    before = run.stats()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, quantization_config=quant, dtype=torch.bfloat16, device_map=run.device
    )
    run.sync()
    load = {"before": before, "after": run.stats()}
    model.config.use_cache = False
    model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
    load["after_prepare"] = run.stats()
    return lora_model(case, model), config, load


# ----------------------------------------------------------------------------- steps
def train_step(case: Case, model: Any, batch: Any, opt: Any, scaler: Any) -> None:
    dtype = autocast_dtype(case)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ctx = torch.autocast(device, dtype=dtype) if dtype else contextlib.nullcontext()
    with ctx:
        if case.task == "vision":
            x, y = batch
            loss = F.cross_entropy(model(x), y)
        else:
            loss = model(**batch).loss
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    else:
        loss.backward()
        opt.step()
    opt.zero_grad(set_to_none=True)


def timed(run: Run, fn: Callable[[], None], steps: int = TIMED_STEPS) -> dict[str, Any]:
    """Median of ``steps`` synchronised runs of ``fn`` (warmed up by the caller)."""
    times = []
    for _ in range(steps):
        run.sync()
        start = time.perf_counter()
        fn()
        run.sync()
        times.append(round(time.perf_counter() - start, 5))
    return {"step_times": times, "step_median_s": sorted(times)[len(times) // 2]}


def profiled(run: Run, fn: Callable[[], None], top: int = 30) -> dict[str, Any]:
    """One run of ``fn`` under torch.profiler: the GPU's busy time and its heaviest kernels.

    ``gpu_busy_s`` is the union of the kernels' intervals: against the step's unprofiled
    median it says how long the GPU waited (for the host's launches, Python, a sync). The
    kernels are grouped by name with their summed time and count, so a prediction can be
    checked kernel class by kernel class. The profiled step's own wall time is longer
    than an unprofiled one (the profiler's host overhead).
    """
    from torch.autograd import DeviceType  # noqa: PLC0415
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

    activities = [ProfilerActivity.CPU] + ([] if run.dry else [ProfilerActivity.CUDA])
    run.sync()
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        fn()
        run.sync()
        wall = time.perf_counter() - start
    device = DeviceType.CPU if run.dry else DeviceType.CUDA
    kernels = [e for e in prof.events() if e.device_type == device and not e.cpu_children]
    spans = sorted((e.time_range.start, e.time_range.end) for e in kernels)
    busy, reach = 0.0, float("-inf")
    for begin, end in spans:  # the union of the intervals, in microseconds
        busy += max(0.0, end - max(begin, reach))
        reach = max(reach, end)
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        row = by_name.setdefault(e.name[:160], [0.0, 0])
        row[0] += e.time_range.end - e.time_range.start
        row[1] += 1
    heaviest = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "profiled_wall_s": round(wall, 5),
        "gpu_busy_s": round(busy / 1e6, 5),
        "kernels": len(kernels),
        "top": [{"name": n, "us": round(t, 1), "count": c} for n, (t, c) in heaviest],
    }


def train_model(run: Run, case: Case) -> tuple[Any, Any, dict[str, Any]]:
    """The case's model ready to train (checkpointing, LoRA, QLoRA applied), its config."""
    extra: dict[str, Any] = {}
    if case.qlora:
        model, config, extra["load"] = qlora_model(run, case)
    else:
        model, config = build(run, case, weights_dtype(case))
        if case.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        if case.lora:
            model = lora_model(case, model)
    if config is not None:
        model.config.use_cache = False
    model.train()
    return model, config, extra


def measure_train(run: Run, case: Case) -> dict[str, Any]:
    model, config, extra = train_model(run, case)
    batch = make_batch(run, case, config, 2 if run.dry else case.batch)
    opt = make_optimizer(case, list(model.parameters()))
    scaler = torch.amp.GradScaler(run.device) if case.autocast == "fp16" else None
    params = list(model.parameters())
    extra["params"] = sum(p.numel() for p in params)
    extra["trainable"] = sum(p.numel() for p in params if p.requires_grad)
    extra["fp32_params"] = sum(p.numel() for p in params if p.dtype == torch.float32)
    if config is not None:
        extra["config"] = config.to_dict()
        extra["attn"] = model.config._attn_implementation  # noqa: SLF001

    step = functools.partial(train_step, case, model, batch, opt, scaler)

    run.clean()
    before1 = run.stats()
    step()
    run.sync()
    step1 = run.stats()
    gc.collect()
    if not run.dry:
        torch.cuda.reset_peak_memory_stats()
    before2 = run.stats()
    with run.snapshot(case.id):
        step()
        run.sync()
    step2 = run.stats()
    used = run.used_on_device()
    times = timed(run, step)
    if case.profile:
        extra["profile"] = profiled(run, step)
    del model, opt, batch, scaler
    return {
        "before_step1": before1,
        "step1": step1,
        "before_step2": before2,
        "step2": step2,
        "device_used_after": used,
        **times,
        **extra,
    }


def measure_forward(run: Run, case: Case) -> dict[str, Any]:
    model, config = build(run, case, torch.bfloat16)
    model.eval()
    ids = make_batch(run, case, config, 2 if run.dry else case.batch)["input_ids"]
    with torch.no_grad():
        model(ids[:, :16], use_cache=True)  # warm-up: handles, kernels
        run.clean()
        before = run.stats()
        with run.snapshot(case.id):
            out = model(ids, use_cache=True)
            run.sync()
        after = run.stats()
        del out
        times = timed(run, lambda: model(ids, use_cache=True), steps=3)
    return {"before": before, "after": after, "config": config.to_dict(), **times}


def measure_generate(run: Run, case: Case) -> dict[str, Any]:
    model, config = build(run, case, torch.bfloat16)
    model.eval()
    ids = make_batch(run, case, config, 2 if run.dry else case.batch)["input_ids"]
    new = 4 if run.dry else case.new_tokens
    with torch.no_grad():
        model.generate(ids[:, :16], max_new_tokens=2, min_new_tokens=2, do_sample=False)
        run.clean()
        before = run.stats()
        with run.snapshot(case.id):
            start = time.perf_counter()
            model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)
            run.sync()
            took = time.perf_counter() - start
        after = run.stats()
    return {"before": before, "after": after, "config": config.to_dict(), "generate_s": took}


def _fits(run: Run, case: Case, model: Any, opt: Any, *, config: Any, batch: int) -> bool:
    """Two real steps at ``batch`` from a clean cache: True when neither runs out."""
    try:
        data = make_batch(run, case, config, batch)
        for _ in range(2):
            train_step(case, model, data, opt, None)
        run.sync()
    except torch.OutOfMemoryError:
        ok = False
    else:
        ok = True
    data = None
    opt.zero_grad(set_to_none=True)
    run.clean()
    return ok


def _peaks(run: Run, case: Case, model: Any, opt: Any, *, config: Any, batch: int) -> Any:
    """Allocated and reserved peaks of the second of two steps at ``batch`` (clean start)."""
    data = make_batch(run, case, config, batch)
    train_step(case, model, data, opt, None)
    run.sync()
    if not run.dry:
        torch.cuda.reset_peak_memory_stats()
    train_step(case, model, data, opt, None)
    run.sync()
    found = run.stats()
    data = None
    run.clean()
    return found


def measure_capped(run: Run, case: Case) -> dict[str, Any]:
    """The true largest batch under a per-process cap: doubling, then bisection."""
    model, config, _ = train_model(run, case)
    opt = make_optimizer(case, list(model.parameters()))
    train_step(case, model, make_batch(run, case, config, 1), opt, None)  # optimizer state
    run.clean()
    total = torch.cuda.get_device_properties(0).total_memory if not run.dry else 0
    cap = int((case.cap_gib or 0) * 2**30)
    if not run.dry:
        torch.cuda.set_per_process_memory_fraction(cap / total)
    trials: list[tuple[int, bool]] = []
    try:
        good, bad = 0, None
        size = 1
        while bad is None:  # doubling
            ok = _fits(run, case, model, opt, config=config, batch=size)
            trials.append((size, ok))
            if ok:
                good, size = size, size * 2
            else:
                bad = size
            if run.dry and size > 4:
                bad = size
        while bad - good > 1:  # bisection
            mid = (good + bad) // 2
            ok = _fits(run, case, model, opt, config=config, batch=mid)
            trials.append((mid, ok))
            good, bad = (mid, bad) if ok else (good, mid)
        capped = _peaks(run, case, model, opt, config=config, batch=good)
    finally:
        if not run.dry:
            torch.cuda.set_per_process_memory_fraction(1.0)
    free = _peaks(run, case, model, opt, config=config, batch=good)
    return {
        "cap_bytes": cap,
        "largest_batch": good,
        "trials": trials,
        "at_largest_capped": capped,
        "at_largest_uncapped": free,
        "model_bytes_before": run.stats()["alloc"],
        "config": None if config is None else config.to_dict(),
    }


MEASURE = {
    "train": measure_train,
    "forward": measure_forward,
    "generate": measure_generate,
    "capped": measure_capped,
}


# ----------------------------------------------------------------------------- context
def environment(run: Run) -> dict[str, Any]:
    """Versions, and the CUDA context at each stage of this fresh process."""
    env: dict[str, Any] = {
        "case": "ENV",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "dry": run.dry,
        "cuda_module_loading": os.environ.get("CUDA_MODULE_LOADING", "(default)"),
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "(default)"),
    }
    for name in ("transformers", "peft", "bitsandbytes", "torchvision", "accelerate"):
        try:
            env[name] = __import__(name).__version__
        except Exception as e:  # noqa: BLE001 - a missing extra is recorded, not fatal
            env[name] = "missing: " + repr(e)[:100]
    if run.dry:
        return env
    env.update(context_stages())
    with contextlib.suppress(Exception):
        query = ["--query-gpu=driver_version,name,memory.total", "--format=csv,noheader"]
        smi = subprocess.run(  # noqa: S603 - a fixed command line
            ["nvidia-smi", *query],  # noqa: S607 - wherever the driver put it
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
        env["nvidia_smi"] = smi.stdout.strip()
    return env


def context_stages() -> dict[str, Any]:
    """Device memory in use outside the allocator after each first use of a library."""
    props = torch.cuda.get_device_properties(0)
    out: dict[str, Any] = {
        "gpu": props.name,
        "total_memory": props.total_memory,
        "sm_count": props.multi_processor_count,
        "capability": f"{props.major}.{props.minor}",
        "cudnn": torch.backends.cudnn.version(),
    }

    def outside() -> int:
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        return total - free - torch.cuda.memory_reserved()

    torch.cuda.init()
    x = torch.ones(1, device="cuda")
    out["context_first_tensor"] = outside()
    a = torch.randn(1024, 1024, device="cuda")
    (a @ a).sum().item()
    out["context_after_fp32_matmul"] = outside()
    b = a.bfloat16()
    (b @ b).float().sum().item()
    out["context_after_bf16_matmul"] = outside()
    conv = torch.nn.Conv2d(3, 8, 3).cuda()
    conv(torch.randn(2, 3, 32, 32, device="cuda")).sum().backward()
    out["context_after_conv"] = outside()
    q = torch.randn(2, 8, 256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    out["context_after_sdpa"] = outside()
    torch.cuda.reset_peak_memory_stats()
    del x, a, b, conv, q
    torch.cuda.empty_cache()
    return out


def eager_context() -> dict[str, Any]:
    """The context with ``CUDA_MODULE_LOADING=EAGER`` (every kernel loaded at start)."""
    code = (
        "import torch,json;torch.ones(1,device='cuda');a=torch.randn(64,64,device='cuda');"
        "(a@a).sum().item();f,t=torch.cuda.mem_get_info();"
        "print(json.dumps(t-f-torch.cuda.memory_reserved()))"
    )
    env = {**os.environ, "CUDA_MODULE_LOADING": "EAGER"}
    done = subprocess.run(  # noqa: S603 - this interpreter, a fixed program
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=45,
        check=False,
    )
    if done.returncode:
        return {"case": "ENV_EAGER", "error": done.stderr[-600:]}
    return {"case": "ENV_EAGER", "context_after_fp32_matmul": json.loads(done.stdout)}


# ----------------------------------------------------------------------------- output
def _gib(n: Any) -> str:
    return f"{n / 2**30:.2f}" if isinstance(n, int) else "-"


def markdown(records: list[dict[str, Any]]) -> str:
    """The run as Markdown: environment, context stages, one row per case."""
    env = records[0]
    head = (
        f"GPU: {env.get('gpu', 'cpu (dry run)')}, {env.get('nvidia_smi', '')}; torch "
        f"{env['torch']}, CUDA {env['cuda']}, transformers {env.get('transformers')}, "
        f"peft {env.get('peft')}, bitsandbytes {env.get('bitsandbytes')}"
    )
    lines = [
        head,
        "",
        "| CUDA context (outside the allocator) | MiB |",
        "|---|---|",
    ]
    lines += [
        f"| {key.removeprefix('context_').replace('_', ' ')} | {value / 2**20:.1f} |"
        for key, value in env.items()
        if key.startswith("context_") and isinstance(value, int)
    ]
    lines += [
        "",
        "| case | allocated peak GiB | reserved peak GiB | device used GiB | step s |",
        "|---|---|---|---|---|",
    ]
    for rec in records[1:]:
        if "error" in rec or "skipped" in rec:
            lines.append(f"| {rec['case']} | {rec.get('error', rec.get('skipped'))[:80]} | | | |")
        elif rec.get("kind") == "capped":
            lines.append(
                f"| {rec['case']} | largest batch {rec['largest_batch']} under "
                f"{_gib(rec['cap_bytes'])} GiB | | | |"
            )
        elif "step2" in rec:
            s = rec["step2"]
            lines.append(
                f"| {rec['case']} | {_gib(s['peak_alloc'])} | {_gib(s['peak_reserved'])} | "
                f"{_gib(rec['device_used_after'])} | {rec['step_median_s']:.4f} |"
            )
        elif "after" in rec:
            a = rec["after"]
            t = rec.get("step_median_s", rec.get("generate_s", 0.0))
            lines.append(
                f"| {rec['case']} | {_gib(a['peak_alloc'])} | {_gib(a['peak_reserved'])} | "
                f"- | {t:.4f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="folder for gpu_check.jsonl, gpu_check.md, snapshots")
    parser.add_argument("--dry", action="store_true", help="tiny sizes on CPU")
    parser.add_argument("--budget", type=float, default=210.0, help="seconds for all cases")
    parser.add_argument("--only", nargs="*", default=(), help="case ids (prefixes) to run")
    args = parser.parse_args()
    if not args.dry and not torch.cuda.is_available():
        print("benchmarks/gpu_check.py needs a CUDA GPU (or --dry for a CPU check)")
        return 1
    run = Run(args.out, dry=args.dry, budget_s=args.budget)
    import transformers  # noqa: PLC0415

    transformers.logging.set_verbosity_error()
    records = [environment(run)]
    run.emit(records[0])
    for case in CASES:
        if args.only and not any(case.id.startswith(p) for p in args.only):
            continue
        record: dict[str, Any] = {"case": case.id, **dataclasses.asdict(case)}
        if time.time() - run.t0 > run.budget_s:
            record["skipped"] = "time budget"
        else:
            try:
                record.update(MEASURE[case.kind](run, case))
            except Exception as e:  # noqa: BLE001 - one case's failure is data, not the end
                record["error"] = repr(e)[:600]
                record["trace"] = traceback.format_exc()[-2000:]
        run.clean()
        run.emit(record)
        records.append(record)
    if not run.dry and time.time() - run.t0 < run.budget_s + 30:
        records.append(eager_context())
        run.emit(records[-1])
    (Path(args.out) / "gpu_check.md").write_text(markdown(records))
    with tarfile.open(Path(args.out) / "snapshots.tar.gz", "w:gz") as tar:
        tar.add(run.snaps, arcname="snapshots")
    print(markdown(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
