"""How much the CUDA caching allocator reserves beyond the allocated peak, and how well
`approximate_reserved` guesses it without the allocation order.

Real allocation traces (every allocation and free of the CPU allocator, from the
profiler, with addresses) of whole training runs - model and optimizer built inside the
trace, three steps - are replayed through the caching-allocator model. CPU kernels stand
in for CUDA ones: the op sequence is the same, kernel scratch differs. No GPU involved.

Run: python benchmarks/allocator_fragmentation.py
"""

import time

import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

from torchfit._core.units import format_bytes
from torchfit.memory.allocator import DEFAULT_FRAGMENTATION, approximate_reserved, replay

STEPS = 3


def trace_events(build):
    """(key, nbytes) / (key,) events of building the model and running STEPS steps."""

    def run():
        model, optimizer, batch = build()
        for _ in range(STEPS):
            out = model(**batch) if isinstance(batch, dict) else model(batch)
            logits = getattr(out, "logits", out)
            loss = logits.float().square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del out, logits, loss

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    records = []

    def walk(nodes):
        for node in nodes:
            fields = node.extra_fields
            if node.tag == _EventType.Allocation and fields.device.type == "cpu":
                records.append((node.start_time_ns, fields.ptr, fields.alloc_size))
            walk(node.children)

    walk(prof.profiler.kineto_results.experimental_event_tree())
    records.sort(key=lambda r: r[0])
    events, live = [], set()
    for _, ptr, size in records:
        if size > 0:
            events.append((ptr, size))
            live.add(ptr)
        elif ptr in live:  # frees of memory allocated before the trace are skipped
            events.append((ptr,))
            live.discard(ptr)
    return events


def mlp():
    torch.manual_seed(0)
    blocks = [
        torch.nn.Sequential(
            torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)
        )
        for _ in range(3)
    ]
    model = torch.nn.Sequential(*blocks)
    return model, torch.optim.AdamW(model.parameters()), torch.randn(64, 1024)


def cnn():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 64, 3, padding=1),
        torch.nn.BatchNorm2d(64),
        torch.nn.ReLU(),
        torch.nn.Conv2d(64, 128, 3, padding=1, stride=2),
        torch.nn.BatchNorm2d(128),
        torch.nn.ReLU(),
        torch.nn.Conv2d(128, 256, 3, padding=1, stride=2),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(256, 10),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, optimizer, torch.randn(16, 3, 64, 64)


def gpt2(n_embd, n_layer, batch, seq, vocab):
    def build():
        from transformers import GPT2Config, GPT2LMHeadModel  # noqa: PLC0415 - optional

        torch.manual_seed(0)
        config = GPT2Config(
            n_embd=n_embd,
            n_layer=n_layer,
            n_head=n_embd // 64,
            vocab_size=vocab,
            n_positions=seq,
            bos_token_id=0,
            eos_token_id=0,
        )
        model = GPT2LMHeadModel(config)
        ids = torch.randint(0, vocab, (batch, seq))
        return model, torch.optim.AdamW(model.parameters()), {"input_ids": ids}

    return build


SCENARIOS = [
    ("MLP 3x(1024-4096-1024) AdamW b64", mlp),
    ("CNN 3 conv SGD b16 64x64", cnn),
    ("GPT-2 4L 256d AdamW b4 s256", gpt2(256, 4, 4, 256, 8192)),
    ("GPT-2 4L 512d AdamW b8 s256", gpt2(512, 4, 8, 256, 16384)),
]


def main():
    header = (
        f"{'scenario':<34} {'events':>7} {'alloc peak':>11} {'reserved':>11} "
        f"{'res/alloc':>9} {'approx':>11} {'approx err':>10} {'sec':>5}"
    )
    print(f"fragmentation allowance {DEFAULT_FRAGMENTATION:.0%}; reserved = exact replay")
    print(header)
    print("-" * len(header))
    for name, build in SCENARIOS:
        start = time.perf_counter()
        events = trace_events(build)
        stats = replay(events)
        approx = approximate_reserved(stats.peak_allocated)
        error = approx / stats.peak_reserved - 1
        print(
            f"{name:<34} {len(events):>7} {format_bytes(stats.peak_allocated):>11} "
            f"{format_bytes(stats.peak_reserved):>11} "
            f"{stats.peak_reserved / stats.peak_allocated:>9.3f} {format_bytes(approx):>11} "
            f"{error:>+10.1%} {time.perf_counter() - start:>5.1f}"
        )


if __name__ == "__main__":
    main()
