"""Write ``h200_snapshots.json.gz``: real CUDA memory snapshots, stripped, with their peaks.

The snapshots are ``torch.cuda.memory._dump_snapshot()`` pickles of one training step
each, measured by this project on an NVIDIA H200 (torch 2.11.0+cu130, driver 580.159):
a warm-up step, then peaks reset and ``_record_memory_history(max_entries=200000,
context="alloc", stacks="python")`` around the measured step. The output keeps, per case,
what `torchfit.memory.allocator.read_snapshot` needs (segments with their blocks' sizes
and states, and the trace's actions, addresses, sizes and streams; no Python stacks), the
allocator settings, and the step's measured ``max_memory_reserved`` /
``max_memory_allocated`` with ``memory_reserved`` / ``memory_allocated`` just before it.

Run: python make_h200_snapshots.py SNAPSHOT_DIR MEASUREMENTS.jsonl
(the measurement script writes one JSON record per case, with ``step2`` and
``before_step2`` holding those numbers).
"""

import gzip
import json
import pathlib
import pickle
import sys

OUT = pathlib.Path(__file__).with_name("h200_snapshots.json.gz")
ABOUT = (
    "Measured by the torchfit project on an NVIDIA H200 (143,771 MiB, driver 580.159), torch "
    "2.11.0+cu130: one training step per case after a warm-up step, recorded with "
    "torch.cuda.memory._record_memory_history; snapshots stripped of Python stacks."
)
SEGMENT_KEYS = ("address", "total_size", "segment_type", "stream", "device")
EVENT_KEYS = ("action", "addr", "size", "stream")
RECIPE_KEYS = ("model", "batch", "seq", "input_shape", "precision", "optimizer")


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


def case(path, record):
    with path.open("rb") as file:
        snapshot = pickle.load(file)  # noqa: S301 - our own measurement files
    recipe = {key: record[key] for key in RECIPE_KEYS if key in record}
    recipe["gradient_checkpointing"] = record.get("gradient_checkpointing", False)
    return {
        "case": path.stem,
        "recipe": recipe,
        "measured": {
            "max_memory_reserved": record["step2"]["peak_reserved"],
            "max_memory_allocated": record["step2"]["peak_alloc"],
            "memory_reserved_before": record["before_step2"]["reserved"],
            "memory_allocated_before": record["before_step2"]["alloc"],
        },
        "snapshot": strip(snapshot),
    }


def main(snapshot_dir, measurements):
    with pathlib.Path(measurements).open() as file:
        records = {r["case"]: r for r in map(json.loads, file)}
    cases = [case(p, records[p.stem]) for p in sorted(pathlib.Path(snapshot_dir).glob("*.pickle"))]
    text = json.dumps({"about": ABOUT, "cases": cases}, separators=(",", ":"))
    OUT.write_bytes(gzip.compress(text.encode(), compresslevel=9, mtime=0))
    sys.stdout.write(f"{OUT.name}: {len(cases)} cases, {OUT.stat().st_size:,} bytes\n")


if __name__ == "__main__":
    main(*sys.argv[1:3])
