"""The estimators against real CUDA: allocated, reserved, device totals, context.

Run on a machine with a CUDA GPU (about 3 minutes on one GPU, 1 with ``--quick``):

    python benchmarks/gpu_check.py            # prints Markdown tables
    python benchmarks/gpu_check.py --quick    # three steps only

First the CUDA context: ``torch.cuda.mem_get_info`` after the first tensor, less what the
allocator reserved, against `cuda_context_bytes` for this CUDA version. Then, for each
step (fp32; CUDA autocast; pure bf16; gradient accumulation; the output kept through
backward; eager attention under fp16 autocast; a CNN), the real step's
``max_memory_allocated`` and ``max_memory_reserved`` (`measure_step` on the GPU) beside
the analytic estimate and the CUDA-target trace of the same step, and the device total
(reserved + context, what nvidia-smi shows) beside `to_device`'s. Then ``generate``
(``max_new_tokens``): a long prompt (the prefill holds the peak) and a short one with many
new tokens (the last decoding step does), ``max_memory_allocated`` against `estimate`.
Last, loading the same model in nf4 and int8 with bitsandbytes and running one token,
where quantizing the weights on the GPU at load is the peak; the nf4 model loaded in
fp16 but computing in bf16 over a 2048-token prompt (bitsandbytes' dequantized copy);
and a hand-written AMP step (``torch.autocast("cuda")`` around the forward) through
`trace_step`, against the same step on the GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import sys
import tempfile
from typing import Any

import torch
import transformers

from torchfit import format_bytes
from torchfit.memory import (
    cuda_context_bytes,
    current_gpu,
    estimate,
    measure_cuda_context,
    measure_peak,
    measure_step,
    to_device,
    trace,
    trace_step,
)
from torchfit.memory.catalog import build_model

transformers.logging.set_verbosity_error()


@dataclasses.dataclass(frozen=True)
class Step:
    """One step to measure: the model, the batch and the knobs the estimators take."""

    label: str
    config: Any
    batch: int
    seq: int | None
    knobs: dict[str, Any]


def _steps(*, quick: bool) -> list[Step]:
    gpt2 = transformers.GPT2Config(n_layer=6, n_embd=512, n_head=8, vocab_size=32000)
    llama = transformers.LlamaConfig(
        hidden_size=512,
        intermediate_size=1376,
        num_hidden_layers=6,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=32000,
        max_position_embeddings=2048,
    )
    bert = transformers.BertConfig(
        hidden_size=512,
        intermediate_size=2048,
        num_hidden_layers=6,
        num_attention_heads=8,
        vocab_size=30522,
        attn_implementation="eager",
    )
    resnet = transformers.ResNetConfig(
        embedding_size=64,
        hidden_sizes=[64, 128, 256, 512],
        depths=[2, 2, 2, 2],
        layer_type="basic",
        num_labels=1000,
    )
    steps = [
        Step("GPT-2 6L-512", gpt2, 8, 512, {"precision": "32-true"}),
        Step("GPT-2 6L-512, CUDA autocast", gpt2, 16, 512, {"precision": "bf16-mixed"}),
        Step("Llama 6L-512 GQA, pure bf16", llama, 8, 1024, {"precision": "bf16-true"}),
    ]
    if not quick:
        steps += [
            Step(
                "Llama, pure bf16, 4 accumulation steps",
                llama,
                4,
                1024,
                {"precision": "bf16-true", "gradient_accumulation_steps": 4},
            ),
            Step(
                "Llama, output kept through backward",
                llama,
                8,
                1024,
                {"precision": "bf16-true", "keep_output": True},
            ),
            Step("BERT 6L-512 eager, fp16 autocast", bert, 16, 256, {"precision": "16-mixed"}),
            Step("ResNet-18-like, 224", resnet, 32, None, {"precision": "32-true"}),
        ]
    return steps


def _inputs(step: Step) -> Any:
    if step.seq is None:
        return torch.randn(step.batch, 3, 224, 224, device="cuda")
    ids = torch.randint(0, step.config.vocab_size, (step.batch, step.seq), device="cuda")
    return {"input_ids": ids, "labels": ids}


def _err(predicted: int, real: int) -> str:
    return f"{(predicted - real) / real:+.1%}" if real else "n/a"


def _context() -> int:
    real = measure_cuda_context()  # creates the context, cuBLAS handle included
    modelled = cuda_context_bytes(cuda_version=torch.version.cuda)
    loading = os.environ.get("CUDA_MODULE_LOADING", "(default: LAZY)")
    print(
        f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
        f"CUDA {torch.version.cuda}, CUDA_MODULE_LOADING={loading}\n\n"
        f"| CUDA context | measured | torchfit | err |\n|---|---|---|---|\n"
        f"| after the first matmul | {format_bytes(real)} | {format_bytes(modelled)} | "
        f"{_err(modelled, real)} |\n"
    )
    return real


def _row(step: Step, context: int) -> str:
    model = build_model(step.config, device="cuda", dtype="fp32")
    inputs = _inputs(step)
    shape = {"seq_len": step.seq} if step.seq else {"input_shape": (3, 224, 224)}
    real = measure_step(model, inputs, optimizer="adamw", device="cuda", **step.knobs)
    card = current_gpu()
    analytic = to_device(
        estimate(step.config, batch_size=step.batch, device="cuda", **shape, **step.knobs),
        gpu=card,
        context_bytes=context,
    )
    traced = trace(model, inputs, optimizer="adamw", device="cuda", gpu=card, **step.knobs)
    reserved = real.reserved or 0
    device = context + reserved
    shape_text = f"b{step.batch}" + (f" s{step.seq}" if step.seq else "")
    row = (
        f"| {step.label} {shape_text} | {format_bytes(real.peak)} | "
        f"{_err(analytic.total, real.peak)} | {_err(traced.total, real.peak)} | "
        f"{format_bytes(reserved)} | {_err(analytic.reserved, reserved)} | "
        f"{_err(traced.reserved, reserved)} | {format_bytes(device)} | "
        f"{_err(analytic.device_total, device)} |"
    )
    del model, inputs, real
    gc.collect()
    torch.cuda.empty_cache()
    return row


def _generation_rows() -> list[str]:
    """``model.generate`` in bf16: real ``max_memory_allocated`` against `estimate`."""
    llama = _steps(quick=True)[2].config
    model = build_model(llama, device="cuda", dtype="bf16").eval()
    rows = []
    for prompt, new in ((2048, 64), (64, 1024)):
        ids = torch.randint(0, llama.vocab_size, (4, prompt), device="cuda")
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        with torch.no_grad():
            model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)
        real = torch.cuda.max_memory_allocated()
        found = estimate(
            llama, batch_size=4, seq_len=prompt, dtype="bf16", mode="inference", max_new_tokens=new
        )
        rows.append(
            f"| generate b4, prompt {prompt}, {new} new | {format_bytes(real)} | "
            f"{_err(found.total, real)} | {found.peak_at} |"
        )
    del model
    return rows


def _loading_rows(folder: str) -> list[str]:
    """A 4/8-bit load of the Llama and one token: real ``max_memory_allocated`` vs `estimate`.

    bitsandbytes quantizes each weight on the GPU as it loads; for one token the loading
    moment is the estimate's peak (``peak_at="loading"``).
    """
    llama = _steps(quick=True)[2].config
    transformers.LlamaForCausalLM(llama).to(torch.bfloat16).save_pretrained(folder)
    rows = []
    for dtype, config in (
        ("nf4", transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4")),
        ("int8", transformers.BitsAndBytesConfig(load_in_8bit=True)),
    ):
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        model = transformers.LlamaForCausalLM.from_pretrained(
            folder, quantization_config=config, dtype=torch.bfloat16, device_map="cuda"
        )
        with torch.no_grad():
            model(torch.zeros(1, 1, dtype=torch.long, device="cuda"))
        real = torch.cuda.max_memory_allocated()
        found = estimate(llama, batch_size=1, seq_len=1, dtype=dtype, mode="inference")
        rows.append(
            f"| load in {dtype}, one token | {format_bytes(real)} | "
            f"{_err(found.total, real)} | {found.peak_at} |"
        )
        del model
    return rows


def _dequantized_row(folder: str) -> str:
    """nf4 quantized from fp16, computed in bf16: a 2048-token forward against `estimate`."""
    llama = _steps(quick=True)[2].config
    config = transformers.BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16
    )
    model = transformers.LlamaForCausalLM.from_pretrained(
        folder, quantization_config=config, dtype=torch.float16, device_map="cuda"
    )
    ids = torch.zeros(1, 2048, dtype=torch.long, device="cuda")
    with torch.no_grad():
        model(ids)  # warm-up: cuBLAS handles, lazily loaded kernels
        gc.collect()
        torch.cuda.reset_peak_memory_stats()
        model(ids)
    real = torch.cuda.max_memory_allocated()
    found = estimate(
        llama, batch_size=1, seq_len=2048, dtype="nf4", mode="inference", base_dtype="fp16"
    )
    del model
    return (
        f"| nf4 from fp16, bf16 compute, prompt 2048 | {format_bytes(real)} | "
        f"{_err(found.total, real)} | {found.peak_at} |"
    )


def _amp_step(model: Any, optimizer: Any, ids: torch.Tensor) -> None:
    """The AMP loop people write: autocast around the forward, scaled backward."""
    scaler = torch.amp.GradScaler("cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(input_ids=ids, labels=ids).loss
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()


def _amp_row() -> str:
    """`trace_step` of `_amp_step` against the step on the GPU (after one warm-up step)."""
    gpt2 = _steps(quick=True)[0].config
    model = build_model(gpt2, device="cuda", dtype="fp32")
    optimizer = torch.optim.AdamW(model.parameters())
    ids = torch.randint(0, gpt2.vocab_size, (8, 512), device="cuda")
    traced = trace_step(_amp_step, model, optimizer, ids, device="cuda")
    _amp_step(model, optimizer, ids)
    real = measure_peak(_amp_step, model, optimizer, ids, track=(model, optimizer, ids))
    del model, optimizer
    return (
        f"| trace_step, GPT-2 6L-512 AMP step b8 s512 | {format_bytes(real.peak)} | "
        f"{_err(traced.estimate.total, real.peak)} | {traced.estimate.peak_at} |"
    )


def main() -> int:
    """Print the context table, then one row per step."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("benchmarks/gpu_check.py needs a CUDA GPU; none is available here")
        return 1
    context = _context()
    print(
        "| step | allocated (real) | analytic err | trace err | reserved (real) | "
        "analytic err | trace err | device (real) | analytic err |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for step in _steps(quick=args.quick):
        print(_row(step, context), flush=True)
    print("\n| generate; a 4/8-bit load (Llama 6L-512 GQA) | allocated (real) | err | peak at |")
    print("|---|---|---|---|")
    for row in _generation_rows():
        print(row, flush=True)
    with tempfile.TemporaryDirectory() as folder:
        for row in _loading_rows(folder):
            print(row, flush=True)
        print(_dequantized_row(folder), flush=True)
    print(_amp_row(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
