"""Adam's foreach, fused and for-loop implementations: named, built, estimated, measured.

Each implementation holds different temporaries at the optimizer step (torch 2.13,
torch/optim/adam.py; `torchfit.memory.analytic.optimizer_step`). All three run on CPU
(``foreach=True`` one tensor op at a time, ``fused=True`` since torch 2.4), so each
estimate is held to the real CPU step's peak.
"""

import pytest
import torch
from torch import nn

from torchfit._core.optimizers import (
    AdamImplementation,
    OptimizerName,
    make_optimizer,
    optimizer_name_of,
    parse_optimizer,
)
from torchfit.memory import estimate, measure_step, trace
from torchfit.memory.modules.peak import estimate_module

transformers = pytest.importorskip("transformers")

TOLERANCE = 0.06  # tests/memory/analytic/test_loop.py
IMPLEMENTATIONS = ("adamw-foreach", "adamw-for-loop", "adamw-fused")


def _dominant():
    """One Linear of 4.2M weights against 330k others: the step's temporaries decide."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(64, 4096), nn.ReLU(), nn.Linear(4096, 1024), nn.ReLU(), nn.Linear(1024, 8)
    )


def _llama():
    config = transformers.LlamaConfig(
        hidden_size=512,
        intermediate_size=1024,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    ids = torch.randint(0, 256, (1, 16))
    return config, transformers.LlamaForCausalLM(config), {"input_ids": ids, "labels": ids}


def _close(predicted, real):
    error = (predicted - real) / real
    assert abs(error) <= TOLERANCE, f"{error:+.1%}: estimated {predicted:,} vs measured {real:,}"


@pytest.mark.parametrize(
    ("spelling", "name", "implementation"),
    [
        ("adamw-foreach", OptimizerName.ADAMW, AdamImplementation.FOREACH),
        ("AdamW-Fused", OptimizerName.ADAMW, AdamImplementation.FUSED),
        ("adamw_for_loop", OptimizerName.ADAMW, AdamImplementation.FOR_LOOP),
        ("adamw-forloop", OptimizerName.ADAMW, AdamImplementation.FOR_LOOP),
        ("adam-fused", OptimizerName.ADAM, AdamImplementation.FUSED),
        ("adam-for-loop", OptimizerName.ADAM, AdamImplementation.FOR_LOOP),
        ("adam_foreach", OptimizerName.ADAM, AdamImplementation.FOREACH),
        ("adamw_torch", OptimizerName.ADAMW, AdamImplementation.DEFAULT),
        ("adamw_torch_fused", OptimizerName.ADAMW, AdamImplementation.FUSED),
        ("adamw", OptimizerName.ADAMW, AdamImplementation.DEFAULT),
    ],
)
def test_the_spellings_parse_and_build_that_implementation(spelling, name, implementation):
    parsed = parse_optimizer(spelling)
    assert (parsed.base, parsed.implementation) == (name, implementation)
    built = make_optimizer(spelling, [nn.Parameter(torch.zeros(3))])
    assert optimizer_name_of(built) is parsed
    assert type(built) is (torch.optim.AdamW if name is OptimizerName.ADAMW else torch.optim.Adam)


def test_the_default_is_foreach_on_cuda_and_the_for_loop_on_cpu():
    assert AdamImplementation.DEFAULT.on("cuda") is AdamImplementation.FOREACH
    assert AdamImplementation.DEFAULT.on("cpu") is AdamImplementation.FOR_LOOP
    assert OptimizerName.ADAMW_8BIT.base is OptimizerName.ADAMW_8BIT
    assert not OptimizerName.ADAMW_8BIT.is_torch_adam


@pytest.mark.parametrize("bad", ["adamw-fast", "adamw-fused-8bit", "adam-multi"])
def test_a_bad_spelling_names_the_valid_ones(bad):
    with pytest.raises(ValueError, match=rf"unsupported optimizer '{bad}'.*'adamw-for-loop'"):
        parse_optimizer(bad)


def test_built_optimizers_are_named_from_their_flags():
    p = [nn.Parameter(torch.zeros(3))]
    assert optimizer_name_of(torch.optim.AdamW(p, fused=True)) is OptimizerName.ADAMW_FUSED
    assert optimizer_name_of(torch.optim.Adam(p, foreach=True)) is OptimizerName.ADAM_FOREACH
    assert optimizer_name_of(torch.optim.AdamW(p, differentiable=True)).implementation is (
        AdamImplementation.FOR_LOOP
    )
    assert optimizer_name_of(torch.optim.AdamW(p)) is OptimizerName.ADAMW
    groups = [{"params": p}, {"params": [nn.Parameter(torch.zeros(2))], "foreach": False}]
    with pytest.raises(ValueError, match="different implementations"):
        optimizer_name_of(torch.optim.AdamW(groups, foreach=True))
    with pytest.raises(TypeError, match=r"no closed form for torch\.optim\.rmsprop\.RMSprop"):
        parse_optimizer(torch.optim.RMSprop(p))


def test_one_dominant_parameter_orders_the_peaks_as_measured():
    # for-loop: the dominant weight twice; foreach: every parameter once; fused: nothing
    model, inputs = _dominant(), torch.randn(4, 64)
    found, real = {}, {}
    for name in IMPLEMENTATIONS:
        found[name] = estimate(
            model, batch_size=4, input_shape=(64,), optimizer=name, device="cpu"
        ).total
        real[name] = measure_step(model, inputs, optimizer=name, device="cpu").peak
        _close(found[name], real[name])
    order = sorted(IMPLEMENTATIONS, key=real.__getitem__)
    assert order == ["adamw-fused", "adamw-foreach", "adamw-for-loop"]
    assert sorted(IMPLEMENTATIONS, key=found.__getitem__) == order
    # the CPU default is the for-loop; a built optimizer's trace follows its flags
    default = estimate(model, batch_size=4, input_shape=(64,), optimizer="adamw", device="cpu")
    assert default.total == found["adamw-for-loop"]
    fused = torch.optim.AdamW(model.parameters(), fused=True)
    _close(trace(model, inputs, optimizer=fused, device="cpu").total, real["adamw-fused"])
    assert (
        estimate_module(model, batch_size=4, input_shape=(64,), optimizer=fused, device="cpu").total
        == (found["adamw-fused"])
    )


@pytest.mark.parametrize("name", IMPLEMENTATIONS)
def test_the_closed_form_and_the_trace_of_each_implementation_match_the_real_step(name):
    config, model, inputs = _llama()
    real = measure_step(model, inputs, optimizer=name, device="cpu").peak
    _close(estimate(config, batch_size=1, seq_len=16, optimizer=name, device="cpu").total, real)
    _close(trace(model, inputs, optimizer=name, device="cpu").total, real)


def test_the_implementations_differ_in_the_closed_form_on_cuda():
    config, _, _ = _llama()
    peaks = {
        name: estimate(config, batch_size=1, seq_len=16, optimizer=name, device="cuda").total
        for name in ("adamw", *IMPLEMENTATIONS)
    }
    assert peaks["adamw"] == peaks["adamw-foreach"]  # CUDA's default
    assert peaks["adamw-fused"] < peaks["adamw-for-loop"] < peaks["adamw-foreach"]
