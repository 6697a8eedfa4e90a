"""The allocator model against PyTorch's real CUDA caching allocator.

Each check runs in a fresh Python process, so that no tensor of another test sits in the
allocator and the segment layout starts empty; the native backend and
``expandable_segments:False`` are forced there, as the model assumes.
"""

import json
import os
import random
import subprocess
import sys
import textwrap

import pytest
import torch

from torchfit.memory.allocator import (
    DEFAULT_CUDA_CONTEXT_BYTES,
    CachingAllocator,
    cublas_workspace_bytes,
)

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

KiB = 2**10
MiB = 2**20

# Runs the ops of every case on the real allocator and prints, after each op, allocated /
# reserved / max allocated / max reserved (or "oom"), as JSON.
_CHILD = textwrap.dedent(
    """
    import json, sys, torch
    assert torch.cuda.get_allocator_backend() == "native", torch.cuda.get_allocator_backend()
    request = json.loads(sys.stdin.read())
    capacity = None
    if request["fraction"] is not None:
        torch.cuda.set_per_process_memory_fraction(request["fraction"])
        capacity = int(request["fraction"] * torch.cuda.mem_get_info()[1])
    results = []
    for case in request["cases"]:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        assert torch.cuda.memory_reserved() == 0, torch.cuda.memory_reserved()
        live, rows = {}, []
        for kind, key, nbytes in case:
            try:
                if kind == "malloc":
                    live[key] = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
                elif kind == "free":
                    live.pop(key, None)  # a key whose malloc ran out of memory is not live
                else:
                    torch.cuda.empty_cache()
            except torch.OutOfMemoryError:
                rows.append("oom")
                continue
            rows.append([
                torch.cuda.memory_allocated(),
                torch.cuda.memory_reserved(),
                torch.cuda.max_memory_allocated(),
                torch.cuda.max_memory_reserved(),
            ])
        live.clear()
        results.append(rows)
    print(json.dumps({"capacity": capacity, "results": results}))
    """
)


def _child_env():
    env = dict(os.environ)
    env.pop("PYTORCH_ALLOC_CONF", None)
    env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:False"
    env.pop("PYTORCH_NO_CUDA_MEMORY_CACHING", None)
    return env


def _run_child(cases, fraction=None):
    request = json.dumps({"cases": cases, "fraction": fraction})
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD],
        input=request,
        capture_output=True,
        text=True,
        env=_child_env(),
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _random_case(rng, n_ops=60):
    """Ops as (kind, key, nbytes); sizes from 1 B to 100 MiB, biased to small ones."""
    ops, live, key = [], [], 0
    for _ in range(n_ops):
        roll = rng.random()
        if roll < 0.5 or not live:
            pick = rng.random()
            if pick < 0.3:
                nbytes = rng.randint(1, 4 * KiB)
            elif pick < 0.55:
                nbytes = rng.randint(1, MiB + 4 * KiB)
            elif pick < 0.75:
                nbytes = rng.randint(1, 40) * 512 * KiB
            elif pick < 0.9:
                nbytes = rng.randint(MiB, 12 * MiB)
            else:
                nbytes = rng.randint(1, 100 * MiB)
            ops.append(("malloc", key, nbytes))
            live.append(key)
            key += 1
        elif roll < 0.95:
            ops.append(("free", live.pop(rng.randrange(len(live))), 0))
        else:
            ops.append(("empty_cache", -1, 0))
    return ops


def _simulate(case, capacity=None):
    sim, handles, rows = CachingAllocator(capacity=capacity), {}, []
    for kind, key, nbytes in case:
        try:
            if kind == "malloc":
                handles[key] = sim.malloc(nbytes)
            elif kind == "free":
                if key in handles:  # a key whose malloc ran out of memory is not live
                    sim.free(handles.pop(key))
            else:
                sim.empty_cache()
        except torch.OutOfMemoryError:
            rows.append("oom")
            continue
        rows.append([sim.allocated, sim.reserved, sim.peak_allocated, sim.peak_reserved])
    return rows


def _first_difference(case, real, simulated):
    for index, (got, want) in enumerate(zip(real, simulated, strict=True)):
        if got != want:
            return (
                f"op {index} {case[index]}: CUDA says {got}, the model says {want}; "
                f"ops so far: {case[: index + 1]}"
            )
    return None


def test_random_sequences_match_the_real_allocator_after_every_op():
    rng = random.Random(20240611)  # noqa: S311 - a reproducible test sequence
    cases = [_random_case(rng) for _ in range(40)]
    real = _run_child(cases)["results"]
    problems = [
        problem
        for case, rows in zip(cases, real, strict=True)
        if (problem := _first_difference(case, rows, _simulate(case)))
    ]
    assert not problems, f"{len(problems)} of {len(cases)} sequences differ; first: {problems[0]}"


def test_out_of_memory_and_its_recovery_match_the_real_allocator():
    rng = random.Random(7)  # noqa: S311 - a reproducible test sequence
    total = torch.cuda.mem_get_info()[1]
    fraction = 96 * MiB / total  # small enough that the device itself never runs out first
    cases = [_random_case(rng, n_ops=80) for _ in range(20)]
    reply = _run_child(cases, fraction=fraction)
    capacity = reply["capacity"]
    problems = [
        problem
        for case, rows in zip(cases, reply["results"], strict=True)
        if (problem := _first_difference(case, rows, _simulate(case, capacity)))
    ]
    assert any("oom" in rows for rows in reply["results"]), "no sequence reached the limit"
    assert not problems, f"{len(problems)} of {len(cases)} sequences differ; first: {problems[0]}"


_WORKSPACE_CHILD = textwrap.dedent(
    """
    import json, torch
    a = torch.randn(256, 256, device="cuda")
    b = torch.randn(256, 256, device="cuda")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    c = a @ b
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before - c.untyped_storage().nbytes()
    print(json.dumps({"extra": extra, "capability": list(torch.cuda.get_device_capability())}))
    """
)


def test_cublas_workspace_default_matches_the_first_matmul():
    env = _child_env()
    env.pop("CUBLAS_WORKSPACE_CONFIG", None)
    proc = subprocess.run(
        [sys.executable, "-c", _WORKSPACE_CHILD],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    reply = json.loads(proc.stdout.strip().splitlines()[-1])
    expected = cublas_workspace_bytes(tuple(reply["capability"]))
    # The cuBLAS workspace, plus the 1 MiB cuBLASLt one where the matmul goes through Lt.
    assert reply["extra"] in {expected, expected + MiB}, reply


_CONTEXT_CHILD = textwrap.dedent(
    """
    import json, torch
    x = torch.ones(1, device="cuda")
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    print(json.dumps({"used": total - free, "reserved": torch.cuda.memory_reserved()}))
    """
)


def test_cuda_context_default_is_the_right_order_of_magnitude():
    proc = subprocess.run(
        [sys.executable, "-c", _CONTEXT_CHILD],
        capture_output=True,
        text=True,
        env=_child_env(),
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    reply = json.loads(proc.stdout.strip().splitlines()[-1])
    context = reply["used"] - reply["reserved"]  # other processes on the card count too
    assert DEFAULT_CUDA_CONTEXT_BYTES / 3 < context < DEFAULT_CUDA_CONTEXT_BYTES * 4, reply
