"""Write the H200 snapshot data: real CUDA memory snapshots, stripped, with their peaks.

The snapshots are ``torch.cuda.memory._dump_snapshot()`` pickles measured by this project
on an NVIDIA H200 (torch 2.11.0+cu130, driver 580.159.04), one file per run:

- ``h200_snapshots.json.gz`` (run ``a``): seven training steps, each after a warm-up
  step, peaks reset and ``_record_memory_history(max_entries=200000, context="alloc",
  stacks="python")`` around the measured step.
- ``h200_b_snapshots.json.gz`` (run ``b``, ``benchmarks/gpu_check.py``): eleven training
  steps recorded the same way (``max_entries=400000``), and one forward under
  ``torch.no_grad`` after a short warm-up forward (``I1``). The generate case (``I2``) is
  left out: its trace filled the 400,000 entries, so it starts in the middle of the
  generation, and it would weigh 0.46 MB compressed.

Each file keeps, per case, what `torchfit.memory.allocator.read_snapshot` needs (segments
with their blocks' sizes and states, and the trace's actions, addresses, sizes and
streams; no Python stacks), the allocator settings, the recipe, and the measured
``max_memory_reserved`` / ``max_memory_allocated`` over the recorded step with
``memory_reserved`` / ``memory_allocated`` just before it.

Run: python make_h200_snapshots.py SNAPSHOT_DIR MEASUREMENTS.jsonl [a|b]
(the measurement script writes one JSON record per case: ``step2`` and ``before_step2``
hold those numbers for a training step, ``after`` and ``before`` for a forward).
"""

import gzip
import json
import pathlib
import pickle
import sys

HERE = pathlib.Path(__file__).parent
RUNS = {  # run -> (file, what it holds)
    "a": (
        "h200_snapshots.json.gz",
        (
            "Measured by the torchfit project on an NVIDIA H200 (143,771 MiB, driver "
            "580.159), torch 2.11.0+cu130: one training step per case after a warm-up step, "
            "recorded with torch.cuda.memory._record_memory_history; snapshots stripped of "
            "Python stacks."
        ),
    ),
    "b": (
        "h200_b_snapshots.json.gz",
        (
            "Measured by the torchfit project's benchmarks/gpu_check.py on an NVIDIA H200 "
            "(143,771 MiB, driver 580.159.04), torch 2.11.0+cu130, transformers 5.17.0: one "
            "training step per case after a warm-up step (I1: one forward under no_grad "
            "after a short warm-up forward), recorded with "
            "torch.cuda.memory._record_memory_history; snapshots stripped of Python stacks."
        ),
    ),
}
# Left out, with the reason.
SKIP = {
    "I2_llama3b_generate_bf16_b4_p2048_n128": "the trace filled max_entries: it starts mid-run",
}
SEGMENT_KEYS = ("address", "total_size", "segment_type", "stream", "device")
EVENT_KEYS = ("action", "addr", "size", "stream")
RECIPE_KEYS = ("model", "batch", "seq", "input_shape", "precision", "optimizer")
# benchmarks/gpu_check.py's records (they have "weights") say more of the recipe.
CASE_KEYS = ("kind", "task", "weights", "autocast", "lora", "qlora", "new_tokens")


def strip(snapshot):
    """The snapshot with what a replay reads: no stacks, no timestamps."""
    segments = [
        {key: segment[key] for key in SEGMENT_KEYS}
        | {"blocks": [{"size": b["size"], "state": b["state"]} for b in segment["blocks"]]}
        for segment in snapshot["segments"]
    ]
    traces = [[{key: e[key] for key in EVENT_KEYS} for e in t] for t in snapshot["device_traces"]]
    return {
        "segments": segments,
        "device_traces": traces,
        "allocator_settings": snapshot["allocator_settings"],
    }


def recipe_of(record):
    """What was run: the recipe keys the record has."""
    keys = RECIPE_KEYS + (CASE_KEYS if "weights" in record else ())
    recipe = {key: record[key] for key in keys if record.get(key) is not None}
    recipe["gradient_checkpointing"] = record.get("gradient_checkpointing", False)
    return recipe


def measured_of(record):
    """The recorded step's peaks, and what the allocator held just before it."""
    step, before = ("step2", "before_step2") if "step2" in record else ("after", "before")
    return {
        "max_memory_reserved": record[step]["peak_reserved"],
        "max_memory_allocated": record[step]["peak_alloc"],
        "memory_reserved_before": record[before]["reserved"],
        "memory_allocated_before": record[before]["alloc"],
    }


def case(path, record):
    with path.open("rb") as file:
        snapshot = pickle.load(file)  # noqa: S301 - our own measurement files
    return {
        "case": path.stem,
        "recipe": recipe_of(record),
        "measured": measured_of(record),
        "snapshot": strip(snapshot),
    }


def main(snapshot_dir, measurements, run="a"):
    name, about = RUNS[run]
    out = HERE / name
    with pathlib.Path(measurements).open() as file:
        records = {r["case"]: r for r in map(json.loads, file)}
    paths = sorted(pathlib.Path(snapshot_dir).glob("*.pickle"))
    cases = [case(p, records[p.stem]) for p in paths if p.stem not in SKIP]
    text = json.dumps({"about": about, "cases": cases}, separators=(",", ":"))
    out.write_bytes(gzip.compress(text.encode(), compresslevel=9, mtime=0))
    sys.stdout.write(f"{out.name}: {len(cases)} cases, {out.stat().st_size:,} bytes\n")


if __name__ == "__main__":
    main(*sys.argv[1:4])
