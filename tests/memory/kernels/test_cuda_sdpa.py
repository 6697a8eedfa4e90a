"""The CUDA target's fused attention: which kernel, and so how its output is laid out.

FlashAttention-2 (16-bit, no mask) allocates its output like the query; the
memory-efficient kernel (fp32, or a mask) always in (batch, sequence, heads, head size)
order. The layout decides whether the caller's ``.contiguous()`` copies the output:
``nn.MultiheadAttention`` copies an fp32 one before ``out_proj`` and keeps it for the
backward, a 16-bit one not.
"""

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from cuda_target import CloneSizes
from torchfit.memory.kernels.cuda import FusedSdpa

BATCH, HEADS, SEQ, WIDTH = 2, 4, 16, 8


def _query(dtype, *, heads=HEADS, mode=None):
    """A (batch, heads, sequence, head size) query contiguous in that order (Phi-3's)."""
    mode = mode or FakeTensorMode()
    with mode:
        return mode, torch.empty(BATCH, heads, SEQ, WIDTH, dtype=dtype, requires_grad=True)


def _attend(dtype, **kwargs):
    mode, q = _query(dtype)
    with mode, FusedSdpa().installed():
        return F.scaled_dot_product_attention(q, q, q, **kwargs)


def test_the_flash_kernel_lays_its_output_out_like_the_query():
    out = _attend(torch.bfloat16)
    assert out.is_contiguous()
    assert "Flash" in type(out.grad_fn).__name__


def test_the_memory_efficient_kernel_lays_its_output_out_batch_sequence_heads():
    out = _attend(torch.float32)
    assert not out.is_contiguous()
    assert out.transpose(1, 2).is_contiguous()
    assert "Efficient" in type(out.grad_fn).__name__


@pytest.mark.parametrize(("length", "padded"), [(SEQ, SEQ), (12, 16)])
def test_a_mask_takes_16_bit_attention_to_the_memory_efficient_kernel_as_a_bias(length, padded):
    # SDPA converts a boolean mask into a bias of the query's dtype, padded to a multiple
    # of 8 keys, and the kernel keeps that bias for its backward: one per call
    mode = FakeTensorMode()
    with mode:
        q = torch.empty(BATCH, HEADS, length, WIDTH, dtype=torch.bfloat16, requires_grad=True)
        mask = torch.ones(BATCH, 1, length, length, dtype=torch.bool)
    with mode, FusedSdpa().installed():
        out = F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    assert out.transpose(1, 2).is_contiguous()
    assert "Efficient" in type(out.grad_fn).__name__
    bias = out.grad_fn._saved_attn_bias
    assert bias.dtype == torch.bfloat16
    assert bias.shape == (BATCH, HEADS, length, length)
    assert bias.untyped_storage().nbytes() == BATCH * length * padded * 2


def test_grouped_heads_stay_on_the_kernel_that_takes_them():
    mode, q = _query(torch.float32)
    _, kv = _query(torch.float32, heads=HEADS // 2, mode=mode)
    with mode, FusedSdpa().installed():
        out = F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
    assert out.shape == q.shape
    assert "Flash" in type(out.grad_fn).__name__


@pytest.mark.parametrize(("dtype", "copies"), [(torch.float32, 1), (torch.bfloat16, 0)])
def test_multihead_attention_copies_the_memory_efficient_output(dtype, copies):
    with FakeTensorMode():
        attention = nn.MultiheadAttention(HEADS * WIDTH, HEADS, batch_first=True, dtype=dtype)
        x = torch.empty(BATCH, SEQ, HEADS * WIDTH, dtype=dtype, requires_grad=True)
        clones = CloneSizes()
        with FusedSdpa().installed(), clones:
            attention(x, x, x, need_weights=False)
    output = BATCH * SEQ * HEADS * WIDTH * dtype.itemsize
    # in either case the in-projection copies its sequence-first view of the input and
    # packs q, k and v (3 x the output's size)
    assert clones.sizes.count(3 * output) == 1
    assert clones.sizes.count(output) == 1 + copies
