"""`is_oom` backs off on every out-of-memory message accelerate's check knows, and no other.

Each message is written as the backend prints it (first words verbatim; sizes made up).
accelerate's own ``should_reduce_batch_size`` is asked too, so a sample that stopped
being one it recognises fails here instead of passing on a made-up string.
"""

import pytest
import torch
from accelerate.utils.memory import should_reduce_batch_size

from torchfit.memory.batch import is_oom

MESSAGES = {
    "CUDA": "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.78 GiB total capacity)",
    "HIP": "HIP out of memory. Tried to allocate 1.00 GiB (GPU 0; 63.98 GiB total capacity)",
    "XPU": "XPU out of memory. Tried to allocate 512.00 MiB (GPU 0; 15.11 GiB total capacity)",
    "MPS": "MPS backend out of memory (MPS allocated: 17.00 GB, other allocations: 1.00 GB, "
    "max allowed: 18.13 GB). Tried to allocate 256.00 MB on private pool.",
    "cuDNN": "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed "
    "in a non-contiguous input.",
    "CPU": "[enforce fail at alloc_cpu.cpp:114] data. DefaultCPUAllocator: can't allocate "
    "memory: you tried to allocate 1099511627776 bytes. Error code 12",
    "HPU": "FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed for size::1073741824 (1024)MB",
}

NOT_OOM = [
    "mat1 and mat2 shapes cannot be multiplied (4x3 and 4x2)",
    "Expected more than 1 value per channel when training, got input size torch.Size([1, 64])",
    "CUDA error: device-side assert triggered",
    "cuDNN error: CUDNN_STATUS_BAD_PARAM",
]


@pytest.mark.parametrize("backend", sorted(MESSAGES))
def test_every_message_accelerate_backs_off_on_is_an_oom(backend):
    error = RuntimeError(MESSAGES[backend])
    assert should_reduce_batch_size(error), f"not one accelerate knows: {backend}"
    assert is_oom(error), backend


@pytest.mark.parametrize("backend", sorted(MESSAGES))
def test_raised_from_an_oom_counts_too(backend):
    outer = ValueError("the training loop failed")
    outer.__cause__ = RuntimeError(MESSAGES[backend])
    assert is_oom(outer)
    assert not is_oom(ValueError("the training loop failed"))


@pytest.mark.parametrize("message", NOT_OOM)
def test_other_runtime_errors_are_not(message):
    error = RuntimeError(message)
    assert not should_reduce_batch_size(error)
    assert not is_oom(error)


def test_the_message_must_be_on_a_runtime_error():
    assert not is_oom(ValueError(MESSAGES["CUDA"]))
    assert is_oom(torch.OutOfMemoryError("anything"))
    assert is_oom(MemoryError())
