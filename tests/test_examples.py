"""Every example runs as a user would run it (with --smoke for CPU-sized inputs).

Each runs as ``python example.py --smoke`` in a process of its own, forked from
tests/script_server.py, which imported torch, transformers and torchfit once.
"""

import os
import pathlib
import re

import pytest

from torchfit.host.forking import run_forked

EXAMPLES = sorted((pathlib.Path(__file__).parent.parent / "examples").glob("*.py"))

#: What each example must print, beyond a zero exit status (regexes, multiline).
EXPECTED = {
    "check_gpt_fits.py": [
        r"^verdict: (FITS|DOES NOT FIT)",
        r"^allocated peak\s+\S+ \w?i?B\s+\S+ \w?i?B$",
        r"^fits\?\s+(fits|no)\s+(fits|no)$",
        r"^  analytic .*bytes\)$",
        r"^  traced .*bytes\)$",
    ],
    "hf_trainer_batch_size.py": [
        r"^BatchSizeResult: batch size [1-9]\d* x [1-9]\d* accumulation steps = effective 128",
        r"^  2 real steps, 0 out of memory$",
        r"^per_device_train_batch_size=\d+, gradient_accumulation_steps=\d+ \(effective 128\)$",
        r"^trained \d+ micro-batches at batch size \[[1-9]\d*\]$",
    ],
    "layer_table.py": [r"^MemoryEstimate"],
    "lightning_batch_size.py": [
        r"^BatchSizeResult: batch size [1-9]\d* \(predicted [1-9]\d*\)$",
        r"^  2 real steps, 0 out of memory$",
        r"^trained at batch size (?P<b>\d+): 3 steps, batches \[(?P=b)\]$",
    ],
    "quantized_footprint.py": [
        r"^  nf4 .* bits/parameter$",
        r"^predicted before loading\s+(?P<a>\S+ \w+)\nreally held \(footprint\)\s+(?P=a)$",
        r"^forward ok",
    ],
    "resnet_batch_size.py": [
        r"^  NVIDIA GeForce GTX 1060 6GB\s+[1-9]\d*\s+[1-9]\d*$",
        r"^BatchSizeResult: batch size [1-9]\d* \(predicted [1-9]\d*\)",
    ],
    "train_loop.py": [
        r"^BatchSizeResult: batch size [1-9]\d*",
        r"^loader: num_workers=\d+, prefetch_factor=\w+, pin_memory=(True|False)",
        r"^precision: (bf16|fp16|fp32) \(.+\)$",
        r"^step 4: loss \d+\.\d+$",
        r"^optimizer steps: 5, skipped: 0$",
    ],
}


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(script, tmp_path):
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "0",
    }
    out = tmp_path / "stdout.txt"
    request = {"script": str(script), "args": ["--smoke"], "cwd": str(tmp_path), "stdout": str(out)}
    status, stderr = run_forked("script_server", request, env, timeout=300)
    assert status == 0, stderr[-2000:]
    stdout = out.read_text()
    assert stdout.strip()
    for pattern in EXPECTED.get(script.name, []):
        assert re.search(pattern, stdout, re.MULTILINE), f"{pattern!r} not in:\n{stdout}"


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
def test_example_is_documented(script):
    text = script.read_text()
    assert f"Run: python examples/{script.name} [--smoke]" in text
    assert '"--smoke"' in text
