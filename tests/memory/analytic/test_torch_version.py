"""A run on torch before 2.2: each ``torch.mean`` keeps its input, so each RMSNorm its square."""

import pytest
import torch

from torchfit import Step
from torchfit._core.torch_rules import autograd_of, mean_keeps_input, torch_version

transformers = pytest.importorskip("transformers")

from tiny_configs import LLAMA_LIKE, traced_and_closed  # noqa: E402
from torchfit.memory import trace  # noqa: E402

BATCH, SEQ = 2, 128


def _saved(fn):
    """The tensors autograd keeps while ``fn`` runs (by identity)."""
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        fn()
    return kept


def test_the_installed_torch_keeps_no_mean_input_and_the_emulation_keeps_it():
    x = torch.randn(4, 8, requires_grad=True)
    square = x.pow(2)
    assert not mean_keeps_input()  # this rule's premise: torch >= 2.2 is installed
    assert not any(t is square for t in _saved(lambda: square.mean(-1)))
    with autograd_of("2.1.0"):
        kept = _saved(lambda: square.mean(-1))
        kept += _saved(lambda: torch.mean(square, dim=-1, keepdim=True))
    assert sum(t is square for t in kept) == 2
    # a mean autograd does not record keeps nothing
    with autograd_of("2.1.0"), torch.no_grad():
        assert _saved(lambda: square.mean(-1)) == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [("2.1.0", (2, 1, 0)), ("2.1.0+cu121", (2, 1, 0)), ("2.2", (2, 2, 0)), ("v2.13.1", (2, 13, 1))],
)
def test_versions_are_read_as_pip_writes_them(text, expected):
    assert torch_version(text) == expected


def _estimates_and_traces(family, precision, version):
    step = dict(precision=precision, device="cuda", optimizer="sgd", torch_version=version)
    return traced_and_closed(family, BATCH, SEQ, around=lambda: autograd_of(version), **step)


@pytest.mark.parametrize("family", ["Llama", "Qwen3"])
@pytest.mark.parametrize("precision", ["32-true", "bf16-true"])
def test_the_closed_form_adds_what_the_trace_keeps_on_torch_2_1(family, precision):
    old = _estimates_and_traces(family, precision, "2.1.0")
    new = _estimates_and_traces(family, precision, "2.13.0")
    traced, closed = old[0] - new[0], old[1] - new[1]
    norms = 2 * LLAMA_LIKE["num_hidden_layers"] + 1  # two per block and the final one
    # the fp32 square of every RMSNorm (Qwen3's per-head q/k norms too)
    assert traced >= norms * 4 * LLAMA_LIKE["hidden_size"] * BATCH * SEQ
    per_token = abs(traced - closed) / (BATCH * SEQ)
    assert per_token <= 16, (traced, closed)


def test_step_checks_the_version_where_it_is_made():
    with pytest.raises(TypeError, match=r"torch_version.*'2.1.0'"):
        Step(torch_version=2.1)
    with pytest.raises(ValueError, match=r"cannot read the torch version 'latest'"):
        Step(torch_version="latest")
    assert Step(torch_version="2.1.0").torch_version == "2.1.0"


def test_a_real_run_refuses_another_torch_s_rules_and_a_trace_follows_them():
    from torchfit.memory import measure_step

    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{
        k: v for k, v in LLAMA_LIKE.items() if "token" not in k}))  # fmt: skip
    ids = torch.randint(1, LLAMA_LIKE["vocab_size"], (2, 256))
    inputs = {"input_ids": ids, "labels": ids}
    old = Step(batch_size=2, torch_version="2.1.0", device="cpu", optimizer="sgd")
    with pytest.raises(ValueError, match=r"installed torch .*Step\(torch_version='2.1.0'\)"):
        measure_step(model, inputs, step=old)
    assert measure_step(model, inputs, step=old.replace(torch_version="2.13.0")).peak > 0
    new = old.replace(torch_version=None)
    kept = trace(model, inputs, step=old).total - trace(model, inputs, step=new).total
    assert kept > 0  # the RMSNorms' squares
