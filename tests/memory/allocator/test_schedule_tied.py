"""A tied head's gradient in the step schedule, against the H200 steps that made it.

Autograd adds the embedding's gradient into the head's when the head's arrived as a
fresh tensor (autocast's cast of fp32 weights made it), and into a new tensor when it
arrived straight from the head's matmul (a transposed view). The snapshots of this
project's H200 runs (`memory.allocator.h200`) show both: every allocation the size of the
embedding's gradient in the measured step, counted in the real step and in the closed
form's schedule of it.
"""

import sys
from pathlib import Path

import pytest
import transformers

from memory.allocator import h200
from torchfit.memory import estimate
from torchfit.memory.allocator import step_schedule

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from gpu_check import CONFIGS  # benchmarks/ is not a package: the models the runs built

transformers.logging.set_verbosity_error()

# case, model, precision, optimizer, task, whether autograd summed in place
CASES = [
    ("T01_gpt2_fp32_b8_s1024", "gpt2", "32-true", "adamw", "causal", False),
    ("T03_llama1b_bf16true_b4_s2048", "llama-3.2-1b", "bf16-true", "adamw", "causal", False),
    ("T2_qwen05b_bf16mixed_b8_s1024", "qwen2.5-0.5b", "bf16-mixed", "adamw", "causal", True),
    ("T4_bert_mlm_16mixed_scaler_b32_s512", "bert-base", "16-mixed", "adamw", "mlm", True),
]


def _config(model):
    cls, kwargs = CONFIGS[model]
    return getattr(transformers, cls)(**kwargs)


def _near(size, nbytes):
    """The closed form cuts its byte totals per tensor: within 0.1% of the exact size."""
    return abs(size / nbytes - 1) < 1e-3


def _gradient_bytes(config, precision):
    itemsize = 2 if precision == "bf16-true" else 4
    hidden = getattr(config, "hidden_size", None) or config.n_embd
    return config.vocab_size * hidden * itemsize


@pytest.mark.parametrize(
    ("name", "model", "precision", "optimizer", "task", "in_place"),
    CASES,
    ids=[c[0] for c in CASES],
)
def test_the_schedule_allocates_the_tied_gradients_the_step_allocated(
    name, model, precision, optimizer, task, in_place
):
    case = h200.case(name)
    config = _config(model)
    nbytes = _gradient_bytes(config, precision)
    trace = case["snapshot"]["device_traces"][0]
    real = sum(e["action"] == "alloc" and _near(e["size"], nbytes) for e in trace)
    found = estimate(
        config,
        device="cuda",
        batch_size=case["recipe"]["batch"],
        seq_len=case["recipe"]["seq"],
        precision=precision,
        optimizer=optimizer,
    )
    assert found.outline is not None and found.outline.tied_in_place is in_place
    events = step_schedule(found.outline).events
    held = {"weight", "input", "state"}  # restated at the step's start, not allocated in it
    ours = sum(len(e) == 2 and e[0][0] not in held and _near(e[1], nbytes) for e in events)
    assert ours == real, (name, ours, real)
