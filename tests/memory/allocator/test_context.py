"""The CUDA context: by CUDA version and module loading, given by the user, or measured."""

import pytest

from torchfit.memory import MemoryEstimate, cuda_context_bytes, measure_cuda_context, to_device
from torchfit.memory.allocator.context import (
    DEFAULT_CUDA_CONTEXT_BYTES,
    EAGER_CUDA_CONTEXT_BYTES,
    PRE_LAZY_CUDA_CONTEXT_BYTES,
    parse_cuda_version,
)

MiB = 2**20


def test_the_context_follows_the_cuda_stack(monkeypatch):
    monkeypatch.delenv("TORCHFIT_CUDA_CONTEXT_BYTES", raising=False)
    assert cuda_context_bytes() == DEFAULT_CUDA_CONTEXT_BYTES
    assert cuda_context_bytes(cuda_version="12.4") == DEFAULT_CUDA_CONTEXT_BYTES
    assert cuda_context_bytes(cuda_version="12.4", lazy_loading=False) == EAGER_CUDA_CONTEXT_BYTES
    # Hugging Face's V100 / CUDA 11.2 figure: 1343 MiB in nvidia-smi with one tiny tensor
    # (a 2 MiB small-pool segment) -> a 1341 MiB context
    assert cuda_context_bytes(cuda_version="11.2") == PRE_LAZY_CUDA_CONTEXT_BYTES == 1341 * MiB
    assert cuda_context_bytes(cuda_version=(11, 6)) == PRE_LAZY_CUDA_CONTEXT_BYTES


def test_to_device_takes_the_version_and_the_measured_figure(monkeypatch):
    monkeypatch.delenv("TORCHFIT_CUDA_CONTEXT_BYTES", raising=False)
    base = MemoryEstimate(weights=100 * MiB)
    old = to_device(base, gpu="V100 16GB", cuda_version="11.2")
    new = to_device(base, gpu="V100 16GB")
    assert (
        old.device_total - new.device_total
        == PRE_LAZY_CUDA_CONTEXT_BYTES - DEFAULT_CUDA_CONTEXT_BYTES
    )
    assert any("CUDA 11.2" in note for note in old.notes)
    given = to_device(base, gpu="V100 16GB", context_bytes="500MiB", cuda_version="11.2")
    assert given.context == 500 * MiB  # a measured figure wins


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
