"""Copies CUDA wrappers make of strided inputs, and dropout inside fused attention."""

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from torchfit.memory import gpu
from torchfit.memory.kernels.cuda import FusedSdpa
from torchfit.speed.cards import peaks
from torchfit.speed.curves import ATTENTION_DROPOUT
from torchfit.speed.layouts import hidden_copies
from torchfit.speed.ops import Op, OpKind, Phase
from torchfit.speed.record import OpRecorder, attention_dropout
from torchfit.speed.roofline import kernel_seconds

H200 = peaks(gpu("H200"))


def _recorded(fn):
    recorder = OpRecorder()
    with recorder:
        fn(recorder)
    return recorder.ops


class _VitBlock(nn.Module):
    """torchvision's ViT encoder block: batch-first attention, then a residual sum."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim)
        self.attention = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln_2 = nn.LayerNorm(dim)
        self.mlp = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln_1(x)
        y, _ = self.attention(y, y, y, need_weights=False)
        y = y + x
        return y + self.mlp(self.ln_2(y))


def _names_before(ops, name):
    """The op names recorded just before each ``name``."""
    names = [op.name for op in ops]
    return [names[i - 1] for i, n in enumerate(names) if n == name and i]


def test_a_layer_norm_of_a_transposed_sum_is_preceded_by_its_copy():
    block = _VitBlock()
    x = torch.randn(2, 9, 32, requires_grad=True)

    def step(recorder):
        out = block(x)
        recorder.phase = Phase.BACKWARD
        out.sum().backward()

    ops = _recorded(step)
    copies = [op for op in ops if op.name == "contiguous"]
    forward = [op for op in copies if op.phase is Phase.FORWARD]
    # ln_2 sees attention's transposed output plus the input; ln_1 a contiguous input
    assert len(forward) == 1
    assert forward[0].bytes == 2 * x.nbytes
    assert "contiguous" in _names_before(ops, "native_layer_norm")
    assert any(op.phase is Phase.BACKWARD for op in copies)


def test_a_contiguous_layer_norm_input_needs_no_copy():
    x = torch.randn(2, 9, 32)
    assert hidden_copies("native_layer_norm", (x, [32], None, None, 1e-5)) == []
    strided = x.transpose(0, 1)
    assert hidden_copies("native_layer_norm", (strided, [32], None, None, 1e-5)) == [2 * x.nbytes]


def _attention_backward(permute_first: bool):
    q = torch.randn(2, 4, 16, 8, dtype=torch.bfloat16, requires_grad=True)

    def step(recorder):
        out = F.scaled_dot_product_attention(q, q, q)
        # nn.MultiheadAttention: sequence-first; transformers: batch, sequence, heads
        order = (2, 0, 1, 3) if permute_first else (0, 2, 1, 3)
        merged = out.permute(*order).contiguous()
        recorder.phase = Phase.BACKWARD
        merged.float().sum().backward()

    return _recorded(step)


@pytest.mark.parametrize(("permute_first", "copies"), [(True, 1), (False, 0)])
def test_flash_backward_copies_a_gradient_not_in_its_own_order(permute_first, copies):
    ops = _attention_backward(permute_first)
    backward = [op for op in ops if op.kind is OpKind.ATTENTION and op.phase is Phase.BACKWARD]
    assert backward and backward[0].backend == "flash"
    before = _names_before(ops, backward[0].name)
    assert before.count("contiguous") == copies


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_causal_attention_is_causal_forward_and_backward_on_either_kernel(dtype):
    # fp32 runs as CUDA's memory-efficient op, whose backward has is_causal after
    # grad_input_mask; 16-bit as the flash op standing in for FlashAttention-2
    with FakeTensorMode():
        q = torch.randn(2, 4, 16, 8, dtype=dtype, requires_grad=True)

    def step(recorder):
        with q.fake_mode, FusedSdpa().installed():
            out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
            recorder.phase = Phase.BACKWARD
            out.float().sum().backward()

    attention = [op for op in _recorded(step) if op.kind is OpKind.ATTENTION]
    assert [op.phase for op in attention] == [Phase.FORWARD, Phase.BACKWARD]
    assert all(op.shape[5] == 1 for op in attention), [op.name for op in attention]


def test_attention_dropout_is_read_from_forward_and_backward_schemas():
    flash = "_scaled_dot_product_flash_attention"
    assert attention_dropout(flash, (None, None, None, 0.1), {}) == 0.1
    backward_args = (None,) * 10 + (0.2,)
    assert attention_dropout(f"{flash}_backward", backward_args, {}) == 0.2
    efficient = "_scaled_dot_product_efficient_attention"
    assert attention_dropout(efficient, (None,) * 5 + (0.3,), {}) == 0.3
    assert attention_dropout(efficient, (None,) * 5, {"dropout_p": 0.4}) == 0.4


def test_recorded_attention_carries_its_dropout():
    # fake tensors, as a step records: the CPU kernel itself refuses dropout
    with FakeTensorMode():
        q = torch.randn(2, 4, 16, 8, dtype=torch.bfloat16)

    def step(_):
        with q.fake_mode, FusedSdpa().installed():  # CUDA's fused kernel
            F.scaled_dot_product_attention(q, q, q, dropout_p=0.1)
            F.scaled_dot_product_attention(q, q, q)

    with_dropout, without = [op for op in _recorded(step) if op.kind is OpKind.ATTENTION]
    assert with_dropout.shape[6] == 1
    assert without.shape[6] == 0


def _attention_op(*, dtype, backward, dropout):
    batch, heads, seq, head_dim = 32, 12, 512, 64
    flops = 4.0 * batch * heads * seq * seq * head_dim * (2.5 if backward else 1.0)
    moved = 4.0 * batch * heads * seq * head_dim * 2
    phase = Phase.BACKWARD if backward else Phase.FORWARD
    shape = (batch, heads, seq, seq, head_dim, 0, int(dropout))
    backend = "flash" if dtype == "bf16" else "efficient"
    return Op("attention", OpKind.ATTENTION, phase, flops, moved, dtype, shape, backend)


@pytest.mark.parametrize("backward", [False, True])
def test_dropout_slows_16_bit_attention_by_the_measured_share(backward):
    plain = kernel_seconds(
        _attention_op(dtype="bf16", backward=backward, dropout=False), H200, hopper=True
    )
    dropped = kernel_seconds(
        _attention_op(dtype="bf16", backward=backward, dropout=True), H200, hopper=True
    )
    share = ATTENTION_DROPOUT["backward" if backward else "forward"]
    assert dropped / plain == pytest.approx(1 / share, rel=0.02)


def test_dropout_leaves_fp32_attention_alone():
    plain = kernel_seconds(
        _attention_op(dtype="fp32", backward=True, dropout=False), H200, hopper=True
    )
    dropped = kernel_seconds(
        _attention_op(dtype="fp32", backward=True, dropout=True), H200, hopper=True
    )
    assert dropped == plain
