"""The host's dispatch floor: a step of many tiny kernels takes the host's time."""

import pytest
from torch import nn

from torchfit.speed import step_time
from torchfit.speed.dispatch import (
    HOST_OP_S,
    SYNCHRONIZED,
    SYNCHRONIZED_STEP_S,
    host_seconds,
    serial_host_seconds,
)
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


def _mlp(width: int = 256, layers: int = 6) -> nn.Module:
    return nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])


@pytest.mark.parametrize("optimizer", ["adamw-8bit", "paged-adamw-8bit", "paged-adamw", "lion"])
def test_bitsandbytes_waits_for_each_parameter_s_kernel(optimizer):
    t = step_time(_mlp(), "H200", batch_size=64, input_shape=(256,), optimizer=optimizer)
    kernels = [r for r in t.breakdown if r.phase == "optimizer" and r.kind != "host"]
    # one kernel per parameter tensor (6 weights, 6 biases), none of them multi-tensor
    assert sum(r.kernels for r in kernels) == 12
    # the host's Python, launch and synchronize around each, added, not overlapped
    gpu_s = sum(r.seconds for r in kernels)
    assert t.phase_seconds("optimizer") == pytest.approx(gpu_s + 12 * SYNCHRONIZED_STEP_S)


def test_torch_adamw_overlaps_its_launches():
    t = step_time(_mlp(), "H200", batch_size=64, input_shape=(256,), optimizer="adamw")
    optimizer_kernels = sum(r.kernels for r in t.breakdown if r.phase == "optimizer")
    assert optimizer_kernels < 12 * 8  # multi-tensor: far fewer launches than passes x tensors
    expected = max(
        sum(r.seconds for r in t.breakdown if r.phase == "optimizer" and r.kind != "host"),
        optimizer_kernels * HOST_OP_S["cpp"],
    )
    assert t.phase_seconds("optimizer") == pytest.approx(expected)


def test_serial_host_seconds_counts_only_synchronized_kernels():
    waits = Op("adamw_8bit", OpKind.MEMORY, Phase.OPTIMIZER, 0.0, 8.0, "fp32",
               backend=SYNCHRONIZED, count=3)  # fmt: skip
    overlaps = Op("add", OpKind.MEMORY, Phase.OPTIMIZER, 0.0, 8.0, "fp32", count=5)
    assert serial_host_seconds([waits, overlaps])[Phase.OPTIMIZER] == pytest.approx(
        3 * SYNCHRONIZED_STEP_S
    )
    assert host_seconds([waits, overlaps], train=True)[Phase.OPTIMIZER] == pytest.approx(
        5 * HOST_OP_S["cpp"]
    )
