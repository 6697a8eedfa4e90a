"""The memory layout a CPU kernel gives its outputs, where a fake or meta kernel differs.

The rules read strides (a channels-last gradient makes a convolution backward skip a
copy, a transposed one makes it copy), so the layouts of a traced or meta-device step
must be those of the real CPU step. `cpu_layout` replaces an output whose layout would
differ by an empty tensor of the right strides on the same device (fake or meta: nothing
is allocated), before anything counts it.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

__all__ = ["cpu_layout", "cpu_twin"]

aten = torch.ops.aten
_BN_BACKWARD = aten.native_batch_norm_backward.default
_CONV = aten.convolution.default
_CONV_BACKWARD = aten.convolution_backward.default


@functools.cache
def _fake_mode() -> FakeTensorMode:
    return FakeTensorMode()


def cpu_twin(tensor: Any) -> Any:
    """A CPU twin of a meta tensor (a fake one: nothing allocated); others as they are.

    Example:
        >>> cpu_twin(torch.empty(2, 3, device="meta").t()).stride()
        (1, 3)
    """
    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "meta":
        return tensor
    with _fake_mode():
        return torch.empty_strided(
            tuple(tensor.shape), tuple(tensor.stride()), dtype=tensor.dtype, device="cpu"
        )


def _conv_format(func: Any, args: tuple[Any, ...]) -> torch.memory_format:
    """The layout ATen's CPU convolution gives its outputs (as FakeTensor's ``conv``).

    ``torch._C._select_conv_backend`` then ``_conv_determine_backend_memory_format``
    (aten/src/ATen/native/Convolution.cpp), asked with CPU twins of the operands.
    """
    if func is _CONV:
        x, w, bias, stride, padding, dilation, transposed, output_padding, groups = args[:9]
        sizes = None
    else:
        _grad, x, w, sizes, stride, padding, dilation, transposed, output_padding, groups = args[
            :10
        ]
        bias = None
    x, w, bias = cpu_twin(x), cpu_twin(w), cpu_twin(bias)
    backend = torch._C._select_conv_backend(  # noqa: SLF001 - the kernel's own choice
        x, w, bias, stride, padding, dilation, transposed, output_padding, groups, sizes
    )
    if w.dim() == 3:  # 1-d convolutions run as 2-d ones
        with _fake_mode():
            x, w = x.contiguous().unsqueeze(2), w.unsqueeze(2)
    fmt: torch.memory_format = torch._C._conv_determine_backend_memory_format(  # noqa: SLF001
        x, w, backend
    )
    return fmt


def _restride(tensor: Any, fmt: torch.memory_format) -> Any:
    if not isinstance(tensor, torch.Tensor):
        return tensor
    if tensor.dim() == 3 and fmt == torch.channels_last:
        return tensor.unsqueeze(2).to(memory_format=fmt).squeeze(2)
    return tensor.to(memory_format=fmt)


def _bn_backward(args: tuple[Any, ...], out: Any) -> Any:
    """``native_batch_norm_backward``: grad_input in the input's suggested layout.

    The CPU kernel allocates grad_input in the input's suggested memory format
    (``batch_norm_backward_cpu``, aten/src/ATen/native/Normalization.cpp:
    ``at::empty_like(input, input.suggest_memory_format())``), the fake and meta kernels in
    the gradient's. Measured (torch 2.13): a channels-last input with a plain grad_output
    gives channels-last strides on CPU and plain ones under FakeTensorMode, and the next
    convolution's backward is then charged a layout copy it never makes.
    """
    if not isinstance(out, tuple) or out[0] is None:
        return out
    grad_input, source = out[0], args[1]
    layout = torch.channels_last
    if (
        source.dim() == 4
        and source.is_contiguous(memory_format=layout)
        and not source.is_contiguous()
        and not grad_input.is_contiguous(memory_format=layout)
    ):
        _, channels, _, width = grad_input.shape
        plane = channels * width * grad_input.shape[2]
        strides = (plane, 1, width * channels, channels)  # N, C, H, W in NHWC order
        fixed = grad_input.new_empty_strided(tuple(grad_input.shape), strides)  # fake or meta
        return (fixed, *out[1:])
    return out


def cpu_layout(func: Any, args: tuple[Any, ...], out: Any) -> Any:
    """``out`` with the layout the CPU kernel of ``func`` gives it, where it differs.

    * ``native_batch_norm_backward`` (fake and meta): see `_bn_backward`.
    * ``convolution`` and ``convolution_backward`` on meta: the meta kernels keep the
      plain layout where oneDNN returns a channels-last output for a channels-last input
      (FakeTensor already corrects fakes the same way, in ``fake_impls.conv``).

    Example:
        >>> x = torch.empty(2, 8, 6, 6, device="meta").contiguous(memory_format=torch.channels_last)
        >>> w = torch.empty(8, 8, 3, 3, device="meta")
        >>> args = (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        >>> conv = torch.ops.aten.convolution.default
        >>> conv(*args).is_contiguous(), cpu_layout(conv, args, conv(*args)).is_contiguous()
        (True, False)
    """
    if func is _BN_BACKWARD:
        return _bn_backward(args, out)
    if func is _CONV and isinstance(out, torch.Tensor) and out.device.type == "meta":
        return _restride(out, _conv_format(func, args))
    if func is _CONV_BACKWARD and isinstance(out, tuple) and args[1].device.type == "meta":
        fmt = _conv_format(func, args)
        return (_restride(out[0], fmt), _restride(out[1], fmt), out[2])
    return out
