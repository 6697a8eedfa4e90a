"""Does a GPT fit my card? The plan (analytic), the same step traced, then a real check.

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
card = torchfit.gpu("RTX 3060")
batch, seq = 8, (256 if args.smoke else 1024)

# 1. The plan, from the offline catalog's config: closed forms, instant.
plan = torchfit.fits("gpt2", card, mode="train", dtype="bf16", seq_len=seq, batch_size=batch)
print(plan)

# 2. The same step traced: the real transformers model built on the meta device (no
#    memory), forward + loss + backward + AdamW run on fake tensors with CUDA's rules.
gpt2 = memory.catalog.build_model("gpt2")
ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
traced = memory.trace(
    gpt2, {"input_ids": ids, "labels": ids}, autocast_dtype=torch.bfloat16, device="cuda"
)
print(f"\n{'GPT-2, ' + card.name:<40}{'analytic':>12}{'traced':>12}")
for label, field in (("allocated peak", "total"), ("nvidia-smi", "device_total")):
    a, t = getattr(plan.estimate, field), getattr(traced, field)
    print(f"{label:<40}{torchfit.format_bytes(a):>12}{torchfit.format_bytes(t):>12}")
fit = ["fits" if e.device_total <= card.memory else "no" for e in (plan.estimate, traced)]
print(f"{'fits?':<40}{fit[0]:>12}{fit[1]:>12}")

# 3. Both estimators against real allocations, on a model small enough for a CPU.
config = transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=5000)
model = transformers.GPT2LMHeadModel(config)
batch, seq = (2, 64) if args.smoke else (8, 256)
ids = torch.randint(0, config.vocab_size, (batch, seq))
inputs = {"input_ids": ids, "labels": ids}
real = memory.measure_step(model, inputs, optimizer="adamw").peak
print(f"\nsmall GPT-2 on CPU, batch {batch} x {seq}: measured {torchfit.format_bytes(real)}")
for name, guess in (
    ("analytic", memory.estimate(config, batch_size=batch, seq_len=seq, device="cpu")),
    ("traced", memory.trace(model, inputs, optimizer="adamw")),
):
    print(f"  {name:<9}{torchfit.format_bytes(guess.total):>12} ({guess.total - real:+,} bytes)")
