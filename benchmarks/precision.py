"""Cost of torchfit.precision.MixedPrecision over the raw torch.amp loop, and fp32/bf16/fp16.

    python benchmarks/precision.py                 # CPU overhead table (+ GPU tables on CUDA)
    python benchmarks/precision.py --repeats 400   # narrower intervals

Tables 1-2 (any device): per optimizer step, the hand-written torch.amp loop (autocast,
GradScaler for fp16, unscale_, clip, step, update, scheduler) against the same run
through MixedPrecision: first on a 4x10 Linear, where almost all time is bookkeeping
(the absolute overhead), then on a small MLP (the ratio; target <= 1.02). Blocks of
steps alternate raw / wrapped on the same model and optimizer; the overhead is the
median of the paired differences (drift cancels within a pair), with a 95% interval
(1.58 IQR / sqrt(n), as in a notched box plot); "95% hi" is the ratio at its upper end.
On a CPU the clock is this thread's CPU time with one torch thread, so other processes
on the machine do not count.

Tables 3-4 (CUDA only): speed and peak memory of fp32, bf16 and fp16 for a small CNN and
a small GPT (transformers GPT2Config), trained through MixedPrecision.
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional

from torchfit.precision import MixedPrecision

PRECISIONS = ("fp32", "bf16", "fp16")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def mlp(width: int, depth: int = 4) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


# -- table 1: wrapper overhead ------------------------------------------------------------


def raw_loop(model, opt, sched, precision, device, *, k, clip):
    """The torch.amp recipe by hand, as the docs write it (plus skip-aware scheduling)."""
    scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)

    def step(batches):
        for x, y in batches:
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                loss = functional.cross_entropy(model(x), y)
            loss = loss / k if k > 1 else loss
            (scaler.scale(loss) if scaler is not None else loss).backward()
        if scaler is not None:
            scaler.unscale_(opt)
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        if scaler is not None:
            before = scaler.get_scale()
            scaler.step(opt)
            scaler.update()
            stepped = scaler.get_scale() >= before
        else:
            opt.step()
            stepped = True
        if stepped:
            sched.step()
        opt.zero_grad(set_to_none=True)

    return step


def wrapped_loop(model, opt, sched, precision, device, *, k, clip, skip_nonfinite="loss"):
    mp = MixedPrecision(precision, device=device, accumulate=k, skip_nonfinite=skip_nonfinite)

    def step(batches):
        for x, y in batches:
            with mp.autocast():
                loss = functional.cross_entropy(model(x), y)
            mp.backward(loss)
            mp.step(opt, scheduler=sched, clip_grad_norm=clip)

    return step


def setup(device: torch.device, *, width: int, batch: int, k: int):
    """MLP ``width`` wide (``width=4``: one tiny Linear, so only bookkeeping is timed)."""
    torch.manual_seed(0)
    model = (mlp(width) if width > 4 else nn.Linear(4, 10)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + 1e-3 * s))
    gen = torch.Generator(device="cpu").manual_seed(1)
    batches = [
        (
            torch.randn(batch, width, generator=gen).to(device),
            torch.randint(0, 10, (batch,), generator=gen).to(device),
        )
        for _ in range(k)
    ]
    return model, opt, sched, batches


def time_block(step: Callable, batches, steps: int, device: torch.device) -> float:
    """Seconds per optimizer step: this thread's CPU time on a CPU, wall time on a GPU.

    With one intra-op thread all CPU work runs on this thread, so its CPU time measures
    the work done and not the other processes sharing the cores.
    """
    clock = time.perf_counter if device.type == "cuda" else time.thread_time
    sync(device)
    start = clock()
    for _ in range(steps):
        step(batches)
    sync(device)
    return (clock() - start) / steps


def overhead_table(
    device: torch.device, *, repeats: int, steps: int, batch: int, width: int
) -> str:
    rows = []
    for precision in PRECISIONS:
        # bf16/fp32: the default check (the losses, and the clip norm when clipping), every
        # gradient ("grads"), and none; fp16's GradScaler always checks the gradients.
        variants = [("", "loss")]
        if precision != "fp16":
            variants += [(" (grads check)", "grads"), (" (no check)", "never")]
        for k, clip in ((1, None), (4, 1.0)):
            for label, skip_nonfinite in variants:
                # One model, optimizer and scheduler for both loops: the same memory, the
                # same kernels; only the code around them differs.
                model, opt, sched, batches = setup(device, width=width, batch=batch, k=k)
                raw = raw_loop(model, opt, sched, precision, device, k=k, clip=clip)
                wrapped = wrapped_loop(
                    model,
                    opt,
                    sched,
                    precision,
                    device,
                    k=k,
                    clip=clip,
                    skip_nonfinite=skip_nonfinite,
                )
                for fn in (raw, wrapped):  # warm-up: allocator, oneDNN kernels
                    time_block(fn, batches, 3, device)
                raw_t, diffs = [], []
                for repeat in range(repeats):
                    first, second = (raw, wrapped) if repeat % 2 else (wrapped, raw)
                    t1 = time_block(first, batches, steps, device)
                    t2 = time_block(second, batches, steps, device)
                    r, w = (t1, t2) if first is raw else (t2, t1)
                    raw_t.append(r)
                    diffs.append(w - r)
                r = statistics.median(raw_t)
                d = statistics.median(diffs)
                q1, _, q3 = statistics.quantiles(diffs, n=4)
                ci = 1.58 * (q3 - q1) / math.sqrt(len(diffs))  # notched-boxplot 95% interval
                rows.append((f"{precision}{label}", k, "yes" if clip else "no", r, d, ci))
    head = (
        f"{'precision':<22} {'accum':>5} {'clip':>4} {'raw ms/step':>11} "
        f"{'overhead us':>16} {'ratio':>6} {'95% hi':>6}"
    )
    lines = [head, "-" * len(head)]
    for p, k, c, r, d, ci in rows:
        spread = f"{d * 1e6:.1f} +- {ci * 1e6:.1f}"
        lines.append(
            f"{p:<22} {k:>5} {c:>4} {r * 1e3:>11.3f} {spread:>16} "
            f"{(r + d) / r:>6.3f} {(r + d + ci) / r:>6.3f}"
        )
    return "\n".join(lines)


# -- tables 3-4: fp32 vs bf16 vs fp16 on a GPU -----------------------------------------------


def small_cnn() -> nn.Module:
    def block(cin: int, cout: int) -> nn.Module:
        return nn.Sequential(
            nn.Conv2d(cin, cout, 3, padding=1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(),
            nn.Conv2d(cout, cout, 3, padding=1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )

    return nn.Sequential(
        block(3, 64),
        block(64, 128),
        block(128, 256),
        block(256, 512),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(512, 1000),
    )


def small_gpt() -> nn.Module:
    from torchfit._core.imports import require  # noqa: PLC0415 - optional dependency

    transformers = require("transformers", feature="the GPT benchmark")
    config = transformers.GPT2Config(
        n_layer=6,
        n_embd=768,
        n_head=12,
        n_positions=1024,
        vocab_size=50257,
        attn_implementation="sdpa",
    )
    return transformers.GPT2LMHeadModel(config)


def measure(name: str, precision: str, device: torch.device, *, steps: int):
    """Time ``steps`` training steps; the model dies on return, so peaks do not stack."""
    torch.manual_seed(0)
    if name == "cnn":
        model = small_cnn().to(device)
        x = torch.randn(128, 3, 64, 64, device=device)
        y = torch.randint(0, 1000, (128,), device=device)

        def loss_of():
            return functional.cross_entropy(model(x), y)
    else:
        model = small_gpt().to(device)
        ids = torch.randint(0, 50257, (8, 1024), device=device)

        def loss_of():
            return model(input_ids=ids, labels=ids).loss

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    mp = MixedPrecision(precision, device=device)

    def step():
        with mp.autocast():
            loss = loss_of()
        mp.backward(loss)
        mp.step(opt, clip_grad_norm=1.0)

    for _ in range(3):
        step()
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    per_step = (time.perf_counter() - start) / steps
    return per_step, torch.cuda.max_memory_allocated(device), mp.skipped_steps


def speed_table(name: str, device: torch.device, *, steps: int) -> str:
    major, _ = torch.cuda.get_device_capability(device)
    rows = []
    for precision in PRECISIONS:
        if precision == "bf16" and major < 8:
            rows.append((precision, math.nan, math.nan, "no native bf16"))
            continue
        per_step, peak, skipped = measure(name, precision, device, steps=steps)
        gc.collect()
        torch.cuda.empty_cache()
        rows.append(
            (precision, per_step * 1e3, peak / 2**30, f"skipped {skipped} of {steps + 3} steps")
        )
    base = rows[0][1]
    head = f"{name:<6} {'ms/step':>9} {'speed-up':>8} {'peak GiB':>9}  note"
    lines = [head, "-" * len(head)]
    lines += [
        f"{p:<6} {ms:>9.2f} {base / ms:>8.2f} {gib:>9.2f}  {note}" for p, ms, gib, note in rows
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    parser.add_argument("--repeats", type=int, default=150, help="raw/wrapped block pairs")
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps per block")
    parser.add_argument("--batch", type=int, default=32, help="micro-batch size of the MLP")
    parser.add_argument("--width", type=int, default=256, help="width of the MLP")
    args = parser.parse_args()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cpu":
        torch.set_num_threads(1)  # see time_block: CPU time of one thread is contention-proof
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    clock = "wall" if device.type == "cuda" else "thread CPU"
    print(
        f"torch {torch.__version__}, {where}, {torch.get_num_threads()} threads; AdamW + "
        f"LambdaLR; {args.repeats} alternating blocks x {args.steps} optimizer steps; "
        f"paired medians of {clock} time per optimizer step\n"
    )
    print("Bookkeeping alone: Linear(4, 10), micro-batch 2 (the overhead column is the cost)")
    print(overhead_table(device, repeats=args.repeats, steps=5 * args.steps, batch=2, width=4))
    print(
        f"\nSmall model: MLP 4x{args.width} + head, micro-batch {args.batch} (target ratio <= 1.02)"
    )
    print(
        overhead_table(
            device, repeats=args.repeats, steps=args.steps, batch=args.batch, width=args.width
        )
    )
    if device.type == "cuda":
        print("\nCNN (8 conv + BN, 128x3x64x64), AdamW fused, clip 1.0")
        print(speed_table("cnn", device, steps=20))
        print("\nGPT-2 (6 layers, 768 wide, 8x1024 tokens), AdamW fused, clip 1.0")
        print(speed_table("gpt", device, steps=10))


if __name__ == "__main__":
    main()
