"""FLOPs and bytes of recorded steps against hand-derived values and torch's FlopCounterMode."""

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from torchfit._core.step import OptimizerName
from torchfit._core.units import DType
from torchfit.speed.build import build_step_model
from torchfit.speed.ops import OpKind, Phase
from torchfit.speed.record import attention_flops
from torchfit.speed.workload import record_workload

transformers = pytest.importorskip("transformers")


def _flops(work, kind, phase):
    return sum(op.flops * op.count for op in work.ops if op.kind is kind and op.phase is phase)


def _record(model, *, train=True, **kw):
    built = build_step_model(
        model,
        batch_size=kw.get("batch", 2),
        seq_len=kw.get("seq"),
        input_shape=kw.get("shape"),
        dtype=torch.float32,
        attention="sdpa",
        train=train,
        checkpointing=False,
    )
    return record_workload(
        built,
        train=train,
        autocast=None,
        weights=DType.FP32,
        optimizer=OptimizerName.ADAMW if train else None,
        implementation="foreach",
        state_bytes=4,
        accumulation=1,
        batch_size=kw.get("batch", 2),
    )


def test_llama_matmul_flops_are_two_per_parameter_per_token_forward_four_backward():
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=100,
        tie_word_embeddings=False,
    )
    work = _record(config, batch=2, seq=16)
    tokens = 2 * 16
    # the Linears of each block (q, k, v, o, gate, up, down) and the head, by hand
    head_dim, kv = 16, 2 * 16
    block = 64 * 64 + 2 * 64 * kv + 64 * 64 + 3 * 64 * 128
    matmul_params = 2 * block + 64 * 100
    assert _flops(work, OpKind.MATMUL, Phase.FORWARD) == 2 * matmul_params * tokens
    assert _flops(work, OpKind.MATMUL, Phase.BACKWARD) == 4 * matmul_params * tokens
    causal = attention_flops(2, 4, 16, 16, head_dim, causal=True)
    assert _flops(work, OpKind.ATTENTION, Phase.FORWARD) == 2 * causal
    assert _flops(work, OpKind.ATTENTION, Phase.BACKWARD) == 2 * 2.5 * causal


def test_frozen_weights_have_no_weight_gradient_matmuls():
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    model[0].weight.requires_grad_(False)
    model[0].bias.requires_grad_(False)
    work = _record(model, batch=8, shape=(32,))
    backward = _flops(work, OpKind.MATMUL, Phase.BACKWARD)
    # only the second Linear's weight gradient: nothing before it needs a gradient
    assert backward == 2 * 8 * 64 * 10


class _SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2)
        self.fc = nn.Linear(16 * 7 * 7, 10)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv1(x)))
        x = torch.relu(self.conv2(x))
        return self.fc(x.flatten(1))


def test_forward_and_backward_flops_match_flop_counter_mode_on_a_real_cpu_step():
    torch.manual_seed(0)
    model = _SmallCNN()
    x = torch.randn(4, 3, 16, 16)
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.cross_entropy(model(x), torch.zeros(4, dtype=torch.long)).backward()
    real = counter.get_total_flops()
    work = _record(_SmallCNN(), batch=4, shape=(3, 16, 16))
    recorded = sum(
        op.flops * op.count for op in work.ops if op.kind in {OpKind.CONV, OpKind.MATMUL}
    )
    assert recorded == real


def test_gpt2_forward_flops_match_flop_counter_mode_on_real_tensors():
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128)
    config._attn_implementation = "eager"  # CPU SDPA is counted alike; eager is plain bmm
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.zeros(2, 32, dtype=torch.long)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(ids)
    built = build_step_model(
        config,
        batch_size=2,
        seq_len=32,
        input_shape=None,
        dtype=torch.float32,
        attention="eager",
        train=False,
        checkpointing=False,
    )
    work = record_workload(
        built,
        train=False,
        autocast=None,
        weights=DType.FP32,
        optimizer=None,
        implementation="foreach",
        state_bytes=4,
        accumulation=1,
        batch_size=2,
    )
    assert _flops(work, OpKind.MATMUL, Phase.FORWARD) == counter.get_total_flops()


def test_views_launch_no_kernel_and_a_copy_moves_its_bytes_twice():
    class Copy(nn.Module):
        def forward(self, x):
            return x.view(-1).t().contiguous().clone() * 1.0

    work = _record(Copy(), train=False, batch=4, shape=(256,))
    names = [op.name for op in work.ops]
    assert "view" not in names and "t" not in names
    clone = next(op for op in work.ops if op.name == "clone")
    assert clone.bytes == 2 * 4 * 256 * 4


def test_nchw_activations_are_transposed_and_channels_last_or_depthwise_are_not():
    from torchfit.speed.record import nchw_bytes

    x, out = torch.empty(2, 8, 16, 16), torch.empty(2, 16, 16, 16)
    assert nchw_bytes(x, out, groups=1, backward=False) == x.nbytes + out.nbytes
    assert nchw_bytes(x, out, groups=1, backward=True) == 2 * x.nbytes + out.nbytes
    assert nchw_bytes(x, out, groups=8, backward=False) == 0
    last = x.to(memory_format=torch.channels_last)
    assert nchw_bytes(last, out, groups=1, backward=False) == 0


@pytest.mark.parametrize("groups", [1, 64])
def test_convolution_backward_flops_are_one_forward_per_gradient_even_when_grouped(groups):
    model = nn.Conv2d(64, 64, 7, padding=3, groups=groups)
    built = build_step_model(
        model,
        batch_size=2,
        seq_len=None,
        input_shape=(64, 16, 16),
        dtype=torch.float32,
        attention="sdpa",
        train=True,
        checkpointing=False,
    )
    work = record_workload(
        built,
        train=True,
        autocast=None,
        weights=DType.FP32,
        optimizer=None,
        implementation="foreach",
        state_bytes=4,
        accumulation=1,
        batch_size=2,
    )
    conv = {op.phase: op.flops * op.count for op in work.ops if op.kind is OpKind.CONV}
    # the input needs no gradient: backward computes the weight gradient only
    assert conv[Phase.BACKWARD] == pytest.approx(conv[Phase.FORWARD])


def test_gpt2_conv1d_addmm_backward_is_two_matmuls_per_forward_one():
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128)
    work = _record(config, seq=32)
    forward = [op for op in work.ops if op.kind is OpKind.MATMUL and op.phase is Phase.FORWARD]
    backward = [op for op in work.ops if op.kind is OpKind.MATMUL and op.phase is Phase.BACKWARD]
    # four Conv1D per block (addmm) and the tied head (mm); each has an input and a
    # weight gradient in backward
    assert sum(op.count for op in forward) == 4 * 2 + 1
    assert sum(op.count for op in backward) == 2 * (4 * 2 + 1)
    assert _flops(work, OpKind.MATMUL, Phase.BACKWARD) == 2 * _flops(
        work, OpKind.MATMUL, Phase.FORWARD
    )
