"""CUDA's reduction staging buffers: sizes as a real card allocated them, and in a trace."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchfit._core.reduction import Reduction, threads_per_sm
from torchfit.memory import to_device
from torchfit.memory.kernels.cuda_reduce import CudaRules, reduction_of
from torchfit.memory.outline import live_peak
from torchfit.memory.tracing.tracer import trace_events, with_recorded_step

aten = torch.ops.aten

# Staging buffers in torch.cuda.memory snapshots of training steps on an H200 (132 SMs;
# torch 2.11, CUDA 13.0): the bias gradients of ViT-B/16 at batch 64 (12,608 rows, bf16
# autocast) and of GPT-2 at 8 x 1024 (fp32), and Llama-3.2-1B's RMSNorm weight gradients
# (bf16, 4 and 8 x 2048 tokens).
MEASURED = [
    ((12608, 768), (0,), torch.bfloat16, 77_463_552),
    ((12608, 3072), (0,), torch.bfloat16, 138_412_032),
    ((12608, 2304), (0,), torch.bfloat16, 139_198_464),
    ((8192, 768), (0,), torch.float32, 50_331_648),
    ((8192, 3072), (0,), torch.float32, 138_412_032),
    ((8192, 2304), (0,), torch.float32, 139_198_464),
    ((4, 2048, 2048), (0, 1), torch.bfloat16, 134_217_728),
    ((8, 2048, 2048), (0, 1), torch.bfloat16, 138_412_032),
]


@pytest.mark.parametrize(("shape", "dims", "dtype", "measured"), MEASURED)
def test_staging_buffers_are_the_bytes_an_h200_allocated(shape, dims, dtype, measured):
    grad = torch.empty(shape, dtype=dtype, device="meta")
    rules = CudaRules(sm_count=132, threads=threads_per_sm((9, 0)))
    assert rules(aten.sum.dim_IntList, (grad, list(dims), True), {}, None) == measured


def test_a_sum_along_the_rows_stages_nothing():
    # RMSNorm's x.pow(2).mean(-1): the lanes of a warp share each output, one block does
    x = torch.empty(8, 2048, 2048, device="meta")
    found = reduction_of(aten.mean.dim, (x, [-1], True), {})
    assert found is not None and found.along_fastest
    assert CudaRules()(aten.mean.dim, (x, [-1], True), {}, None) == 0


def test_other_ops_and_integer_sums_stage_nothing():
    x = torch.empty(8192, 768, device="meta")
    assert reduction_of(aten.relu.default, (x,), {}) is None
    ids = torch.empty(8192, 768, dtype=torch.long, device="meta")
    assert reduction_of(aten.sum.dim_IntList, (ids, [0]), {}) is None


def test_an_odd_width_loads_fewer_outputs_at_once():
    odd = reduction_of(aten.sum.dim_IntList, (torch.empty(4096, 30522, device="meta"), [0]), {})
    assert odd is not None and odd.vector == 2


def test_a_smaller_card_stages_less_or_nothing():
    bias = Reduction(3072, 12608, along_fastest=False, vector=4, accumulator=4)
    h200 = bias.staging_bytes(132, 2048)
    rtx_3060 = bias.staging_bytes(28, threads_per_sm((8, 6)))
    assert 0 < rtx_3060 < h200


@settings(max_examples=60, deadline=None)
@given(
    outputs=st.integers(1, 50_000),
    inputs=st.integers(1, 200_000),
    along=st.booleans(),
    vector=st.sampled_from([1, 2, 4]),
    sms=st.integers(1, 200),
)
def test_staging_grows_with_the_sms_and_stays_below_one_partial_per_input(
    outputs, inputs, along, vector, sms
):
    found = Reduction(outputs * vector, inputs, along_fastest=along, vector=vector, accumulator=4)
    small, large = found.staging_bytes(sms, 2048), found.staging_bytes(sms + 50, 2048)
    assert 0 <= small <= large
    # every block sums at least 16 values per thread: never more partials than inputs
    lanes = 1 if along else 32 * vector
    assert large <= 4 * outputs * vector * max(inputs // 16, 1) * lanes


class _BiasNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(256, 3072)
        self.down = torch.nn.Linear(3072, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x))).square().mean()


def test_a_trace_stages_each_bias_gradient_and_resizes_it_for_the_card():
    net = _BiasNet()
    traced = trace_events(net, torch.randn(4096, 256), optimizer="sgd", device="cuda")
    staged = [storage for storage in traced.storages if storage.op.endswith("scratch")]
    assert {s.module.split(" ")[0] for s in staged} >= {"up", "down"}
    assert {s.id for s in staged} <= dict(traced.resizable).keys()  # warm-up's are there too
    assert traced.estimate.peak_at.endswith("[aten.sum.dim_IntList scratch]")  # up's, 96 MiB
    placed = with_recorded_step(traced)
    h200, rtx_3060 = to_device(placed, gpu="H200"), to_device(placed, gpu="RTX 3060")
    assert any(
        "reduction staging buffers sized for NVIDIA GeForce RTX 3060" in n for n in rtx_3060.notes
    )
    assert h200.total == placed.total + 2 * 32 * 2**20  # the reference card's buffers
    # on the 3060 the buffers shrink and the peak moves to another moment of the step
    smaller = live_peak(placed.outline.on_card(28, 1536).events) - placed.total
    assert smaller < 0
    assert rtx_3060.total == placed.total + smaller + 2 * 8_519_680


# The fused attention backward's scratch in the same H200 snapshots: (query, key) shapes
# and dtype as the trace's CPU flash backward sees them, and the bytes allocated.
ATTENTION = [
    ((64, 12, 197, 64), (64, 12, 197, 64), torch.bfloat16, 39_337_216),  # ViT-B/16, flash
    ((4, 32, 2048, 64), (4, 8, 2048, 64), torch.bfloat16, 135_266_560),  # Llama-3.2-1B, GQA
    ((8, 12, 1024, 64), (8, 12, 1024, 64), torch.float32, 25_190_400),  # GPT-2, mem-efficient
]


@pytest.mark.parametrize(("query", "key", "dtype", "measured"), ATTENTION)
def test_the_attention_backward_scratch_is_what_an_h200_allocated(query, key, dtype, measured):
    q = torch.empty(query, dtype=dtype, device="meta")
    k = torch.empty(key, dtype=dtype, device="meta")
    # the trace runs fp32 (ungrouped) attention as the memory-efficient op, the rest as
    # the CPU flash op standing in for FlashAttention-2
    efficient = dtype == torch.float32 and query[1] == key[1]
    backward = (
        aten._scaled_dot_product_efficient_attention_backward.default
        if efficient
        else aten._scaled_dot_product_flash_attention_for_cpu_backward.default
    )
    found = CudaRules()(backward, (q, q, k, k), {}, None)
    assert abs(found / measured - 1) <= 0.015, found
