"""The host's dispatch floor: a step of many tiny kernels takes the host's time."""

import pytest
from torch import nn

from torchfit.speed import step_time
from torchfit.speed.dispatch import HOST_OP_S, host_seconds
from torchfit.speed.ops import Op, OpKind, Phase


def _tiny_deep_mlp(layers: int = 64) -> nn.Module:
    blocks = [m for _ in range(layers) for m in (nn.Linear(32, 32), nn.ReLU())]
    return nn.Sequential(*blocks)


def test_many_small_kernels_are_bound_by_the_host_not_the_gpu():
    t = step_time(_tiny_deep_mlp(), "H200", batch_size=2, input_shape=(32,), precision="32-true")
    host_rows = [row for row in t.breakdown if row.kind == "host"]
    assert {row.phase for row in host_rows} >= {"forward", "backward"}
    forward_kernels = sum(
        row.kernels for row in t.breakdown if row.phase == "forward" and row.kind != "host"
    )
    # the forward takes the host's 6.8 µs per kernel, not the GPU's few µs of tiny kernels
    assert t.phase_seconds("forward") == pytest.approx(
        forward_kernels * HOST_OP_S["python-autograd"]
    )
    assert t.seconds == pytest.approx(sum(row.seconds for row in t.breakdown))


def test_large_kernels_leave_the_gpu_setting_the_pace():
    wide = nn.Sequential(nn.Linear(8192, 8192), nn.ReLU(), nn.Linear(8192, 8192))
    t = step_time(wide, "H200", batch_size=8192, input_shape=(8192,), precision="bf16-true")
    assert not [row for row in t.breakdown if row.kind == "host"]


def test_host_seconds_counts_each_phase_at_its_own_rate():
    ops = [
        Op("add", OpKind.MEMORY, phase, 0.0, 8.0, "fp32", count=10)
        for phase in (Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER)
    ]
    found = host_seconds(ops, train=False)
    assert found[Phase.FORWARD] == pytest.approx(10 * HOST_OP_S["python"])
    assert found[Phase.BACKWARD] == found[Phase.OPTIMIZER] == pytest.approx(10 * HOST_OP_S["cpp"])
