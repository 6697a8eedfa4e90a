"""CUDA's autocast op lists on CPU tensors: what each op returns and what autograd saves."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from torchfit.memory import trace, trace_step
from torchfit.memory.kernels.autocast import cuda_autocast_on_cpu

BF16 = torch.bfloat16


def _dtypes(fn):
    x = torch.randn(4, 16, requires_grad=True)
    w = torch.randn(16, 16)
    with torch.autocast("cpu", dtype=BF16):
        return fn(x, w)


CASES = {
    "linear": (lambda x, w: torch.nn.functional.linear(x, w), BF16, BF16),
    "softmax": (lambda x, w: torch.softmax(x.to(BF16), -1), BF16, torch.float32),
    "layer_norm": (
        lambda x, w: torch.nn.functional.layer_norm(x.to(BF16), (16,)),
        BF16,
        torch.float32,
    ),
    "exp": (lambda x, w: torch.exp(x.to(BF16)), BF16, torch.float32),
    "pow": (lambda x, w: torch.pow(x.to(BF16), 3.0), BF16, torch.float32),
    "sum": (lambda x, w: x.to(BF16).sum(), BF16, torch.float32),
    "mv": (lambda x, w: torch.mv(w, x[0]), torch.float32, BF16),
    # CPU autocast runs max_pool3d in fp32; CUDA has no rule for it
    "max_pool3d": (
        lambda x, w: torch.nn.functional.max_pool3d(x.to(BF16).view(1, 1, 4, 4, 4), 2),
        torch.float32,
        BF16,
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_op_follows_the_cuda_list_only_inside_the_emulation(name):
    fn, on_cpu, on_cuda = CASES[name]
    assert _dtypes(fn).dtype == on_cpu
    with cuda_autocast_on_cpu():
        assert _dtypes(fn).dtype == on_cuda
    assert _dtypes(fn).dtype == on_cpu  # the CPU's own lists are back


def test_softmax_saves_its_fp32_output_and_the_matmul_the_cast_copy():
    saved = []
    x = torch.randn(2, 8, 8, requires_grad=True)
    v = torch.randn(2, 8, 8, requires_grad=True)
    with (
        cuda_autocast_on_cpu(),
        torch.autocast("cpu", dtype=BF16),
        torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.dtype) or t, lambda t: t),
    ):
        torch.bmm(torch.softmax(torch.bmm(x, v), -1), v)
    assert torch.float32 in saved  # softmax's output
    assert saved.count(BF16) == 4  # each bmm's two 16-bit inputs, the probabilities' cast too


def test_a_cuda_trace_under_autocast_keeps_fp32_probabilities():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=4,
        n_positions=128,
        vocab_size=500,
        attn_implementation="eager",
        attn_pdrop=0.0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, 500, (4, 128))
    inputs = {"input_ids": ids, "labels": ids}
    common = dict(autocast_dtype=BF16, optimizer="sgd")
    cuda = trace(model, inputs, device="cuda", **common)
    cpu = trace(model, inputs, device="cpu", **common)
    # two layers of b*a*s*s probabilities kept in fp32 (CUDA) instead of bf16 (CPU), and
    # their bf16 copies for the matmul
    probabilities = 2 * 4 * 4 * 128 * 128
    assert cuda.activations - cpu.activations >= probabilities * 2
    assert any("CUDA's op lists" in note for note in cuda.notes)


# --- the step's own torch.autocast("cuda") in a CUDA-target trace_step -----------------


def _amp_step(device_type, *, enabled=True):
    def step(model, optimizer, x):
        scaler = torch.amp.GradScaler("cuda", enabled=False)
        with torch.autocast(device_type, dtype=torch.float16, enabled=enabled):
            loss = torch.softmax(model(x), -1).square().mean()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()

    return step


def _net():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    return net, torch.optim.SGD(net.parameters(), lr=0.1), torch.randn(32, 64)


def test_a_steps_cuda_autocast_is_traced_as_cuda_runs_it():
    cuda = trace_step(_amp_step("cuda"), *_net(), device="cuda")
    cpu_lists = trace_step(_amp_step("cpu"), *_net(), device="cuda")  # CUDA's lists on CPU
    fp32 = trace_step(_amp_step("cuda", enabled=False), *_net(), device="cuda")
    assert cuda.estimate.total == cpu_lists.estimate.total
    assert cuda.estimate.total != fp32.estimate.total  # was equal: autocast("cuda") was off
    assert any("torch.autocast('cuda', dtype=torch.float16)" in n for n in cuda.estimate.notes)


def test_torch_autocast_is_itself_again_after_the_trace():
    trace_step(_amp_step("cuda"), *_net(), device="cuda")
    with pytest.warns(UserWarning, match="CUDA is not available"):
        region = torch.autocast("cuda", dtype=torch.float16)
    assert not region._enabled


class _Ops(torch.utils._python_dispatch.TorchDispatchMode):
    """The ATen ops that run, with their floating input and output dtypes."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        floats = [a.dtype for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
        self.seen.append((func.__name__, floats[:1], getattr(out, "dtype", None)))
        return out


def _ops_of(fn):
    """On fake tensors, as a trace runs them (the CPU has no fused half-to-float kernel)."""
    with FakeTensorMode():
        x = torch.randn(8, 32, dtype=torch.float16, requires_grad=True)
        y = torch.randint(0, 32, (8,))
        with cuda_autocast_on_cpu(), torch.autocast("cpu", dtype=torch.float16), _Ops() as ops:
            out = fn(x, y)
        with _Ops() as back:
            out.float().sum().backward()
        return ops.seen, back.seen, x.grad.dtype


def test_fp16_softmax_runs_cudas_fused_half_to_float_kernel():
    # CUDA: no fp32 copy of the fp16 input, an fp32 result, an fp16 gradient.
    forward, backward, grad = _ops_of(lambda x, _y: torch.softmax(x, -1))
    assert ("_softmax.default", [torch.float16], torch.float32) in forward
    assert not any(name == "_to_copy.default" for name, _, _ in forward)
    assert grad == torch.float16
    assert ("_softmax_backward_data.default", [torch.float32], torch.float16) in backward


def test_fp16_cross_entropy_casts_at_nll_loss_as_cuda_does():
    # CUDA's cross_entropy_loss is not autocast as a whole: log_softmax runs in fp16, and
    # only nll_loss casts its input to fp32 (so an fp16 and an fp32 copy are kept).
    forward, _, grad = _ops_of(lambda x, y: torch.nn.functional.cross_entropy(x, y))
    assert ("_log_softmax.default", [torch.float16], torch.float16) in forward
    assert ("_to_copy.default", [torch.float16], torch.float32) in forward
    assert ("nll_loss_forward.default", [torch.float32]) in [(n, d) for n, d, _ in forward]
    assert grad == torch.float16
