"""Kernel rules behind the H200 vision and BERT steps: FA2 tiles, two-pass norms, TMA."""

import pytest
import torch
from torch import nn

from torchfit.memory import gpu
from torchfit.speed.cards import peaks
from torchfit.speed.curves import flash_tile_fill
from torchfit.speed.ops import Op, OpKind, Phase
from torchfit.speed.record import OpRecorder
from torchfit.speed.roofline import MMA_SYNC_SHARE, kernel_seconds
from torchfit.speed.traffic import second_pass_bytes, tma_aligned

H200 = peaks(gpu("H200"))


def _attention(seq, *, head_dim=64, backward=False):
    batch, heads = 64, 12
    flops = 4.0 * batch * heads * seq * seq * head_dim * (2.5 if backward else 1.0)
    moved = 4.0 * batch * heads * seq * head_dim * 2
    name = "_flash_attention_backward" if backward else "_flash_attention"
    phase = Phase.BACKWARD if backward else Phase.FORWARD
    shape = (batch, heads, seq, seq, head_dim, 0)
    return Op(name, OpKind.ATTENTION, phase, flops, moved, "bf16", shape, "flash")


@pytest.mark.parametrize("backward", [False, True])
def test_a_ragged_sequence_pays_for_flash_attentions_whole_tiles(backward):
    # ViT-B/16's 197 tokens run two 128-row tiles, as 256 tokens do: FA2 computes
    # the padded tile, so 197 costs about what 256 costs, not (197/256)² of it
    vit = kernel_seconds(_attention(197, backward=backward), H200, hopper=True)
    full = kernel_seconds(_attention(256, backward=backward), H200, hopper=True)
    assert vit == pytest.approx(full, rel=0.1)


@pytest.mark.parametrize(
    ("seq_q", "seq_k", "head_dim", "backward", "fill"),
    [
        (197, 197, 64, False, (197 / 256) ** 2),
        (2048, 2048, 128, True, 1.0),
        (200, 200, 128, False, 200 / 256 * 200 / 256),  # 128 x 64 tiles: 256 and 256
        (1, 4096, 128, False, 1.0),  # one query (decoding) is not padded to a tile
    ],
)
def test_flash_tile_fill_rounds_each_dimension_to_fa2s_tile(seq_q, seq_k, head_dim, backward, fill):
    assert flash_tile_fill(seq_q, seq_k, head_dim, backward=backward) == pytest.approx(fill)


def _recorded(fn, *tensors):
    recorder = OpRecorder()
    with recorder:
        fn(*tensors)
    return recorder.ops


def test_layer_norm_backward_reads_the_gradient_and_input_twice():
    x = torch.randn(32, 768, requires_grad=True)
    norm = nn.LayerNorm(768)
    out = norm(x)
    recorder = OpRecorder()
    with recorder:
        out.backward(torch.ones_like(out))
    op = next(o for o in recorder.ops if o.name == "native_layer_norm_backward")
    one_pass = 3 * x.nbytes  # dY and X read, dX written (mean, rstd, weights are small)
    assert op.bytes >= one_pass + 2 * x.nbytes


def test_batch_norm_in_training_reads_its_input_twice_and_not_in_eval():
    x = torch.randn(8, 16, 32, 32)
    bn = nn.BatchNorm2d(16)
    train = next(o for o in _recorded(bn, x) if "batch_norm" in o.name)
    bn.eval()
    evaluation = next(o for o in _recorded(bn, x) if "batch_norm" in o.name)
    assert train.bytes - evaluation.bytes >= x.nbytes


def test_cudnns_persistent_channels_last_batch_norm_is_one_pass():
    x = torch.empty(8, 16, 32, 32)
    args = (x, None, None, None, None, True)
    last = (x.to(memory_format=torch.channels_last), *args[1:])
    assert second_pass_bytes("native_batch_norm", args) == x.nbytes
    assert second_pass_bytes("native_batch_norm", last) == 0
    # bf16 batch norm is PyTorch's own kernel, two passes whatever the layout
    bf16 = (x.to(torch.bfloat16, memory_format=torch.channels_last), *args[1:])
    assert second_pass_bytes("native_batch_norm", bf16) == x.nbytes // 2


def test_a_vocabulary_not_a_multiple_of_eight_is_not_tma_aligned():
    hidden = torch.empty(64, 768, dtype=torch.bfloat16)
    bert = torch.empty(768, 30522, dtype=torch.bfloat16)
    llama = torch.empty(768, 128256, dtype=torch.bfloat16)
    assert not tma_aligned(hidden, bert) and tma_aligned(hidden, llama)
    ops = _recorded(torch.mm, hidden, bert) + _recorded(torch.mm, hidden, llama)
    assert [op.backend for op in ops if op.name == "mm"] == ["unaligned", ""]


def test_an_unaligned_16_bit_matmul_runs_on_mma_sync_on_hopper_only():
    shape = (1, 16384, 30522, 768)
    flops = 2.0 * 16384 * 30522 * 768
    moved = 2.0 * (16384 * 768 + 768 * 30522 + 16384 * 30522)
    aligned = Op("mm", OpKind.MATMUL, Phase.FORWARD, flops, moved, "bf16", shape)
    unaligned = Op("mm", OpKind.MATMUL, Phase.FORWARD, flops, moved, "bf16", shape, "unaligned")
    slow = kernel_seconds(unaligned, H200, hopper=True) / kernel_seconds(aligned, H200, hopper=True)
    assert slow == pytest.approx(1 / MMA_SYNC_SHARE, rel=0.1)
    a100 = peaks(gpu("A100 80GB"))
    assert kernel_seconds(unaligned, a100, hopper=False) == kernel_seconds(
        aligned, a100, hopper=False
    )
    fp32 = [
        Op(o.name, o.kind, o.phase, o.flops, o.bytes, "fp32", o.shape, o.backend)
        for o in (aligned, unaligned)
    ]
    assert kernel_seconds(fp32[0], H200, hopper=True) == kernel_seconds(fp32[1], H200, hopper=True)


# torch.maximum in fp16 on an H200: bytes moved and TB/s (TileOPs issue 512, pull 539)
_H200_MAXIMUM = [(25.17e6, 1.83), (62.91e6, 2.79), (125.83e6, 3.37)]
# torch gelu in fp32 on an H100: elements and seconds (pytorch/pytorch pull 141959)
_H100_GELU = [(1 << 24, 50.5e-6), (1 << 25, 93.1e-6), (1 << 26, 181.5e-6), (1 << 27, 356.6e-6)]


@pytest.mark.parametrize(("moved", "tb_s"), _H200_MAXIMUM)
def test_hopper_memory_kernels_meet_the_measured_h200_points(moved, tb_s):
    op = Op("maximum", OpKind.MEMORY, Phase.FORWARD, 0.0, moved, "fp16")
    assert kernel_seconds(op, H200, hopper=True) == pytest.approx(moved / (tb_s * 1e12), rel=0.03)


@pytest.mark.parametrize(("elements", "seconds"), _H100_GELU)
def test_hopper_memory_curve_meets_an_h100_sweep_it_was_not_drawn_from(elements, seconds):
    op = Op("gelu", OpKind.MEMORY, Phase.FORWARD, 0.0, 8.0 * elements, "fp32")
    h100 = peaks(gpu("H100"))
    assert kernel_seconds(op, h100, hopper=True) == pytest.approx(seconds, rel=0.1)


def test_tiny_kernels_keep_the_floor_so_the_host_still_binds_them():
    tiny = Op("add", OpKind.MEMORY, Phase.FORWARD, 0.0, 4096.0, "fp32")
    assert kernel_seconds(tiny, H200, hopper=True) < 2.1e-6
    # older cards keep 83% of the bandwidth and 2 µs (the rule checked on a V100)
    a100 = peaks(gpu("A100 80GB"))
    big = Op("add", OpKind.MEMORY, Phase.FORWARD, 0.0, 1e9, "fp32")
    assert kernel_seconds(big, a100, hopper=False) == pytest.approx(
        1e9 / (a100.bandwidth_gb_s * 1e9 * 0.83) + 2e-6
    )


def test_a_vocabulary_softmax_reads_its_rows_three_times_and_a_short_one_once():
    logits = torch.randn(4, 50257, requires_grad=True)
    recorder = OpRecorder()
    with recorder:
        out = torch.log_softmax(logits, dim=-1)
    recorder.phase = Phase.BACKWARD
    with recorder:
        out.backward(torch.ones_like(out))
    forward = next(o for o in recorder.ops if o.name == "_log_softmax")
    backward = next(o for o in recorder.ops if o.name == "_log_softmax_backward_data")
    assert forward.bytes == 4 * logits.nbytes  # max, sum, output: three reads, one write
    assert backward.bytes >= 4 * logits.nbytes  # the gradient twice, the output, the write
    short = torch.randn(4, 1024)
    ops = _recorded(torch.softmax, short, -1)
    assert next(o for o in ops if o.name == "_softmax").bytes == 2 * short.nbytes
