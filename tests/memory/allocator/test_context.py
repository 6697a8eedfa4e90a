"""The CUDA context: by CUDA version and module loading, given by the user, or measured."""

import pytest

from torchfit.memory import MemoryEstimate, to_device
from torchfit.memory.allocator import cuda_context_bytes, measure_cuda_context
from torchfit.memory.allocator.context import (
    CONTEXT_FIXED_BYTES,
    CONTEXT_PER_THREAD_SLOT,
    DEFAULT_CUDA_CONTEXT_BYTES,
    EAGER_LIBRARY_BYTES,
    LAZY_FIRST_USE_BYTES,
    UNKNOWN_CARD_BARE_BYTES,
    bare_context_bytes,
    parse_cuda_version,
)
from torchfit.memory.gpus import GPU

MiB = 2**20
LAZY_LIBRARIES = sum(LAZY_FIRST_USE_BYTES.values())

# Contexts measured on an NVIDIA H200 (132 SMs, driver 580.159, torch 2.11.0+cu130, lazy
# loading) by benchmarks/gpu_check.py: after the first matmul and a convolution, and with
# CUDA_MODULE_LOADING=EAGER after a matmul.
H200_LAZY = 736_952_320
H200_EAGER = 2_896_560_128


@pytest.fixture(autouse=True)
def _no_override(monkeypatch):
    monkeypatch.delenv("TORCHFIT_CUDA_CONTEXT_BYTES", raising=False)


def test_the_h200_context_is_modelled_within_a_percent():
    assert cuda_context_bytes("H200", cuda_version="13.0") == pytest.approx(H200_LAZY, rel=0.01)
    eager = cuda_context_bytes("H200", cuda_version="13.0", lazy_loading=False)
    assert eager == pytest.approx(H200_EAGER, rel=0.01)


# Bare contexts published for cards (no kernel loaded): the fit they come from must hold.
@pytest.mark.parametrize(
    ("sms", "capability", "mib"),
    [
        (34, (8, 9), 107),  # RTX 4060 Ti, llama.cpp PR 23604
        (82, (8, 6), 256),  # RTX 3090, InvokeAI issue 9413
        (142, (8, 9), 426),  # RTX 6000 Ada, unsloth-zoo PR 1053
        (170, (12, 0), 506),  # RTX 5090, llama.cpp issue 20582
        (80, (7, 0), 319),  # Titan V, pytorch issue 28394
    ],
)
def test_the_bare_context_grows_with_the_thread_slots_not_the_memory(sms, capability, mib):
    card = GPU.custom("card", memory="24GiB", compute_capability=capability, sm_count=sms)
    assert bare_context_bytes(card) == pytest.approx(mib * MiB, abs=8 * MiB)


def test_the_bare_context_is_the_fixed_part_plus_a_reservation_per_thread_slot():
    card = GPU.custom("card", memory="8GiB", compute_capability=(9, 0), sm_count=10)
    assert bare_context_bytes(card) == CONTEXT_FIXED_BYTES + CONTEXT_PER_THREAD_SLOT * 10 * 2048
    more = GPU.custom("card", memory="8GiB", compute_capability=(9, 0), sm_count=20)
    assert cuda_context_bytes(more) - cuda_context_bytes(card) == CONTEXT_PER_THREAD_SLOT * 20480


def test_a_card_without_an_sm_count_falls_back_and_says_so():
    card = GPU.custom("lab card", memory="24GiB", compute_capability=(8, 6))
    assert bare_context_bytes(card) == bare_context_bytes(None) == UNKNOWN_CARD_BARE_BYTES
    assert (
        cuda_context_bytes()
        == DEFAULT_CUDA_CONTEXT_BYTES
        == UNKNOWN_CARD_BARE_BYTES + LAZY_LIBRARIES
    )
    note = next(n for n in to_device(MemoryEstimate(weights=MiB), gpu=card).notes if "context" in n)
    assert "SM count unknown" in note


def test_the_context_follows_the_cuda_stack():
    lazy = cuda_context_bytes("A100 40GB", cuda_version="12.4")
    bare = bare_context_bytes("A100 40GB")
    assert lazy == bare + LAZY_LIBRARIES
    assert cuda_context_bytes("A100 40GB", cuda_version="12.4", lazy_loading=False) == (
        bare + EAGER_LIBRARY_BYTES[12]
    )
    # no lazy loading before CUDA 11.7: every kernel of every library is resident
    assert cuda_context_bytes("A100 40GB", cuda_version="11.2") == bare + EAGER_LIBRARY_BYTES[11]
    assert cuda_context_bytes("A100 40GB", cuda_version=(10, 2)) == bare + EAGER_LIBRARY_BYTES[10]
    # Hugging Face's V100 / CUDA 11.2 figure: 1343 MiB in nvidia-smi with one tiny tensor
    v100 = cuda_context_bytes("V100 16GB", cuda_version="11.2")
    assert v100 == pytest.approx(1341 * MiB, rel=0.2)


def test_to_device_takes_the_version_and_the_measured_figure():
    base = MemoryEstimate(weights=100 * MiB)
    old = to_device(base, gpu="V100 16GB", cuda_version="11.2")
    new = to_device(base, gpu="V100 16GB")
    assert old.device_total - new.device_total == EAGER_LIBRARY_BYTES[11] - LAZY_LIBRARIES
    assert any("CUDA 11.2" in note for note in old.notes)
    card = next(n for n in new.notes if "CUDA context" in n)
    assert "80 SMs" in card
    assert "CUDA 13.0 assumed" in card
    given = to_device(base, gpu="V100 16GB", context_bytes="500MiB", cuda_version="11.2")
    assert given.context == 500 * MiB  # a measured figure wins


def test_an_sm_count_must_be_a_positive_whole_number():
    for bad in (0, -4, 2.5, True):
        with pytest.raises((ValueError, TypeError), match=rf"sm_count must be .*{bad!r}"):
            GPU.custom("card", memory="8GiB", sm_count=bad)


def test_the_environment_variable_still_overrides(monkeypatch):
    monkeypatch.setenv("TORCHFIT_CUDA_CONTEXT_BYTES", "123MiB")
    assert cuda_context_bytes(cuda_version="11.2") == 123 * MiB


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(cuda_version="twelve"), ValueError, "cannot read the CUDA version 'twelve'"),
        (dict(cuda_version=object()), TypeError, "cannot read the CUDA version"),
        (dict(cuda_version="11.2", lazy_loading=True), ValueError, "arrived in CUDA 11.7"),
        (dict(lazy_loading="yes"), TypeError, "lazy_loading must be True or False or None"),
    ],
)
def test_bad_versions_are_named(kwargs, error, message, monkeypatch):
    monkeypatch.delenv("TORCHFIT_CUDA_CONTEXT_BYTES", raising=False)
    with pytest.raises(error, match=message):
        cuda_context_bytes(**kwargs)


def test_versions_parse_in_every_usual_form():
    assert parse_cuda_version("12.1") == parse_cuda_version((12, 1)) == parse_cuda_version(12.1)
    assert parse_cuda_version("cuda 11.8.0") == (11, 8)


def test_the_loading_cache_is_named_as_not_counted_only_when_there_are_weights():
    with_weights = to_device(MemoryEstimate(weights=MiB, activations=MiB))
    without = to_device(MemoryEstimate(activations=MiB))
    assert any("loading the weights" in note for note in with_weights.notes)
    assert not any("loading the weights" in note for note in without.notes)


def test_measuring_the_context_needs_a_gpu_and_says_what_to_pass_instead(monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(RuntimeError, match=r"context_bytes='420MiB'"):
        measure_cuda_context()
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        to_device(MemoryEstimate(weights=MiB), context_bytes="measure")


class _FakeCuda:
    """torch.cuda as a GPU with 300 MiB used outside the allocator, 20 MiB reserved."""

    def __init__(self):
        self.devices = []

    def install(self, monkeypatch):
        import contextlib

        import torch

        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(
            torch.cuda, "device", lambda i: self.devices.append(i) or contextlib.nullcontext()
        )
        monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
        monkeypatch.setattr(
            torch.cuda, "mem_get_info", lambda: (24_000 * MiB - 320 * MiB, 24_000 * MiB)
        )
        monkeypatch.setattr(torch.cuda, "memory_reserved", lambda: 20 * MiB)
        real_ones = torch.ones
        monkeypatch.setattr(torch, "ones", lambda *a, device=None, **k: real_ones(*a, **k))


def test_the_measured_context_is_used_device_memory_less_the_allocators(monkeypatch):
    fake = _FakeCuda()
    fake.install(monkeypatch)
    assert measure_cuda_context() == 300 * MiB
    assert measure_cuda_context("cuda:1") == 300 * MiB
    assert fake.devices == [0, 1]
    placed = to_device(MemoryEstimate(weights=MiB), context_bytes="measure")
    assert placed.context == 300 * MiB
    assert any("measured on this machine" in note for note in placed.notes)
