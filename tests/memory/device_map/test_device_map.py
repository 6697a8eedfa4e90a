"""torchfit.memory.device_map: multi-GPU inference maps that leave room for the KV cache.

No GPU here: cards are byte budgets (``context_bytes=0`` so that a few MiB decide the
split of a tiny model), maps are checked against the model's real tensor names and
against torchfit's own estimate, and the one load that can run here (every entry on the
CPU) goes through `torchfit.quantize.load_quantized`.
"""

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("transformers", reason="device maps need the [hf] extra")
pytest.importorskip("accelerate", reason="device maps need the [hf] extra")

from accelerate.utils import infer_auto_device_map
from transformers import GPT2Config, LlamaConfig

from torchfit._core.units import parse_dtype
from torchfit.memory import estimate
from torchfit.memory.allocator import cuda_context_bytes
from torchfit.memory.analytic import kv_cache_bytes_for
from torchfit.memory.catalog.build import instantiate, model_class_for
from torchfit.memory.device_map import (
    DeviceMap,
    evaluate_device_map,
    plan_device_map,
)
from torchfit.quantize import quantized_footprint, weights_footprint

MiB = 2**20


def _llama(layers=6, hidden=256, heads=4, kv_heads=2, inter=1024, vocab=1000):
    return LlamaConfig(
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=vocab,
        max_position_embeddings=4096,
        bos_token_id=0,
        eos_token_id=0,
    )


def _gpt2(layers=4, hidden=256, heads=4, vocab=1000):
    return GPT2Config(
        n_layer=layers,
        n_embd=hidden,
        n_head=heads,
        vocab_size=vocab,
        n_positions=4096,
        bos_token_id=0,
        eos_token_id=0,
    )


def _meta(config, dtype=torch.float16):
    return instantiate(config, model_class_for(config), dtype)


def _covering_keys(name, device_map):
    return [k for k in device_map if k in ("", name) or name.startswith(k + ".")]


def _sizes(config, **kwargs):
    """(fixed bytes of a card that runs everything, weights + KV cache) from a one-card plan.

    ``fixed`` is the device total less weights and KV cache: activations, inputs, cuBLAS
    workspace and the allocator's segments and slack.
    """
    one = plan_device_map(config, [1 << 40], context_bytes=0, **kwargs).devices[0]
    return one.device_total - one.weights - one.kv_cache, one.weights + one.kv_cache


def _check_plan(plan: DeviceMap, config, *, batch, seq, bits=None, dtype="fp16"):
    """Every property a planned map must have (used by the property test and others)."""
    meta = _meta(config)
    cards = len(plan.devices)
    # every parameter and buffer, under each of its names, is covered by exactly one key
    names = [n for n, _ in meta.named_parameters(remove_duplicate=False)]
    names += [n for n, _ in meta.named_buffers(remove_duplicate=False)]
    for name in names:
        assert len(_covering_keys(name, plan.device_map)) == 1, name
    assert set(plan.device_map.values()) <= set(range(cards))
    # decoder layers in order: device indices never go down along the layers
    layer_devices = [d for share in plan.devices for d in [share.device] * len(share.layers)]
    order = [k for share in plan.devices for k in share.layers]
    assert sorted(order) == list(range(len(order))) == order
    assert layer_devices == sorted(layer_devices)
    # weights: all placed once, with the bytes torchfit predicts for the load
    if bits is None:
        expected = weights_footprint(config, dtype).total
    else:
        expected = quantized_footprint(
            config, bits=bits, dtype=parse_dtype(dtype).torch_dtype
        ).total
    assert sum(s.weights for s in plan.devices) == expected
    # runtime accounted on each GPU is torchfit's inference estimate, split by layers
    whole = estimate(
        config, batch_size=batch, seq_len=seq, dtype=dtype, mode="inference", device="cuda"
    )
    n_layers = sum(len(s.layers) for s in plan.devices)
    for share in plan.devices:
        assert share.kv_cache * n_layers == whole.kv_cache * len(share.layers)
        assert share.activations <= whole.activations
        assert share.overhead in {0, whole.overhead}
        # within the card, and within what accelerate was allowed
        assert share.fits, share
        assert share.device_total + share.reserve <= share.memory
        placed_kv = share.kv_cache  # no offload: each layer's cache sits with the layer
        assert share.weights + placed_kv <= plan.max_memory[share.device]
    assert sum(s.kv_cache for s in plan.devices) == whole.kv_cache
    assert max(s.activations for s in plan.devices) == whole.activations
    assert plan.fits and not plan.offloaded


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    family=st.sampled_from(["llama", "gpt2"]),
    layers=st.integers(2, 6),
    hidden=st.sampled_from([128, 256]),
    batch=st.integers(1, 4),
    seq=st.sampled_from([256, 1024, 2048]),
    bits=st.sampled_from([None, None, 4, 8]),
    shares=st.lists(st.floats(0.2, 1.3), min_size=1, max_size=4),
)
def test_planned_maps_cover_every_tensor_once_and_fit(
    family, layers, hidden, batch, seq, bits, shares
):
    config = _llama(layers=layers, hidden=hidden) if family == "llama" else _gpt2(layers, hidden)
    kwargs = {"batch_size": batch, "seq_len": seq, "dtype": "fp16", "bits": bits}
    fixed, model = _sizes(config, **kwargs)
    # each card: what any running card needs, plus a share of weights + KV cache
    cards = [fixed + int(share * model) for share in shares]
    try:
        plan = plan_device_map(config, cards, context_bytes=0, **kwargs)
    except ValueError as error:
        refused = str(error)
    else:
        refused = ""
    if refused:
        assert "does not fit" in refused
        # refused only when the cards' shares barely add up to the model: each card may
        # strand up to a layer, GPU 0 keeps one free for accelerate, plus the 5% slack
        assert sum(shares) < 1.1 + (len(shares) + 1) * 1.5 / layers
        return
    _check_plan(plan, config, batch=batch, seq=seq, bits=bits)


def test_layers_spread_over_cards_with_their_kv_cache():
    config = _llama(layers=6)
    fixed, model = _sizes(config, batch_size=4, seq_len=2048, dtype="fp16")
    cards = [fixed + model // 2] * 3
    plan = plan_device_map(config, cards, batch_size=4, seq_len=2048, dtype="fp16", context_bytes=0)
    _check_plan(plan, config, batch=4, seq=2048)
    assert len([s for s in plan.devices if s.layers]) >= 2  # one card holds half the model
    assert plan.device_map["model.layers.0"] == 0
    text = str(plan)
    assert "FITS" in text and "KV cache" in text and "max_memory" in text
    data = plan.to_dict()
    assert data["devices"][0]["kv_cache"] == plan.devices[0].kv_cache
    assert data["fits"] is True


def test_plain_accelerate_overfills_the_first_gpu_and_the_plan_does_not():
    config = _llama(layers=8, hidden=256, kv_heads=4)
    batch, seq = 8, 4096
    fixed, model = _sizes(config, batch_size=batch, seq_len=seq, dtype="fp16")
    card = fixed + int(0.4 * model)
    cards = [card] * 4
    meta = _meta(config)
    plain = infer_auto_device_map(
        meta,
        max_memory=dict.fromkeys(range(4), card),
        no_split_module_classes=["LlamaDecoderLayer"],
    )
    # accelerate counted weights only, which fit one card: GPU 0 got every layer ...
    weights = sum(p.numel() * 2 for p in meta.parameters())
    assert weights < card
    assert set(plain.values()) == {0}
    # ... but the single-GPU inference estimate (weights, KV cache, activations) is beyond it
    whole = estimate(config, batch_size=batch, seq_len=seq, dtype="fp16", mode="inference")
    assert whole.total > card
    judged = evaluate_device_map(
        config, plain, cards, batch_size=batch, seq_len=seq, dtype="fp16", context_bytes=0
    )
    assert not judged.fits
    zero = judged.devices[0]  # its runtime is the single-GPU estimate's, to the byte
    assert zero.allocated - zero.weights == whole.total - whole.weights + zero.workspace
    assert judged.devices[0].device_total > card
    assert "DOES NOT FIT" in str(judged)

    plan = plan_device_map(
        config, cards, batch_size=batch, seq_len=seq, dtype="fp16", context_bytes=0
    )
    _check_plan(plan, config, batch=batch, seq=seq)
    assert all(share.device_total <= card for share in plan.devices)
    assert len(plan.devices[0].layers) < 8


def test_a_catalog_model_on_real_cards_counts_the_cuda_context():
    plan = plan_device_map(
        "llama-2-13b", ["A100 40GB"] * 2, batch_size=8, seq_len=4096, dtype="bf16"
    )
    assert plan.fits
    assert [s.context for s in plan.devices] == [cuda_context_bytes("A100 40GB")] * 2
    assert plan.devices[0].layers[0] == 0 and plan.devices[-1].layers[-1] == 39
    kv = kv_cache_bytes_for("llama-2-13b", batch_size=8, seq_len=4096, dtype="bf16")
    assert sum(s.kv_cache for s in plan.devices) == kv


def test_a_quantized_map_loads_with_load_quantized_on_cpu(tmp_path):
    pytest.importorskip("bitsandbytes", reason="4-bit loading needs bitsandbytes")
    from transformers import LlamaForCausalLM

    from torchfit.quantize import load_quantized

    config = _llama(layers=4, hidden=128, inter=512, vocab=512)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    kwargs = {"bits": 4, "batch_size": 2, "seq_len": 4096, "dtype": "fp32"}
    fixed, model = _sizes(config, **kwargs)
    plan = plan_device_map(tmp_path, [fixed + int(0.85 * model)] * 2, context_bytes=0, **kwargs)
    assert {0, 1} <= set(plan.device_map.values())  # a real split, not {"": 0}
    on_cpu = dict.fromkeys(plan.device_map, "cpu")  # what this machine can run
    kwargs = plan.load_kwargs()
    assert kwargs["dtype"] is torch.float32
    model = load_quantized(str(tmp_path), bits=4, device_map=on_cpu, dtype=kwargs["dtype"])
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    assert type(model.model.layers[0].mlp.up_proj).__name__ == "Linear4bit"
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, 512)


def test_offload_puts_the_overflow_on_the_cpu_and_runs_it_on_gpu_0():
    config = _llama(layers=6)
    kwargs = {"batch_size": 1, "seq_len": 512, "dtype": "fp16"}
    fixed, _ = _sizes(config, **kwargs)
    kv = kv_cache_bytes_for(config, batch_size=1, seq_len=512, dtype="fp16")
    weights = weights_footprint(config, "fp16").total
    card = fixed + kv + weights // 3  # the whole KV cache, a third of the weights
    with pytest.raises(ValueError, match="does not fit 1 x budget"):
        plan_device_map(config, [card], context_bytes=0, **kwargs)
    plan = plan_device_map(config, [card], context_bytes=0, offload=True, **kwargs)
    assert not plan.fits and plan.offloaded
    assert "cpu" in plan.device_map.values()
    (share,) = plan.devices
    assert share.layers == tuple(range(6))  # offloaded layers run on GPU 0 ...
    assert share.kv_cache == kv  # ... with their KV cache
    assert 0 < share.weights < weights
    assert share.fits
    assert "OFFLOADED" in str(plan)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"gpus": ["RTX 9999 Ultra"]},
            r"gpus\[0\]: cannot read 'RTX 9999 Ultra' as a memory budget.*unknown GPU",
        ),
        ({"gpus": []}, r"gpus is empty; list the cards"),
        ({"batch_size": 0}, r"batch_size must be a whole number >= 1; got 0"),
        ({"dtype": "nf4"}, r"dtype='nf4': expected 'auto'.*bits=4"),
        ({"bits": 3}, r"bits=3 is not supported"),
        ({"bits": 4, "offload": True}, r"offload=True with bits=4: transformers refuses"),
        ({"gpus": [16 * MiB]}, r"does not fit 1 x budget: weights .* no module fits .*Add"),
    ],
)
def test_bad_input_is_refused_with_the_value_and_the_fix(kwargs, match):
    args = {"gpus": [80 * MiB] * 2, "seq_len": 1024, "dtype": "fp16", "context_bytes": 0}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        plan_device_map(_llama(), args.pop("gpus"), **args)


def test_a_model_that_does_not_fit_names_the_shortfall():
    with pytest.raises(ValueError, match=r"llama-2-70b .* does not fit 2 x NVIDIA A100 40GB"):
        plan_device_map("llama-2-70b", ["A100 40GB"] * 2, seq_len=4096, dtype="bf16")


def test_runtime_split_matches_the_single_gpu_estimate():
    # The block transient and the logits are taken apart from estimate()'s activations
    # (the larger of the two); on one card they must give back the estimate exactly.
    config = _gpt2(layers=3)
    plan = plan_device_map(
        config, [1 << 30], batch_size=2, seq_len=512, dtype="fp16", context_bytes=0
    )
    whole = estimate(config, batch_size=2, seq_len=512, dtype="fp16", mode="inference")
    (share,) = plan.devices
    assert (share.kv_cache, share.activations, share.overhead) == (
        whole.kv_cache,
        whole.activations,
        whole.overhead,
    )
    assert not any("whole-model figure" in note for note in plan.notes)
    assert math.isclose(share.weights, weights_footprint(config, "fp16").total)
