"""The traced estimator against real allocations of the same step (`measure_step`)."""

import contextlib
import copy
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from torchfit.memory.kernels.accuracy import accuracy
from torchfit.memory.kernels.machine import CpuKind, this_cpu
from torchfit.memory.measure import measure_peak, measure_step
from torchfit.memory.tracing import trace, trace_events, trace_step

# The target: the traced total within 1% of the measured peak.
TOLERANCE = 0.01

PROPERTY = settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
)


def relative_error(predicted, measured):
    return (predicted - measured) / measured


def assert_close(model, inputs, *, tolerance=TOLERANCE, **step):
    measured = measure_step(model, inputs, device="cpu", **step).peak
    estimate = trace(model, inputs, **step)
    error = relative_error(estimate.total, measured)
    assert abs(error) <= tolerance, (estimate.total, measured, f"{error:+.4%}", estimate.peak_at)
    return estimate, measured


# -- model builders --------------------------------------------------------------------
def build_transformer(
    family, attn, *, layers, heads, head_dim, kv_heads, seq, batch, vocab, dropout
):
    transformers = pytest.importorskip("transformers")
    hidden = heads * head_dim
    torch.manual_seed(0)
    ids = torch.randint(0, vocab, (batch, seq))
    if family == "gpt2":
        config = transformers.GPT2Config(
            n_layer=layers,
            n_embd=hidden,
            n_head=heads,
            vocab_size=vocab,
            n_positions=64,
            attn_pdrop=dropout,
            resid_pdrop=dropout,
            embd_pdrop=dropout,
            bos_token_id=0,
            eos_token_id=0,
        )
        config._attn_implementation = attn
        return transformers.GPT2LMHeadModel(config), {"input_ids": ids, "labels": ids}
    if family == "llama":
        config = transformers.LlamaConfig(
            num_hidden_layers=layers,
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            vocab_size=vocab,
            max_position_embeddings=64,
            bos_token_id=0,
            eos_token_id=0,
            pad_token_id=0,
        )
        config._attn_implementation = attn
        return transformers.LlamaForCausalLM(config), {"input_ids": ids, "labels": ids}
    if family == "bert":
        config = transformers.BertConfig(
            num_hidden_layers=layers,
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_attention_heads=heads,
            vocab_size=vocab,
            max_position_embeddings=64,
            hidden_dropout_prob=dropout,
            attention_probs_dropout_prob=dropout,
        )
        config._attn_implementation = attn
        labels = torch.randint(0, 2, (batch,))
        return transformers.BertForSequenceClassification(config), {
            "input_ids": ids,
            "labels": labels,
        }
    config = transformers.ViTConfig(
        num_hidden_layers=layers,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_attention_heads=heads,
        image_size=16,
        patch_size=4,
        num_labels=3,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )
    config._attn_implementation = attn
    pixels = torch.randn(batch, 3, 16, 16)
    return transformers.ViTForImageClassification(config), {
        "pixel_values": pixels,
        "labels": torch.randint(0, 3, (batch,)),
    }


def build_cnn(seed):
    """Plain NCHW CNNs: convs 3x3/5x5 with 'same' padding, norms, activations, pooling."""
    rng = random.Random(seed)  # noqa: S311 - reproducible model shapes, not secrets
    torch.manual_seed(seed)
    channels, size = rng.choice([1, 3]), rng.randint(12, 28)
    inputs = torch.randn(rng.randint(2, 8), channels, size, size)
    layers, c_in = [], channels
    for _ in range(rng.randint(1, 3)):
        c_out, kernel, stride = rng.choice([8, 16, 32]), rng.choice([3, 5]), rng.choice([1, 1, 2])
        layers.append(
            nn.Conv2d(
                c_in, c_out, kernel, stride=stride, padding=kernel // 2, bias=rng.random() < 0.5
            )
        )
        size = (size - 1) // stride + 1
        norm = rng.choice(["batch", "group", "none"])
        if norm == "batch":
            layers.append(nn.BatchNorm2d(c_out))
        elif norm == "group":
            layers.append(nn.GroupNorm(4, c_out))
        layers.append(rng.choice([nn.ReLU, nn.GELU, nn.SiLU])())
        if size >= 8 and rng.random() < 0.4:
            layers.append(nn.MaxPool2d(2))
            size //= 2
        c_in = c_out
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, rng.choice([2, 10]))]
    return nn.Sequential(*layers), inputs


def build_grouped_cnn(seed):
    """A dense stem, then grouped and depthwise convs; NCHW or channels-last (2 in 5)."""
    rng = random.Random(seed)  # noqa: S311 - reproducible model shapes, not secrets
    torch.manual_seed(seed)
    size, c_in = rng.randint(10, 24), rng.choice([8, 16, 24, 32])
    inputs = torch.randn(rng.randint(2, 6), 3, size, size)
    layers = [nn.Conv2d(3, c_in, 3, padding=1, bias=rng.random() < 0.5)]
    for _ in range(rng.randint(1, 3)):
        stride = rng.choice([1, 1, 2])
        if rng.random() < 2 / 3:  # depthwise: groups == in == out channels
            c_out, kernel, groups = c_in, rng.choice([3, 5, 7]), c_in
        else:  # grouped: groups divide both channel counts, fewer than either
            c_out, kernel = rng.choice([8, 16, 24, 32, 48]), rng.choice([1, 3, 5])
            divisors = [g for g in range(2, min(c_in, c_out)) if c_in % g == 0 == c_out % g]
            groups = rng.choice(divisors)
        layers.append(
            nn.Conv2d(
                c_in,
                c_out,
                kernel,
                stride=stride,
                padding=kernel // 2,
                groups=groups,
                bias=rng.random() < 0.5,
            )
        )
        norm = rng.choice(["batch", "group", "none"])
        if norm == "batch":
            layers.append(nn.BatchNorm2d(c_out))
        elif norm == "group":
            layers.append(nn.GroupNorm(4, c_out))
        layers.append(rng.choice([nn.ReLU, nn.GELU, nn.SiLU])())
        c_in = c_out
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, rng.choice([2, 10]))]
    model = nn.Sequential(*layers)
    if rng.random() < 0.4:
        model = model.to(memory_format=torch.channels_last)
        inputs = inputs.contiguous(memory_format=torch.channels_last)
    return model, inputs


def build_mlp(seed):
    rng = random.Random(seed)  # noqa: S311 - reproducible model shapes, not secrets
    torch.manual_seed(seed)
    width, layers = rng.choice([16, 48, 96]), []
    for _ in range(rng.randint(1, 3)):
        layers.append(nn.Linear(width, width))
        if rng.random() < 0.5:
            layers.append(nn.LayerNorm(width))
        layers.append(rng.choice([nn.ReLU, nn.GELU, nn.Tanh])())
        if rng.random() < 0.5:
            layers.append(nn.Dropout(0.1))
    layers.append(nn.Linear(width, rng.choice([1, 10])))
    return nn.Sequential(*layers), torch.randn(rng.randint(1, 16), rng.randint(1, 12), width)


# -- property tests against real allocations -------------------------------------------
transformer_configs = st.fixed_dictionaries(
    {
        "family": st.sampled_from(["gpt2", "llama", "bert", "vit"]),
        "attn": st.sampled_from(["eager", "sdpa"]),
        "layers": st.integers(1, 2),
        "heads": st.sampled_from([2, 4]),
        "head_dim": st.sampled_from([8, 16]),
        "kv_heads": st.sampled_from([1, 2]),
        "seq": st.integers(4, 48),
        "batch": st.integers(1, 4),
        "vocab": st.integers(32, 300),
        "dropout": st.sampled_from([0.0, 0.1]),
    }
)


@PROPERTY
@given(
    config=transformer_configs,
    optimizer=st.sampled_from(["sgd", "adamw"]),
    mode=st.sampled_from(["train", "inference"]),
)
def test_tiny_transformers_within_one_percent(config, optimizer, mode):
    model, inputs = build_transformer(**config)
    assert_close(model, inputs, mode=mode, optimizer=optimizer)


@PROPERTY
@given(
    seed=st.integers(0, 10_000),
    optimizer=st.sampled_from(["sgd", "adamw"]),
    mode=st.sampled_from(["train", "inference"]),
)
def test_random_mlps_within_one_percent(seed, optimizer, mode):
    model, inputs = build_mlp(seed)
    assert_close(model, inputs, mode=mode, optimizer=optimizer)


@PROPERTY
@given(seed=st.integers(0, 10_000))
def test_random_cnns_inference_within_one_percent(seed):
    model, inputs = build_cnn(seed)
    assert_close(model, inputs, mode="inference", optimizer=None)


# oneDNN's convolution backward reorders its operands, allocates a scratchpad and copies
# its results back; kernels.onednn models the kernels this generator reaches (backward-
# weights jit:avx512_core / jit:avx2 with their reductions, backward-data jit:avx512_core
# and brgconv_strided). Measured (torch 2.13, AVX-512, 2 threads, seeds 0-59 x SGD/AdamW
# = 120 steps): 120 exact (+0.00%); before that model 44 within 1%, worst 45.1% low;
# seeds 60-99: 80 of 80 exact; 1 and 4 threads (seeds 0-19): 40 of 40 each. Seeds
# 100-399 with a strided conv that needs grad_input (95 SGD steps) were 91 exact, worst
# 17.2% low, before brgconv_strided's per-thread grad_output buffer (rounded to 4096
# elements) and gemm:jit's 4x weight-reduction booking were modelled; every conv call of
# seeds 0-399 now matches its measured peak to the byte.
# On AVX2 (8-channel blocks) the dense NCHW kernels are modelled too; grouped and most
# channels-last AVX2 kernels keep the reorders-only rule: the bound is the AVX2 kind's
# (kernels.accuracy), exact-to-1% on AVX-512 with or without AMX.
CNN_TRAIN_TOLERANCE = accuracy().trace
GROUPED_TRAIN_TOLERANCE = accuracy().trace_grouped
CNN_PROPERTY = settings(PROPERTY, max_examples=6)


@CNN_PROPERTY
@given(seed=st.integers(0, 10_000), optimizer=st.sampled_from(["sgd", "adamw"]))
def test_random_cnns_training_within_one_percent(seed, optimizer):
    model, inputs = build_cnn(seed)
    assert_close(model, inputs, mode="train", optimizer=optimizer, tolerance=CNN_TRAIN_TOLERANCE)


# Grouped and depthwise convolutions, NCHW or channels-last (kernels.onednn_groups and
# kernels.onednn_nhwc): NCHW depthwise jit_dw / gemm:jit, grouped 4/8/16-blocked
# jit:avx512_core, gemm:jit, jit:avx2 and brgconv_strided, channels-last grouped
# jit:avx512_core and brgconv_strided, and a channels-last first (3-channel) conv.
# Measured (torch 2.13, AVX-512, 2 threads, seeds 0-59 alternating SGD/AdamW): before
# these models 26 of 60 within 1% (18 exact), worst -38.3% / +32.4%; after, 57 exact,
# and the same at 1 and 3 threads (seeds 0-19: 17 of 20 exact). Seeds 60-119: 55 exact,
# 57 within 1%. The 8 of 120 off were channels-last models with a BatchNorm2d: FakeTensor's
# native_batch_norm_backward returned an NCHW grad_input where the CPU kernel returns
# channels-last (now `kernels.layout.cpu_layout`), and the BatchNorm-backward scratch
# rule had been measured on NCHW only (channels-last: 4 B per channel with a plain
# gradient). Seeds 0-119 now: 120 exact.


@CNN_PROPERTY
@given(seed=st.integers(0, 10_000), optimizer=st.sampled_from(["sgd", "adamw"]))
def test_random_grouped_cnns_training_within_one_percent(seed, optimizer):
    model, inputs = build_grouped_cnn(seed)
    assert_close(
        model, inputs, mode="train", optimizer=optimizer, tolerance=GROUPED_TRAIN_TOLERANCE
    )


@contextlib.contextmanager
def num_threads(count):
    saved = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


# Seeds whose peak sits in a convolution backward whose scratchpad grows with the thread
# count: 2 (strided backward-data), 3 (backward-weights reductions over the minibatch).
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("seed", [2, 3])
def test_cnn_training_follows_the_thread_count(seed, threads):
    model, inputs = build_cnn(seed)
    with num_threads(threads):
        assert_close(model, inputs, mode="train", optimizer="sgd", tolerance=CNN_TRAIN_TOLERANCE)


@pytest.mark.parametrize("set_to_none", [True, False])
def test_gradients_kept_between_steps_are_counted(set_to_none):
    model, inputs = build_mlp(3)
    estimate, _ = assert_close(model, inputs, optimizer="sgd", set_to_none=set_to_none)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert estimate.weights == param_bytes
    assert estimate.optimizer == 0
    if not set_to_none:
        assert estimate.gradients == param_bytes


def test_adamw_state_is_counted_as_optimizer():
    model = nn.Linear(128, 64)
    estimate, _ = assert_close(model, torch.randn(8, 128), optimizer="adamw")
    param_bytes = 4 * (128 * 64 + 64)
    # exp_avg and exp_avg_sq per parameter, plus a 0-dim step tensor each.
    assert estimate.optimizer == 2 * param_bytes + 2 * 4


def test_optimizer_factory_and_instance():
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    inputs = torch.randn(4, 32)
    assert_close(model, inputs, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))
    optimizer = torch.optim.Adam(model.parameters())
    model(inputs).sum().backward()
    optimizer.step()  # real state exists: it is copied, never stepped
    estimate, _ = assert_close(model, inputs, optimizer=optimizer)
    assert estimate.optimizer >= 2 * 4 * sum(p.numel() for p in model.parameters())


# Under CPU autocast, oneDNN's bfloat16 kernels allocate scratch. Measured (autocast around
# forward and loss, AdamW, 2 layers, seq 32, batch 2), on an AVX-512 CPU without AMX,
# where no rule models it: Llama +0.00%, GPT-2 -4.01%, BERT -2.24%, ViT -2.83%; Llama's
# peak is not at a bf16 kernel, so it holds to 1%, the others to the bound below (the worst
# case rounded up). On a Xeon with AMX-BF16 (torch 2.13, 2 threads) the scratch is larger
# (ViT -21.03%, GPT-2 -1.54%, BERT -1.15% without rules) and modelled: the weight-gradient
# GEMMs (kernels.onednn_matmul) and the patch embedding's backward-weights
# (kernels.onednn_amx_conv) make all four exact, so they hold to 1% there.
# On AVX2 (ONEDNN_MAX_CPU_ISA=AVX2 on that AVX-512 CPU) the same four hold to these bounds.
AUTOCAST_TOLERANCE = (
    dict.fromkeys(("llama", "gpt2", "bert", "vit"), TOLERANCE)
    if this_cpu().kind is CpuKind.AVX512_AMX
    else {"llama": TOLERANCE, **dict.fromkeys(("gpt2", "bert", "vit"), accuracy().trace_autocast)}
)


@pytest.mark.parametrize("family", sorted(AUTOCAST_TOLERANCE))
def test_autocast_bfloat16_against_the_real_autocast_step(family):
    model, inputs = build_transformer(
        family,
        "sdpa",
        layers=2,
        heads=4,
        head_dim=16,
        kv_heads=2,
        seq=32,
        batch=2,
        vocab=100,
        dropout=0.0,
    )
    work = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(work.parameters())

    def step(model_, optimizer_, inputs_):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model_(**inputs_).loss
        loss.backward()
        optimizer_.step()
        optimizer_.zero_grad()

    step(work, optimizer, inputs)  # warm-up: optimizer state
    measured = measure_peak(
        step, work, optimizer, inputs, track=(work, optimizer, inputs), device="cpu"
    ).peak
    tolerance = AUTOCAST_TOLERANCE[family]
    # trace() scopes autocast the same way: forward and loss only.
    estimate = trace(model, inputs, optimizer="adamw", autocast_dtype=torch.bfloat16)
    assert abs(relative_error(estimate.total, measured)) <= tolerance
    assert any("autocast" in note for note in estimate.notes)
    if family == "llama":  # the general form, on the user's own step
        fresh = copy.deepcopy(model)
        traced = trace_step(step, fresh, torch.optim.AdamW(fresh.parameters()), inputs)
        assert abs(relative_error(traced.estimate.total, measured)) <= tolerance


def test_trace_step_on_a_hand_written_step():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(32, 64), torch.randint(0, 8, (32,))

    def step(model_, optimizer_, x_, y_):
        loss = nn.functional.cross_entropy(model_(x_), y_)
        loss.backward()
        optimizer_.step()
        optimizer_.zero_grad(set_to_none=True)

    work_model, work_opt = copy.deepcopy((model, optimizer))
    step(work_model, work_opt, x, y)
    measured = measure_peak(
        step, work_model, work_opt, x, y, track=(work_model, work_opt, x, y), device="cpu"
    )
    result = trace_step(step, model, optimizer, x, y)
    assert abs(relative_error(result.estimate.total, measured.peak)) <= TOLERANCE
    assert result.estimate.optimizer == 4 * sum(p.numel() for p in model.parameters())
    assert optimizer.state == {}  # the user's optimizer never stepped


@pytest.mark.parametrize("scaler_made_in_the_step", [True, False])
def test_trace_step_of_the_amp_loop_with_a_grad_scaler(scaler_made_in_the_step):
    """PyTorch's AMP recipe: autocast forward, scaled backward, scaler.step, update."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 8))
    optimizer = torch.optim.AdamW(model.parameters())
    x, y = torch.randn(32, 64), torch.randint(0, 8, (32,))
    scaler = torch.amp.GradScaler("cpu")  # the loop's own, made once outside the loop

    def step(model_, optimizer_, scaler_, x_, y_):
        if scaler_made_in_the_step:
            scaler_ = torch.amp.GradScaler("cpu")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model_(x_), y_)
        scaler_.scale(loss).backward()
        scaler_.step(optimizer_)
        scaler_.update()
        optimizer_.zero_grad(set_to_none=True)

    work = copy.deepcopy((model, optimizer, scaler))
    step(*work, x, y)
    measured = measure_peak(step, *work, x, y, track=(*work, x, y), device="cpu")
    result = trace_step(step, model, optimizer, scaler, x, y)
    assert abs(relative_error(result.estimate.total, measured.peak)) <= TOLERANCE
    states = 2 * 4 * sum(p.numel() for p in model.parameters())  # AdamW: exp_avg, exp_avg_sq
    assert states <= result.estimate.optimizer <= states + 4 * 4  # + one step count each
    assert any("GradScaler" in note for note in result.estimate.notes)
    assert optimizer.state == {}
    assert scaler._scale is None  # the user's scaler was copied, never used
    assert torch.amp.GradScaler._maybe_opt_step.__qualname__.startswith("GradScaler")


# -- the user's objects are untouched ------------------------------------------------------
def snapshot(model, optimizer):
    tensors = {f"p.{k}": v.detach().clone() for k, v in model.state_dict().items()}
    tensors |= {f"g.{k}": p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    for i, state in enumerate(optimizer.state.values()):
        tensors |= {
            f"o.{i}.{k}": v.clone() for k, v in state.items() if isinstance(v, torch.Tensor)
        }
    return tensors


@pytest.mark.parametrize("optimizer_kind", ["instance", "adamw"])
def test_model_and_optimizer_bitwise_unchanged(optimizer_kind):
    model = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    inputs = torch.randn(8, 16)
    model(inputs).sum().backward()
    optimizer.step()
    model(inputs).square().sum().backward()  # gradients present, BN stats moved
    model.eval()
    before = snapshot(model, optimizer)
    rng = torch.get_rng_state()
    trace(
        model,
        inputs,
        optimizer=optimizer if optimizer_kind == "instance" else "adamw",
        set_to_none=True,
    )
    after = snapshot(model, optimizer)
    assert before.keys() == after.keys()
    for key, value in before.items():
        assert torch.equal(
            value.reshape(-1).view(torch.uint8), after[key].reshape(-1).view(torch.uint8)
        ), key
    assert not model.training
    assert torch.equal(rng, torch.get_rng_state())
    assert all(p.grad is not None for p in model.parameters())


def test_real_memory_of_the_trace_does_not_grow_with_batch():
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    small = measure_peak(trace, model, torch.randn(2, 64), device="cpu")
    large = measure_peak(trace, model, torch.randn(4096, 64), device="cpu")
    # The large batch's step needs ~13 MiB; the trace itself allocates a few KiB either way.
    assert large.value.activations > 100 * small.value.activations
    assert large.increment <= small.increment + 1024
    assert large.increment < 64 * 1024


def test_meta_model_traces_like_the_real_one():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64)
    ids = torch.randint(0, 128, (2, 32))
    real = transformers.GPT2LMHeadModel(config)
    with torch.device("meta"):
        meta = transformers.GPT2LMHeadModel(config)
    meta_ids = ids.to("meta")
    real_estimate = trace(real, {"input_ids": ids, "labels": ids})
    meta_estimate = trace(meta, {"input_ids": meta_ids, "labels": meta_ids})
    assert meta_estimate.total == real_estimate.total
    assert meta_estimate.weights == real_estimate.weights > 0


# -- errors -----------------------------------------------------------------------------
class Nonzero(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        return self.linear(x)[torch.nonzero(x[:, 0] > 0).squeeze(1)]


class ItemBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        y = self.linear(x)
        return y * 2 if y.sum() > 0 else y


_LIBRARY = torch.library.Library("torchfit_test_trace", "DEF")  # kept alive for the module
_LIBRARY.define("double(Tensor x) -> Tensor")
_LIBRARY.impl("double", lambda x: x * 2, "CPU")


class CustomKernel(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        return torch.ops.torchfit_test_trace.double(self.linear(x))


@pytest.mark.parametrize(
    ("model", "op"),
    [
        (Nonzero(), "aten.nonzero"),
        (ItemBranch(), "aten._local_scalar_dense"),
        (CustomKernel(), "torchfit_test_trace.double.*register_fake"),
    ],
)
def test_untraceable_ops_name_the_op_and_point_to_estimate(model, op):
    with pytest.raises(RuntimeError, match=rf"{op}.*torchfit\.memory\.estimate"):
        trace(model, torch.randn(3, 4))


GLOBAL_COUNTER = torch.zeros(3)


class UsesAGlobal(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 3)

    def forward(self, x):
        GLOBAL_COUNTER.add_(1)
        return self.linear(x) * GLOBAL_COUNTER


def test_a_real_tensor_outside_the_model_is_refused_not_written():
    with pytest.raises(RuntimeError, match=r"aten\.add_.*register it as a module buffer"):
        trace(UsesAGlobal(), torch.randn(2, 3))
    assert torch.equal(GLOBAL_COUNTER, torch.zeros(3))


def test_bad_options_fail_with_the_choices():
    with pytest.raises(ValueError, match="'cpu' or 'cuda'"):
        trace(nn.Linear(2, 2), torch.randn(1, 2), device="tpu")
    with pytest.raises(ValueError, match="mode"):
        trace(nn.Linear(2, 2), torch.randn(1, 2), mode="fly")
    with pytest.raises(ValueError, match="warmup"):
        trace_step(lambda: None, warmup=-1)


@pytest.mark.parametrize("family", ["vit", "convnext"])
def test_models_with_benign_data_checks_trace(family):
    """transformers' ViT and ConvNeXt check values in their forward: still traceable.

    A check on data under fake tensors raises DataDependentOutputException; these ones
    are benign and the trace must get through them.
    """
    transformers = pytest.importorskip("transformers")
    if family == "vit":
        model, inputs = build_transformer(
            "vit",
            "eager",
            layers=1,
            heads=2,
            head_dim=8,
            kv_heads=2,
            seq=4,
            batch=2,
            vocab=1,
            dropout=0.0,
        )
    else:
        config = transformers.ConvNextConfig(
            hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, num_labels=3
        )
        model = transformers.ConvNextForImageClassification(config)
        inputs = {"pixel_values": torch.randn(2, 3, 32, 32), "labels": torch.tensor([0, 2])}
    assert trace(model, inputs).total > 0


# -- the event list, the breakdown, the CUDA target ---------------------------------------
def test_events_replay_to_the_peak_and_categories_add_up():
    model, inputs = build_mlp(7)
    result = trace_events(model, inputs, optimizer="adamw")
    live = peak = 0
    sizes = {}
    for event in result.events:
        if event[0] == "alloc":
            sizes[event[1]] = event[2]
            live += event[2]
        else:
            live -= sizes.pop(event[1])
        peak = max(peak, live)
    assert peak == result.peak == result.estimate.total
    assert {s.id for s in result.storages} >= set(sizes)
    assert result.estimate.activations > 0
    assert result.estimate.layers  # modules holding activations at the peak
    assert result.estimate.peak_at
    assert "MemoryEstimate" in str(result)
    assert result.to_dict()["peak"] == result.peak


def test_cuda_target_rounds_to_blocks_and_reports_the_rounding():
    model, inputs = build_mlp(11)
    cpu = trace_events(model, inputs, optimizer="adamw")
    cuda = trace_events(model, inputs, optimizer="adamw", device="cuda")
    assert all(event[2] % 512 == 0 for event in cuda.events if event[0] == "alloc")
    assert cuda.estimate.overhead > 0
    assert cuda.estimate.device == "cuda"
    assert any("foreach=True" in note for note in cuda.estimate.notes)
    assert cuda.estimate.weights == cpu.estimate.weights


def attention_probability_storages(result, batch, heads, seq):
    """Forward storages the size of fp32 attention scores (B, H, S, S)."""
    scores = batch * heads * seq * seq * 4
    return [s for s in result.storages if s.phase == "forward" and s.raw == scores]


def test_cuda_sdpa_saves_no_quadratic_tensor_while_cpu_dropout_does():
    model, inputs = build_transformer(
        "gpt2",
        "sdpa",
        layers=1,
        heads=2,
        head_dim=8,
        kv_heads=2,
        seq=40,
        batch=2,
        vocab=50,
        dropout=0.1,
    )
    cpu = trace_events(model, inputs, optimizer="sgd")
    cuda = trace_events(model, inputs, optimizer="sgd", device="cuda")
    assert attention_probability_storages(cpu, 2, 2, 40)  # math path: scores, mask, probs
    assert not attention_probability_storages(cuda, 2, 2, 40)
    assert any("flash/memory-efficient" in note for note in cuda.estimate.notes)
    assert cuda.estimate.activations < cpu.estimate.activations


class _Dropped(nn.Module):
    """Linear -> dropout -> Linear; ``manual`` calls CUDA's fused op by hand."""

    def __init__(self, *, manual: bool) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(64, 256), nn.Linear(256, 8)
        self.drop, self.manual = nn.Dropout(0.3), manual

    def forward(self, x):
        h = self.first(x)
        h = torch.native_dropout(h, 0.3, train=True)[0] if self.manual else self.drop(h)
        return self.second(h)


def test_cuda_target_keeps_a_bool_dropout_mask_like_cudas_fused_kernel():
    inputs = torch.randn(32, 64)
    torch.manual_seed(0)
    module = _Dropped(manual=False)
    manual = copy.deepcopy(module)
    manual.manual = True
    cpu = trace_events(module, inputs, optimizer="sgd")
    cuda = trace_events(module, inputs, optimizer="sgd", device="cuda")
    fused = trace_events(manual, inputs, optimizer="sgd", device="cuda")
    # CPU keeps fp32 noise (4 B per element); CUDA's native_dropout a bool mask (1 B)
    masks = [s.raw for s in cuda.storages if s.phase == "forward" and s.raw == 32 * 256]
    assert masks  # a one-byte-per-element tensor the size of the dropout input
    assert not [s for s in cpu.storages if s.phase == "forward" and s.raw == 32 * 256]
    assert cuda.estimate.total == fused.estimate.total
    forward = [sum(s.raw for s in r.storages if s.phase == "forward") for r in (cpu, cuda)]
    assert forward[0] - forward[1] == 3 * 32 * 256  # the noise tensor, 4 B -> 1 B
    assert any("1 dropout call(s)" in note for note in cuda.estimate.notes)


def test_progress_bar_runs(capsys):
    pytest.importorskip("tqdm")
    trace(nn.Linear(8, 8), torch.randn(2, 8), progress=True)
    assert "tracing" in capsys.readouterr().err


def test_cuda_target_takes_the_cards_workspace_and_context():
    model, inputs = build_mlp(3)
    unknown = trace(model, inputs, optimizer="sgd", device="cuda")
    card = trace(model, inputs, optimizer="sgd", device="cuda", gpu="RTX 3060")
    assert any("compute capability (8, 6)" in note for note in card.notes)
    assert any("unknown GPU" in note for note in unknown.notes)
    assert card.workspace < unknown.workspace  # 8 MiB of cuBLAS workspace, not 32
    assert card.total - card.workspace == unknown.total - unknown.workspace


def test_a_cuda_trace_says_how_it_counts_cudnns_convolution_workspaces():
    """Each traced convolution is named; a step without one says nothing about cuDNN."""
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3), torch.nn.Flatten()
    )
    convs = trace(net, torch.randn(2, 3, 16, 16), optimizer="sgd", device="cuda")
    note = [n for n in convs.notes if "cuDNN's workspaces" in n]
    assert len(note) == 1 and note[0].startswith("device=cuda: 2 convolution")
    model, inputs = build_mlp(3)
    plain = trace(model, inputs, optimizer="sgd", device="cuda")
    assert not [n for n in plain.notes if "cuDNN's workspaces" in n]
