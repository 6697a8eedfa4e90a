"""torchfit._core.hardware: one native-bf16 rule and one device rule, and every caller uses them.

A GPU is faked at torch's level (capability, emulation answer, properties), so these run
on a CPU; each test asks every caller of a rule and fails if one of them answers apart.
"""

import types

import pytest
import torch

from torchfit._core import hardware
from torchfit.memory.gpus import GPU, current_gpu
from torchfit.precision import Precision, choose_precision
from torchfit.precision.choice import resolve_device
from torchfit.quantize.hf import resolve_compute_dtype, target_device

CAPABILITIES = [(5, 0), (6, 1), (7, 0), (7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)]


def fake_cuda(monkeypatch, capability):
    """A CUDA device of ``capability`` whose torch says bf16 works (emulated below 8.0)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    props = types.SimpleNamespace(
        name="Test Card", total_memory=16 * 2**30, major=capability[0], minor=capability[1]
    )
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    monkeypatch.setattr(torch.version, "hip", None)

    def is_bf16_supported(including_emulation=True):
        # torch >= 2.4: True everywhere with emulation, native from compute capability 8.0
        return including_emulation or capability >= (8, 0)

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)


@pytest.mark.parametrize("capability", CAPABILITIES, ids=lambda c: f"sm_{c[0]}{c[1]}")
def test_every_caller_agrees_on_native_bf16(monkeypatch, capability):
    fake_cuda(monkeypatch, capability)
    native = hardware.native_bf16(capability)
    assert native is (capability >= hardware.BF16_CAPABILITY)
    assert hardware.cuda_native_bf16() is native
    card = GPU.custom("lab card", memory="16GiB", vendor="NVIDIA", compute_capability=capability)
    assert card.bf16 is native
    assert current_gpu().bf16 is native
    assert (choose_precision("auto").precision is Precision.BF16) is native
    compute = resolve_compute_dtype("auto", bits=4, model_dtype=torch.float32, device="cuda")
    assert (compute == torch.bfloat16) is native


def test_torch_saying_emulated_wins_over_the_capability(monkeypatch):
    fake_cuda(monkeypatch, (8, 6))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    assert not hardware.cuda_native_bf16()
    assert choose_precision("auto").precision is Precision.FP16
    compute = resolve_compute_dtype("auto", bits=4, model_dtype=torch.float32, device="cuda")
    assert compute == torch.float16


def test_fp8_rule_is_the_catalog_rule():
    for capability in CAPABILITIES:
        card = GPU.custom("c", memory="8GiB", vendor="NVIDIA", compute_capability=capability)
        assert card.fp8 is hardware.native_fp8(capability)
        assert card.fp8 is (capability >= hardware.FP8_CAPABILITY)


@pytest.mark.parametrize("cuda", [True, False], ids=["cuda", "cpu-only"])
def test_no_device_means_the_same_device_everywhere(monkeypatch, cuda):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    expected = hardware.default_device()
    assert expected.type == ("cuda" if cuda else "cpu")
    assert hardware.parse_device(None) == expected
    assert resolve_device(None) == expected
    assert target_device(None) == expected.type
    assert target_device("auto") == expected.type


def test_a_bad_device_gets_one_message_everywhere():
    from torch.utils.data import TensorDataset

    from torchfit.loaders import tuned_loader_and_report

    with pytest.raises(ValueError, match="device must be") as core:
        hardware.parse_device("gpu0")
    with pytest.raises(ValueError, match="device must be") as precision:
        choose_precision("fp32", device="gpu0")
    data = TensorDataset(torch.arange(4.0))
    with pytest.raises(ValueError, match="device must be") as loaders:
        tuned_loader_and_report(data, batch_size=2, time_budget=0.5, num_workers=0, device="gpu0")
    assert str(precision.value) == str(core.value) == str(loaders.value)
    assert "'gpu0'" in str(core.value)


def test_a_cuda_device_without_cuda_is_refused_for_training_only(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert hardware.parse_device("cuda:1") == torch.device("cuda:1")  # loaders: no pinning
    with pytest.raises(ValueError, match=r"torch\.cuda\.is_available\(\) is False"):
        resolve_device("cuda:1")
