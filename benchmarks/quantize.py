"""torchfit.quantize, measured: bytes predicted vs real, load overhead, and quality.

Run:  python benchmarks/quantize.py [--threads 1]   (10-20 minutes on 2 CPU cores)
      python benchmarks/quantize.py --quick           (fewer training steps and runs)

1. Footprint: tiny GPT-2, Llama and Qwen2 models (byte-level, hidden 128) are trained for
   a few hundred steps on a fixed text, saved, and loaded in fp32, bf16, LLM.int8, NF4,
   NF4 + double quant and FP4 + double quant. Predicted bytes (`quantized_footprint`,
   before loading) against real bytes (`footprint`, after loading), and transformers'
   `get_memory_footprint()`, which leaves out the quantization statistics.
2. Published configs, predicted only (nothing is downloaded or loaded).
3. Load time of `load_quantized` against the plain transformers call with the same
   `BitsAndBytesConfig` (the merged skip list included), on an 87M-parameter
   Llama-shaped model, with and without a user skip list: interleaved runs end to end,
   and the wrapper's pre-work timed alone (reading the config, which from_pretrained
   then reuses; with a skip list, also the meta-device model that checks and merges it).
4. Quality on held-out text: perplexity, top-1 agreement with fp32 and the relative
   error of the logits.

The text is CPython's own Lib/textwrap.py (fixed for a Python version): the first 80%
for training, the rest for evaluation.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import textwrap
import time
import warnings
from pathlib import Path
from typing import Any

import bitsandbytes
import torch
import transformers
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

from torchfit._bnb.selection import QuantSettings, select_layers
from torchfit._core.units import format_bytes
from torchfit.quantize import footprint, load_quantized, quantized_footprint, weights_footprint
from torchfit.quantize import hf as _quantize_hf
from torchfit.quantize.build import bnb_config

warnings.filterwarnings("ignore")
transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

SEQ = 128
SETTINGS: dict[str, dict[str, object] | None] = {
    "fp32": None,
    "bf16": None,
    "int8": {"bits": 8},
    "nf4": {"bits": 4, "double_quant": False},
    "nf4+dq": {"bits": 4},
    "fp4+dq": {"bits": 4, "quant_type": "fp4"},
}


def configs() -> dict[str, transformers.PretrainedConfig]:
    common = {"vocab_size": 256, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}
    return {
        "gpt2": transformers.GPT2Config(n_layer=4, n_embd=128, n_head=4, n_positions=SEQ, **common),
        "llama": transformers.LlamaConfig(
            hidden_size=128,
            intermediate_size=512,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=SEQ,
            **common,
        ),
        "qwen2": transformers.Qwen2Config(
            hidden_size=128,
            intermediate_size=512,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=SEQ,
            **common,
        ),
    }


def text_bytes() -> tuple[torch.Tensor, torch.Tensor]:
    data = torch.tensor(list(Path(textwrap.__file__).read_bytes()), dtype=torch.long)
    cut = int(len(data) * 0.8)
    return data[:cut], data[cut:]


def train(config: transformers.PretrainedConfig, data: torch.Tensor, steps: int) -> torch.nn.Module:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(steps):
        starts = torch.randint(0, len(data) - SEQ - 1, (16,), generator=gen)
        batch = torch.stack([data[s : s + SEQ] for s in starts])
        loss = model(batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    return model.eval()


def evaluate(model: torch.nn.Module, data: torch.Tensor) -> torch.Tensor:
    windows = data[: (len(data) // SEQ) * SEQ].view(-1, SEQ)
    with torch.no_grad():
        return torch.cat([model(w[None]).logits.float() for w in windows])


def perplexity(logits: torch.Tensor, data: torch.Tensor) -> float:
    windows = data[: (len(data) // SEQ) * SEQ].view(-1, SEQ)
    loss = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1)
    )
    return float(loss.exp())


def load(path: Path, setting: str) -> torch.nn.Module:
    options = SETTINGS[setting]
    if options is None:
        dtype = torch.bfloat16 if setting == "bf16" else torch.float32
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return load_quantized(path, **options)  # type: ignore[arg-type]


def predicted_bytes(path: Path, setting: str) -> int:
    options = SETTINGS[setting]
    if options is None:
        return weights_footprint(path, setting, device="cpu").total
    return quantized_footprint(path, device="cpu", **options).total  # type: ignore[arg-type]


def table(title: str, head: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    print(f"\n### {title}\n")
    print("| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        cells = [
            str(c).rjust(w) if i else str(c).ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        print("| " + " | ".join(cells) + " |")


def part_footprint_and_quality(root: Path, steps: int) -> None:
    train_data, eval_data = text_bytes()
    fp_rows, q_rows = [], []
    for arch, config in configs().items():
        path = root / arch
        train(config, train_data, steps).save_pretrained(path)
        reference = evaluate(load(path, "fp32"), eval_data)
        for setting in SETTINGS:
            model = load(path, setting)
            real = footprint(model)  # before any forward: a CPU forward may repack 4-bit
            predicted = predicted_bytes(path, setting)
            logits = evaluate(model, eval_data)
            params = real.parameters
            fp_rows.append(
                [
                    arch,
                    setting,
                    f"{params:,}",
                    f"{predicted:,}",
                    f"{real.total:,}",
                    f"{predicted - real.total:+,}",
                    f"{real.total * 8 / params:.3f}",
                    f"{real.quantized_bits_per_parameter:.3f}"
                    if real.quantized_parameters
                    else "-",
                    f"{model.get_memory_footprint():,}",
                ]
            )
            rel = float((logits - reference).norm() / reference.norm())
            top1 = float((logits.argmax(-1) == reference.argmax(-1)).float().mean())
            q_rows.append(
                [
                    arch,
                    setting,
                    f"{perplexity(logits, eval_data):.3f}",
                    f"{top1:.4f}",
                    f"{rel:.4f}",
                ]
            )
    table(
        "Bytes: predicted before loading vs held after loading (CPU)",
        [
            "model",
            "weights",
            "params",
            "predicted B",
            "real B",
            "diff",
            "bits/param",
            "bits/quantized param",
            "get_memory_footprint()",
        ],
        fp_rows,
    )
    table(
        f"Quality on held-out text ({len(eval_data):,} bytes of Lib/textwrap.py, "
        f"models trained {steps} steps)",
        ["model", "weights", "perplexity", "top-1 = fp32", "rel. logit error"],
        q_rows,
    )


def part_published_configs() -> None:
    llama = transformers.LlamaConfig
    models = {
        "GPT-2 124M": transformers.GPT2Config(dtype="float32"),  # as its checkpoint is
        "Llama-2-7B": llama(
            hidden_size=4096,
            intermediate_size=11008,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=32,
            vocab_size=32000,
            dtype="float16",
        ),
        "Llama-3-8B": llama(
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            vocab_size=128256,
            dtype="bfloat16",
        ),
        "Llama-2-70B": llama(
            hidden_size=8192,
            intermediate_size=28672,
            num_hidden_layers=80,
            num_attention_heads=64,
            num_key_value_heads=8,
            vocab_size=32000,
            dtype="float16",
        ),
    }
    rows = []
    for name, config in models.items():
        start = time.perf_counter()
        cells = [name, str(config.dtype)]
        for options in ({"bits": 8}, {"bits": 4, "double_quant": False}, {"bits": 4}):
            fp = quantized_footprint(config, device="cuda", **options)  # type: ignore[arg-type]
            cells.append(f"{format_bytes(fp.total)} ({fp.bits_per_parameter:.2f})")
        full = weights_footprint(config, "bf16")
        cells.insert(2, f"{format_bytes(full.total)} ({full.bits_per_parameter:.2f})")
        cells.append(f"{(time.perf_counter() - start) / 4 * 1000:.0f} ms")
        rows.append(cells)
    table(
        "Published configs, predicted on CUDA (512-byte blocks), total (bits/param)",
        ["model", "unquantized dtype", "bf16", "int8", "nf4", "nf4+dq", "time per prediction"],
        rows,
    )


def prework_seconds(path: Path, options: dict[str, object], *, skip: list[str]) -> float:
    """What load_quantized does before from_pretrained (config; with a skip list, also
    the meta-device model and the checked, merged skip list)."""
    start = time.perf_counter()
    config = _quantize_hf.load_config(str(path), {})
    cls = _quantize_hf.model_class_for(config)
    dtype = _quantize_hf.load_dtype(config, {})
    settings = QuantSettings(**options)  # type: ignore[arg-type]
    selection = (
        select_layers(_quantize_hf.build_meta(config, cls, dtype), settings, skip) if skip else None
    )
    bnb_config(settings, selection, torch.float32)
    return time.perf_counter() - start


def part_load_time(root: Path, runs: int) -> None:
    config = transformers.LlamaConfig(
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=6,
        num_attention_heads=12,
        num_key_value_heads=4,
        vocab_size=32000,
    )
    path = root / "timing"
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    rows = []
    for setting in ("int8", "nf4+dq"):
        for skip in ([], ["mlp.down_proj"]):
            options = {**(SETTINGS[setting] or {}), "skip_modules": skip}
            rows.append(_load_row(path, setting, options, runs))
    params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(path).parameters())
    table(
        f"Load time, {params / 1e6:.0f}M-parameter Llama on CPU, {runs} interleaved runs "
        f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)",
        [
            "weights",
            "user skip list",
            "transformers min / median (s)",
            "load_quantized min / median (s)",
            "ratio of mins",
            "ratio of medians",
            "pre-work alone",
        ],
        rows,
    )


def _load_row(path: Path, setting: str, options: dict[str, Any], runs: int) -> list[str]:
    """load_quantized against from_pretrained with the config it ended up using."""
    saved = load_quantized(path, **options).config.quantization_config
    # the plain call gets the identical settings, the merged skip list included
    plain_config = BitsAndBytesConfig(
        **{
            k: getattr(saved, k)
            for k in (
                "load_in_4bit",
                "load_in_8bit",
                "bnb_4bit_quant_type",
                "bnb_4bit_use_double_quant",
                "bnb_4bit_compute_dtype",
                "llm_int8_skip_modules",
            )
        }
    )
    AutoModelForCausalLM.from_pretrained(path, quantization_config=plain_config)  # warm-up
    ours, plain = [], []
    for _ in range(runs):  # interleaved, so drifts hit both sides alike
        start = time.perf_counter()
        load_quantized(path, **options)
        ours.append(time.perf_counter() - start)
        start = time.perf_counter()
        AutoModelForCausalLM.from_pretrained(path, quantization_config=plain_config)
        plain.append(time.perf_counter() - start)
    settings = {k: v for k, v in options.items() if k != "skip_modules"}
    skip = list(options["skip_modules"])
    extra = min(prework_seconds(path, settings, skip=skip) for _ in range(runs))
    return [
        setting,
        ", ".join(skip) or "-",
        f"{min(plain):.3f} / {statistics.median(plain):.3f}",
        f"{min(ours):.3f} / {statistics.median(ours):.3f}",
        f"{min(ours) / min(plain):.3f}",
        f"{statistics.median(ours) / statistics.median(plain):.3f}",
        f"{extra * 1000:.1f} ms",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and runs")
    parser.add_argument(
        "--threads", type=int, default=0, help="torch threads (default: torch's choice)"
    )
    parser.add_argument("--runs", type=int, default=0, help="load-time runs (default 15)")
    parser.add_argument(
        "--only",
        choices=("bytes", "published", "load"),
        help="run one part: bytes and quality, published configs, or load time",
    )
    args = parser.parse_args()
    if args.threads:  # one thread avoids OpenMP spin-waits on a busy, shared machine
        torch.set_num_threads(args.threads)
    print(
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
        f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"bitsandbytes {bitsandbytes.__version__}, Python {sys.version.split()[0]}, "
        f"{torch.get_num_threads()} threads, CPU AVX512-BF16: "
        f"{bool(bitsandbytes.functional.has_avx512bf16())}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if args.only in (None, "bytes"):
            part_footprint_and_quality(root, steps=60 if args.quick else 200)
        if args.only in (None, "published"):
            part_published_configs()
        if args.only in (None, "load"):
            part_load_time(root, runs=args.runs or (3 if args.quick else 15))


if __name__ == "__main__":
    main()
