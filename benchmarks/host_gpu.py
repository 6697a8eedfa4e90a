"""Host memory of the GPU paths, on a machine with a CUDA GPU: measured vs predicted.

    PYTHONPATH=src python benchmarks/host_gpu.py [OUT_DIR]

1. The host RSS CUDA adds: a process that imported torch and transformers, before and
   after CUDA and cuBLAS start (`torchfit.host.plan.CUDA_HOST_BYTES`).
2. ``from_pretrained(device_map="cuda")``: same dtype, fp32 -> bf16, 4-bit, each in a
   fresh process (`torchfit.host.measure_load`) against `torchfit.host.load_memory`.
3. Pinned DataLoader batches and the offloaded KV cache against their predictions, from
   ``torch.cuda.host_memory_stats`` where this torch has it.

Every step's result is written to OUT_DIR/host_gpu.json as soon as it is known.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from torchfit.host import LoadSpec, load_memory, measure_load
from torchfit.host.offload import kv_offload_bytes
from torchfit.host.workers import worker_memory

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "."))
RESULTS: dict[str, object] = {}


def save(key: str, value: object) -> None:
    RESULTS[key] = value
    (OUT / "host_gpu.json").write_text(json.dumps(RESULTS, indent=1))
    print(key, json.dumps(value), flush=True)


def cuda_host() -> None:
    code = (
        "import json, torch, transformers\n"
        "from torchfit.host.rss import read_rss\n"
        "a = read_rss().rss\n"
        "x = torch.randn(1024, 1024, device='cuda'); (x @ x).sum().item()\n"
        "b = read_rss().rss\n"
        "print(json.dumps({'imports': a, 'after_cuda': b, 'cuda_host': b - a,"
        " 'torch': torch.__version__, 'transformers': transformers.__version__}))"
    )
    done = subprocess.run(  # noqa: S603 - our interpreter, our code
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    save("cuda_host", json.loads(done.stdout.strip().splitlines()[-1]))


def checkpoints(root: Path) -> dict[str, Path]:
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415 - optional

    config = LlamaConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=16,
                         num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
                         tie_word_embeddings=False)  # fmt: skip
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to_empty(device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    paths = {"bf16": root / "bf16", "fp32": root / "fp32"}
    model.to(torch.bfloat16).save_pretrained(paths["bf16"])
    model.to(torch.float32).save_pretrained(paths["fp32"])
    return paths


def loads(paths: dict[str, Path]) -> None:
    cases = [
        ("bf16", {"device_map": "cuda"}),
        ("fp32", {"device_map": "cuda", "dtype": "bf16"}),
        ("bf16", {"device_map": "cuda", "bits": 4}),
        ("bf16", {}),
    ]
    for name, kwargs in cases:
        spec = LoadSpec(**kwargs)
        try:
            predicted = load_memory(paths[name], **kwargs)
            measured = measure_load(paths[name], spec)
            save(f"load {name} {spec.describe()}", {
                "predicted_peak": predicted.peak, "measured_peak": measured.peak,
                "ratio": predicted.peak / max(measured.peak, 1),
                "predicted_after": predicted.after, "measured_after": measured.after,
                "baseline": measured.baseline, "seconds": measured.seconds,
            })  # fmt: skip
        except Exception as error:  # noqa: BLE001 - record and go on
            save(f"load {name} {spec.describe()}", {"error": repr(error)[-600:]})


def pinned_loader() -> None:
    from torch.utils.data import DataLoader, TensorDataset  # noqa: PLC0415 - one step's

    stats = getattr(torch.cuda, "host_memory_stats", None)
    data = TensorDataset(torch.zeros(512, 3, 224, 224))
    batch = 16 * 3 * 224 * 224 * 4
    loader = DataLoader(data, batch_size=16, num_workers=2, pin_memory=True, prefetch_factor=2)
    predicted = worker_memory(data, num_workers=2, batch_size=16, batch_bytes=batch,
                              pin_memory=True)  # fmt: skip
    for _ in loader:
        time.sleep(0.05)
    peak = None if stats is None else stats().get("allocated_bytes.all.peak")
    reserved = None if stats is None else stats().get("reserved_bytes.all.peak")
    save("pinned_loader", {"predicted_pinned": predicted.pinned, "measured_peak": peak,
                           "measured_reserved_peak": reserved})  # fmt: skip


def kv_offload() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415 - optional

    stats = getattr(torch.cuda, "host_memory_stats", None)
    config = LlamaConfig(hidden_size=512, intermediate_size=1024, num_hidden_layers=8,
                         num_attention_heads=8, num_key_value_heads=2, vocab_size=1000)  # fmt: skip
    model = LlamaForCausalLM(config).to("cuda", torch.bfloat16)
    prompt = torch.randint(0, 1000, (2, 1000), device="cuda")
    before = None if stats is None else stats().get("allocated_bytes.all.current")
    model.generate(prompt, max_new_tokens=24, min_new_tokens=24, do_sample=False,
                   cache_implementation="offloaded")  # fmt: skip
    after = None if stats is None else stats()
    predicted = kv_offload_bytes(batch_size=2, seq_len=1023, num_layers=8, num_kv_heads=2,
                                 head_dim=64, dtype="bf16")  # fmt: skip
    save("kv_offload", {
        "predicted": predicted, "before": before,
        "allocated_peak": None if after is None else after.get("allocated_bytes.all.peak"),
        "reserved_peak": None if after is None else after.get("reserved_bytes.all.peak"),
    })  # fmt: skip


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    save("device", {"gpu": gpu, "torch": torch.__version__})
    for step in (cuda_host, pinned_loader, kv_offload):
        try:
            step()
        except Exception as error:  # noqa: BLE001 - record and go on
            save(step.__name__, {"error": repr(error)[-600:]})
    with tempfile.TemporaryDirectory() as root:
        begin = time.perf_counter()
        paths = checkpoints(Path(root))
        save("checkpoints_seconds", time.perf_counter() - begin)
        loads(paths)


if __name__ == "__main__":
    main()
