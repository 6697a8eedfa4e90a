"""A training loop with the three helpers together: batch size, loader, precision.

1. ``find_batch_size`` runs your own step at the predicted size, backs off on OOM, and
   leaves the model and optimizer as they were. On a CPU, ``simulate_gpu`` plays a small
   card so the search has something to hit; on CUDA the card itself is the budget.
2. ``tuned_loader`` times the dataset to choose workers, prefetching and pinning.
3. ``MixedPrecision("auto")`` picks bf16 where it is native, else fp16 with a scaler.

Run: python examples/train_loop.py [--smoke]
"""

import argparse
import contextlib

import torch
from torch import nn
from torch.utils.data import TensorDataset

import torchfit
from torchfit import memory

parser = argparse.ArgumentParser()
parser.add_argument("--smoke", action="store_true", help="small sizes (CI)")
args = parser.parse_args()
torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

width, samples = (128, 4096) if args.smoke else (512, 16384)
model = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, 10)).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
dataset = TensorDataset(torch.randn(samples, width), torch.randint(0, 10, (samples,)))
loss_fn = nn.CrossEntropyLoss()


def train_step(amp, x, y):
    with amp.autocast():
        loss = loss_fn(model(x), y)
    amp.backward(loss)
    amp.step(optimizer)
    return loss


# 1. The batch size: real steps, model and optimizer restored after each trial (the trials
#    get their own MixedPrecision, so the real run's loss scale and counters start fresh).
@torchfit.find_batch_size(
    start=256, probe_upward=True, batch_limit=len(dataset), restore=(model, optimizer)
)
def probe(batch_size):
    x, y = dataset[:batch_size]
    train_step(torchfit.MixedPrecision("auto", device=device), x.to(device), y.to(device))


card = "4MiB" if args.smoke else "64MiB"
budget = memory.simulate_gpu(card, track=(model, optimizer)) if device == "cpu" else None
with budget or contextlib.nullcontext():
    found = probe()
print(found)

# 2. The loader, tuned for that batch size on this machine.
loader = torchfit.tuned_loader(
    dataset, batch_size=found.batch_size, shuffle=True, time_budget=1.0 if args.smoke else 5.0
)
print(
    f"loader: num_workers={loader.num_workers}, prefetch_factor={loader.prefetch_factor}, "
    f"pin_memory={loader.pin_memory}, persistent_workers={loader.persistent_workers}"
)

# 3. Train a few steps.
amp = torchfit.MixedPrecision("auto", device=device)
print(f"precision: {amp.dtype} ({amp.reason})")
for step, (x, y) in enumerate(loader):
    loss = train_step(amp, x.to(device, non_blocking=True), y.to(device, non_blocking=True))
    print(f"step {step}: loss {loss.item():.3f}")
    if step == 4:
        break
print(f"optimizer steps: {amp.optimizer_steps}, skipped: {amp.skipped_steps}")
