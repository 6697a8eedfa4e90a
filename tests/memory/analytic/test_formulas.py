import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchfit.memory import measure_peak
from torchfit.memory.analytic.formulas import attention_bytes, kv_cache_bytes
from torchfit.memory.analytic.model_states import model_state_bytes, optimizer_state_bytes


@given(
    st.integers(1, 8),
    st.integers(1, 4096),
    st.integers(1, 80),
    st.integers(1, 64),
    st.sampled_from([64, 128]),
    st.sampled_from(["fp16", "bf16", "fp32", "fp8", "int8"]),
)
@settings(max_examples=200, deadline=None)
def test_kv_cache_is_the_product(batch, seq, layers, kv_heads, head_dim, dtype):
    elem = {"fp16": 2, "bf16": 2, "fp32": 4, "fp8": 1, "int8": 1}[dtype]
    got = kv_cache_bytes(
        batch_size=batch,
        seq_len=seq,
        num_layers=layers,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        dtype=dtype,
    )
    assert got == 2 * layers * batch * seq * kv_heads * head_dim * elem


def test_kv_cache_sliding_window_caps_positions():
    full = kv_cache_bytes(batch_size=1, seq_len=4096, num_layers=2, num_kv_heads=8, head_dim=128)
    windowed = kv_cache_bytes(
        batch_size=1,
        seq_len=32768,
        num_layers=2,
        num_kv_heads=8,
        head_dim=128,
        sliding_window=4096,
    )
    assert windowed == full


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_kv_cache_rejects_bad_sizes(bad):
    with pytest.raises((ValueError, TypeError), match="seq_len must be a whole number >= 1"):
        kv_cache_bytes(batch_size=1, seq_len=bad, num_layers=1, num_kv_heads=1, head_dim=1)


def test_kv_cache_matches_a_real_generate_cache():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=300,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(3, 300, (2, 11))
    out = model.generate(
        ids,
        max_new_tokens=7,
        min_new_tokens=7,
        do_sample=False,
        return_dict_in_generate=True,
        pad_token_id=0,
    )
    cache = out.past_key_values
    real = sum(
        t.untyped_storage().nbytes() for layer in cache.layers for t in (layer.keys, layer.values)
    )
    # the cache holds every position but the last generated token's
    expected = kv_cache_bytes(
        batch_size=2,
        seq_len=11 + 7 - 1,
        num_layers=3,
        num_kv_heads=2,
        head_dim=16,
        dtype="fp32",
    )
    assert real == expected
    from torchfit.memory.analytic.formulas import kv_cache_bytes_for

    assert kv_cache_bytes_for(config, batch_size=2, seq_len=17, dtype="fp32") == real


def test_kv_cache_for_configs_reads_gqa_and_window():
    from torchfit.memory.analytic.formulas import kv_cache_bytes_for

    transformers = pytest.importorskip("transformers")
    mistral = transformers.MistralConfig(sliding_window=4096)
    # 32 layers x 8 KV heads x 128 x 2 bytes x 2 (K and V), capped at the 4096 window
    assert kv_cache_bytes_for(mistral, batch_size=1, seq_len=32768, dtype="bf16") == 2**29
    assert kv_cache_bytes_for("llama-2-7b", batch_size=1, seq_len=4096) == 2 * 2**30


@given(
    st.integers(1, 4),
    st.integers(2, 64),
    st.integers(1, 4),
    st.sampled_from([8, 16]),
)
@settings(max_examples=25, deadline=None)
def test_eager_attention_saved_bytes_match_autograd(batch, seq, heads, head_dim):
    # the attention core of a real eager implementation, as transformers writes it
    q = torch.randn(batch, heads, seq, head_dim, requires_grad=True)
    k = torch.randn(batch, heads, seq, head_dim, requires_grad=True)
    v = torch.randn(batch, heads, seq, head_dim, requires_grad=True)
    saved = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in {
            x.untyped_storage().data_ptr() for x in (q, k, v)
        }:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(head_dim)
        probs = torch.softmax(scores, dim=-1)
        torch.matmul(probs, v)
    predicted = attention_bytes(
        batch_size=batch,
        seq_len=seq,
        num_heads=heads,
        head_dim=head_dim,
        dtype="fp32",
        implementation="eager",
        device="cpu",
    )
    # the formula also counts Q, K^T and V as the matmuls keep them (here: the leaves)
    qkv = 3 * batch * heads * seq * head_dim * 4
    assert sum(saved.values()) + qkv == predicted


@given(st.integers(1, 3), st.integers(256, 384), st.sampled_from([2, 4]), st.sampled_from([8, 16]))
@settings(max_examples=15, deadline=None)
def test_flash_sdpa_on_cpu_keeps_no_square_term(batch, seq, heads, head_dim):
    q, k, v = (torch.randn(batch, heads, seq, head_dim, requires_grad=True) for _ in range(3))

    def step():
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.sum().backward()

    torch.manual_seed(0)
    measured = measure_peak(step, device="cpu")
    flash = attention_bytes(
        batch_size=batch,
        seq_len=seq,
        num_heads=heads,
        head_dim=head_dim,
        dtype="fp32",
        implementation="sdpa",
        device="cpu",
    )
    eager = attention_bytes(
        batch_size=batch,
        seq_len=seq,
        num_heads=heads,
        head_dim=head_dim,
        dtype="fp32",
        implementation="eager",
        device="cpu",
    )
    square = batch * heads * seq * seq * 4
    q_bytes = batch * heads * seq * head_dim * 4
    lse = batch * heads * seq * 4
    # eager keeps Q, K^T, V and the probabilities; flash Q, K, V, the output and the lse
    assert eager - flash == square - q_bytes - lse
    # no b*a*s^2 tensor ever exists when SDPA picks the flash kernel: the whole step stays
    # below one s^2 matrix (the math path would hold scores and probabilities, 2 of them)
    assert measured.increment < square


def test_attention_dropout_sdpa_falls_back_on_cpu_only():
    kw = dict(
        batch_size=2,
        seq_len=256,
        num_heads=4,
        head_dim=32,
        dtype="bf16",
        implementation="sdpa",
        training=True,
        dropout=0.1,
    )
    cpu = attention_bytes(**kw, device="cpu")
    cuda = attention_bytes(**kw, device="cuda")
    square = 2 * 4 * 256 * 256
    assert cpu - cuda > 4 * square  # probabilities, mask and dropped probabilities
    assert attention_bytes(**{**kw, "dropout": 0.0}, device="cpu") == cuda


@pytest.mark.parametrize(
    ("dtype", "kv_heads", "square"),
    [
        ("fp32", 2, True),  # flash takes 16 bits only, memory-efficient no grouped heads: math
        ("fp32", 8, False),  # memory-efficient
        ("bf16", 2, False),  # flash takes grouped heads
    ],
)
def test_cuda_sdpa_in_fp32_with_grouped_heads_takes_the_math_path(dtype, kv_heads, square):
    kw = dict(batch_size=1, seq_len=512, num_heads=8, head_dim=32, training=True, device="cuda")
    found = attention_bytes(dtype=dtype, num_kv_heads=kv_heads, **kw)
    probabilities = 8 * 512 * 512 * 4
    assert (found > probabilities) is square
    cpu = attention_bytes(dtype=dtype, num_kv_heads=kv_heads, **{**kw, "device": "cpu"})
    assert cpu < probabilities  # the CPU flash kernel takes grouped heads in any dtype


def test_attention_rejects_bad_input():
    with pytest.raises(ValueError, match="'eager', 'sdpa' or 'flash'"):
        attention_bytes(batch_size=1, seq_len=1, num_heads=1, head_dim=1, implementation="xla")
    with pytest.raises(ValueError, match="dropout"):
        attention_bytes(batch_size=1, seq_len=1, num_heads=1, head_dim=1, dropout=1.5)


@pytest.mark.parametrize(
    ("optimizer", "dtype", "mixed", "per_param"),
    [
        ("adamw", "fp32", False, 16),  # 4 weights + 4 grads + 8 moments
        ("adam", "fp32", False, 16),
        ("sgd", "fp32", False, 8),
        ("sgd-momentum", "fp32", False, 12),
        ("adamw", "bf16", True, 16),  # fp32 master + fp32 grads + 8 (autocast copies apart)
        ("adamw", "bf16", False, 8),  # pure bf16: 2 + 2 + 4
        ("sgd", "fp16", False, 4),
    ],
)
def test_model_state_bytes_per_parameter(optimizer, dtype, mixed, per_param):
    states = model_state_bytes(params=1000, dtype=dtype, mixed_precision=mixed, optimizer=optimizer)
    assert states.weights + states.gradients + states.optimizer == per_param * 1000


def test_frozen_parameters_get_no_gradient_or_state():
    states = model_state_bytes(params=10**6, trainable=10**4, optimizer="adamw")
    assert states.weights == 4 * 10**6
    assert states.gradients == 4 * 10**4
    assert states.optimizer == 8 * 10**4
    with pytest.raises(ValueError, match="trainable must be between"):
        model_state_bytes(params=10, trainable=11)


def test_eight_bit_adam_is_about_two_bytes_per_parameter():
    state = optimizer_state_bytes("adamw-8bit", trainable=10**8, param_dtype=torch_dtype_fp32())
    assert 2.0 <= state / 10**8 < 2.05


def torch_dtype_fp32():
    from torchfit._core.units import DType

    return DType.FP32


@pytest.mark.parametrize(
    ("optimizer", "factory"),
    [
        ("adamw", lambda ps: torch.optim.AdamW(ps)),
        ("sgd-momentum", lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)),
        ("sgd", lambda ps: torch.optim.SGD(ps, lr=0.1)),
    ],
)
def test_optimizer_state_matches_torch(optimizer, factory):
    model = torch.nn.Sequential(torch.nn.Linear(33, 17), torch.nn.Linear(17, 5))
    opt = factory(model.parameters())
    model(torch.randn(2, 33)).sum().backward()
    opt.step()
    real = sum(
        t.untyped_storage().nbytes()
        for state in opt.state.values()
        for t in state.values()
        if isinstance(t, torch.Tensor)
    )
    params = sum(p.numel() for p in model.parameters())
    from torchfit._core.units import DType

    predicted = optimizer_state_bytes(
        optimizer, trainable=params, param_dtype=DType.FP32, num_tensors=4
    )
    assert predicted == real


def test_quantized_dtype_is_not_a_compute_dtype():
    with pytest.raises(ValueError, match="weight format"):
        model_state_bytes(params=10, dtype="nf4")
