"""A LoRA layer's and a 4-bit Linear's own Python: charged per call, and what binds a small step."""

import collections

import pytest
import torch
from torch import nn

from tiny_configs import tiny_llama
from torchfit.speed import step_time
from torchfit.speed.dispatch import HOST_OP_S, host_seconds
from torchfit.speed.ops import OpKind, Phase
from torchfit.speed.python_cost import LAYER_PYTHON_S, python_hooks
from torchfit.speed.record import OpRecorder

peft = pytest.importorskip("peft")


def _charges(model, x, quantized=()):
    recorder = OpRecorder()
    handles = python_hooks(model, recorder, quantized)
    try:
        with recorder:
            y = model(x)
            recorder.phase = Phase.BACKWARD
            y.sum().backward()
    finally:
        for handle in handles:
            handle.remove()
    return collections.Counter(
        (op.name, op.phase) for op in recorder.ops if op.kind is OpKind.PYTHON
    )


def _adapted(layers=3):
    chain = nn.Sequential(*[nn.Linear(16, 16, bias=False) for _ in range(layers)])
    chain.requires_grad_(False)
    config = peft.LoraConfig(r=4, target_modules=[str(i) for i in range(layers)])
    return peft.get_peft_model(chain, config)


def test_each_lora_layer_is_charged_once_per_forward_and_its_4bit_base_each_way():
    model = _adapted()
    x = torch.randn(2, 16, requires_grad=True)
    assert _charges(model, x) == {("peft-lora", Phase.FORWARD): 3}  # no Python in backward
    bases = [m.base_layer for m in model.modules() if hasattr(m, "lora_A")]
    found = _charges(model, x, quantized=bases)
    assert found == {
        ("peft-lora-over-4bit", Phase.FORWARD): 3,
        ("peft-lora-over-4bit", Phase.BACKWARD): 3,
        ("bitsandbytes-4bit", Phase.FORWARD): 3,
        ("bitsandbytes-4bit", Phase.BACKWARD): 3,
    }
    # where no gradient flows back through a frozen 4-bit layer's input (the first one
    # here), its MatMul4Bit.backward does not run
    found = _charges(model, x.detach(), quantized=bases)
    assert found[("bitsandbytes-4bit", Phase.BACKWARD)] == 2
    assert found[("bitsandbytes-4bit", Phase.FORWARD)] == 3


def test_a_plain_model_has_no_python_charge():
    chain = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    assert _charges(chain, torch.randn(2, 16, requires_grad=True)) == {}


def test_python_rows_add_their_own_seconds_to_the_host_not_a_kernel_s():
    model = _adapted(layers=2)
    recorder = OpRecorder()
    handles = python_hooks(model, recorder, ())
    with recorder:
        model(torch.randn(2, 16))
    for handle in handles:
        handle.remove()
    kernels = sum(op.count for op in recorder.ops if op.kind is not OpKind.PYTHON)
    expected = kernels * HOST_OP_S["python"] + 2 * LAYER_PYTHON_S["peft-lora"][0]
    assert host_seconds(recorder.ops, train=False)[Phase.FORWARD] == pytest.approx(expected)


def test_a_small_qlora_step_waits_for_the_host_and_a_large_one_does_not():
    config = tiny_llama(hidden_size=256, intermediate_size=512, num_hidden_layers=4)
    qlora = dict(dtype="nf4", precision="bf16-mixed", lora_rank=16, lora_targets="all-linear")
    small = step_time(config, "H200", batch_size=1, seq_len=64, **qlora)
    linears = 4 * 7  # every projection of every layer, each a 4-bit base under an adapter
    forward, backward = (
        sum(LAYER_PYTHON_S[kind][way] for kind in ("bitsandbytes-4bit", "peft-lora-over-4bit"))
        for way in (0, 1)
    )
    assert small.phase_seconds("forward") >= linears * forward
    assert small.phase_seconds("backward") >= linears * backward
    assert {r.phase for r in small.breakdown if r.kind == "host"} >= {"forward", "backward"}
    assert small.host_share > 0.5 and "host-bound: the GPU waits" in str(small)
    large = step_time(config, "H200", batch_size=64, seq_len=2048, **qlora)
    assert not [r for r in large.breakdown if r.kind == "host" and r.phase != "optimizer"]
    assert large.host_share < 0.01 and "host-bound" not in str(large)
    assert large.to_dict()["host_share"] == large.host_share
