"""Does a GPT fit my card? The plan, then the same estimate checked on a small model.

Run: python examples/check_gpt_fits.py [--smoke]
"""

import argparse

import torch
import transformers

import torchfit
from torchfit import memory

parser = argparse.ArgumentParser()
parser.add_argument("--smoke", action="store_true", help="small sizes (CI)")
args = parser.parse_args()
transformers.logging.set_verbosity_error()

# 1. The plan for a real model on a real card, from the offline catalog.
plan = torchfit.fits("gpt2", "RTX 3060", mode="train", dtype="bf16", seq_len=1024, batch_size=8)
print(plan)

# 2. The same estimator against real allocations, on a model small enough for a CPU.
config = transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=5000)
model = transformers.GPT2LMHeadModel(config)
batch, seq = (2, 64) if args.smoke else (8, 256)
ids = torch.randint(0, config.vocab_size, (batch, seq))
real = memory.measure_step(model, {"input_ids": ids, "labels": ids}, optimizer="adamw")
predicted = memory.estimate(config, batch_size=batch, seq_len=seq, device="cpu")
error = (predicted.total - real.peak) / real.peak
print(
    f"\nsmall GPT-2 on CPU: measured {torchfit.format_bytes(real.peak)}, "
    f"estimated {torchfit.format_bytes(predicted.total)} ({error:+.1%})"
)
