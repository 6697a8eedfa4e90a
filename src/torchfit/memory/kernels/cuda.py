"""What a CPU trace cannot see of a GPU step, modelled explicitly for ``device="cuda"``.

Fake CUDA tensors abort a CPU-only PyTorch build, so the CUDA target is traced with CPU
fakes and these differences are applied on top:

- **Allocator blocks.** Every CUDA allocation is rounded up to 512 bytes
  (``kMinBlockSize`` in ``c10/cuda/CUDACachingAllocator.cpp``); the tracker rounds each
  storage, and the estimate reports the rounding as ``overhead``.
- **SDPA backend.** On CPU, ``scaled_dot_product_attention`` with dropout in training
  falls back to the math path, which materializes the scores and the dropout mask
  (O(s²) bytes per head). CUDA's flash and memory-efficient kernels apply dropout inside
  the kernel from a Philox seed and offset and save only the output and the log-sum-exp.
  `FusedSdpa` therefore runs SDPA as a fused op that saves exactly that. The seed and
  offset are 0-dim ``int64`` tensors created on the CPU outside CUDA-graph capture
  (``mha_fwd`` in ``aten/src/ATen/native/transformers/cuda/flash_attn``), so they add
  no GPU bytes. Head sizes above 256 stay on the math path, as on a GPU. Which fused
  kernel decides the output's layout, and so whether the caller's
  ``transpose(...).contiguous()`` copies it: FlashAttention-2 (fp16/bf16, no mask)
  allocates its output like the query it is given (``empty_like``, the same as the CPU
  flash op the trace runs in its place); the memory-efficient kernel (fp32, or any
  mask) always in (batch, sequence, heads, head size) order
  (``_efficient_attention_forward`` in ``aten/src/ATen/native/transformers/cuda/
  attention.cu``), so the trace runs ATen's own op for it, whose fake-tensor rule
  allocates the same. torchvision's ``nn.MultiheadAttention`` then copies an fp32
  output before its ``out_proj`` and Phi-3's concatenated rotary query does not, the
  reverse of the flash kernel.
- **Dropout mask.** On CPU, ATen's dropout multiplies by a noise tensor of the input's
  dtype and autograd keeps it (2-4 bytes per element); on CUDA the fused
  ``native_dropout`` keeps a bool mask (1 byte), whenever ``0 < p < 1``
  (``is_fused_kernel_acceptable`` in ``aten/src/ATen/native/Dropout.cpp``). `FusedSdpa`
  routes ``F.dropout`` in training to ``torch.native_dropout``, whose CPU kernel keeps
  the same bool mask.
- **Optimizer implementation.** PyTorch defaults to the ``foreach`` (multi-tensor)
  implementation for CUDA parameters (``_default_to_fused_or_foreach`` in
  ``torch/optim/optimizer.py``), whose intermediates span all parameters at once, and to
  the per-parameter loop on CPU. `prefer_foreach` sets ``foreach=True`` on the fake
  optimizer's groups where the user left it unset.

- **Kernel scratch.** `torchfit.memory.kernels.cuda_reduce.CudaRules`: the staging
  buffers of reductions split over thread blocks, the fused attention backward's
  fp32 accumulators (`fused_attention_backward_bytes`) and cuDNN's convolution
  workspaces (`torchfit.memory.kernels.cudnn`). cuBLAS's workspaces, one per thread that
  runs matmuls, are `torchfit.memory.allocator.to_device`'s.

Not modelled (listed in the estimate's notes): the 1 MiB cuBLASLt workspaces.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.overrides import TorchFunctionMode

from torchfit._core.ledger import CUDA_BLOCK

__all__ = [
    "CUBLAS_NOTE",
    "CUDA_BLOCK",
    "FusedSdpa",
    "cuda_notes",
    "fused_attention_backward_bytes",
    "prefer_foreach",
]


_SDPA = torch.nn.functional.scaled_dot_product_attention
_DROPOUT = torch.nn.functional.dropout
_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default  # noqa: SLF001
_EFFICIENT = torch.ops.aten._scaled_dot_product_efficient_attention.default  # noqa: SLF001
#: The dtypes FlashAttention-2 takes; CUDA runs other fused attention memory-efficiently.
_FLASH_DTYPES = frozenset({torch.float16, torch.bfloat16})
_MAX_FUSED_HEAD = 256  # flash-attention 2 supports head sizes up to 256


def _sdpa_arguments(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")
    bound = dict(zip(names, args, strict=False))
    bound.update(kwargs)
    return bound


class FusedSdpa(TorchFunctionMode):
    """Runs ``scaled_dot_product_attention`` as the fused kernel a GPU would pick."""

    def __init__(self, fused: Callable[[torch.dtype, bool], bool] | None = None) -> None:
        """Count the calls routed to the fused ops and those left on the math path.

        ``fused(dtype, grouped)``: whether CUDA has a fused kernel for attention in
        ``dtype`` (after autocast) with grouped key/value heads passed as such
        (``enable_gqa``); the estimators' rule is
        `torchfit.memory.analytic.formulas.sdpa_is_flash`. Default: always.
        """
        super().__init__()
        self.fused_for = fused
        self.fused = 0
        self.math = 0
        self.dropouts = 0

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        """Route SDPA and dropout; pass everything else through."""
        kwargs = dict(kwargs or {})
        if func is _DROPOUT:
            return self._dropout(func, args, kwargs)
        if func is not _SDPA:
            return func(*args, **kwargs)
        return self._sdpa(func, args, kwargs)

    @contextlib.contextmanager
    def installed(self) -> Iterator[FusedSdpa]:
        """Route SDPA and dropout for the whole step, backward's recomputations included.

        A torch function mode is not active while autograd runs backward, so the
        forward that gradient checkpointing recomputes there would take the math path
        and no longer match what it saved (measured with torch 2.13: a ``CheckpointError``
        "Recomputed values ... have different metadata"). The functions are therefore also
        replaced in ``torch.nn.functional`` for the step, and restored after it.
        """
        functional = torch.nn.functional

        def sdpa(*args: Any, **kwargs: Any) -> Any:
            return self._sdpa(_SDPA, args, kwargs)

        def dropout(*args: Any, **kwargs: Any) -> Any:
            return self._dropout(_DROPOUT, args, kwargs)

        functional.scaled_dot_product_attention = sdpa
        functional.dropout = dropout
        try:
            with self:
                yield self
        finally:
            functional.scaled_dot_product_attention = _SDPA
            functional.dropout = _DROPOUT

    def _sdpa(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``scaled_dot_product_attention`` as the fused kernel, where the GPU would fuse it."""
        bound = _sdpa_arguments(args, kwargs)
        query, key, value = bound["query"], bound["key"], bound["value"]
        autocast = torch.is_autocast_enabled("cpu")
        dtype = torch.get_autocast_dtype("cpu") if autocast else query.dtype
        if (
            query.dim() != 4
            or query.shape[-1] > _MAX_FUSED_HEAD
            or not (self.fused_for is None or self.fused_for(dtype, self._grouped(bound)))
        ):
            self.math += 1
            # the CPU's own choice could be its flash kernel, which takes any of these
            with sdpa_kernel(SDPBackend.MATH):
                return func(*args, **kwargs)
        self.fused += 1
        if autocast:
            # scaled_dot_product_attention is on autocast's lower-precision list; calling
            # the fused op directly skips that rule, so apply it here: the kernel then
            # keeps 16-bit Q, K, V and output, as on the GPU
            low = torch.get_autocast_dtype("cpu")
            query, key, value = (
                t.to(low) if t.is_floating_point() else t for t in (query, key, value)
            )
        dropout = float(bound.get("dropout_p", 0.0) or 0.0)
        causal, mask = bool(bound.get("is_causal", False)), bound.get("attn_mask")
        efficient = query.dtype not in _FLASH_DTYPES or mask is not None
        if efficient and key.shape[-3] == query.shape[-3]:  # it takes no grouped heads
            scale = bound.get("scale")
            return _efficient(query, key, value, mask, dropout=dropout, causal=causal, scale=scale)
        output, _logsumexp = _FLASH(
            query, key, value, dropout, causal, attn_mask=mask, scale=bound.get("scale")
        )
        return output

    @staticmethod
    def _grouped(bound: Mapping[str, Any]) -> bool:
        """Fewer key/value heads than query heads, passed as such (``enable_gqa=True``)."""
        query, key = bound["query"], bound["key"]
        return bool(bound.get("enable_gqa")) and key.shape[-3] != query.shape[-3]

    def _dropout(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``F.dropout`` as CUDA runs it: the fused kernel with a bool mask, where it applies."""
        names = ("input", "p", "training", "inplace")
        bound = {**dict(zip(names, args, strict=False)), **kwargs}
        tensor = bound["input"]
        p = float(bound.get("p", 0.5))
        if not bound.get("training", True) or bound.get("inplace") or not 0 < p < 1:
            return func(*args, **kwargs)
        if tensor.numel() == 0:
            return func(*args, **kwargs)
        self.dropouts += 1
        return torch.native_dropout(tensor, p, train=True)[0]


def _efficient(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    dropout: float,
    causal: bool,
    scale: float | None,
) -> torch.Tensor:
    """The memory-efficient kernel, as ``scaled_dot_product_attention`` calls it on CUDA.

    ``scaled_dot_product_attention`` (``aten/src/ATen/native/transformers/attention.cpp``)
    turns a boolean mask into an additive bias of the query's dtype
    (``convert_boolean_attn_mask``: a new tensor of the mask's shape, which the op keeps
    for its backward, one per call), pads a bias whose strides are not multiples of 8
    elements and slices it back (``preprocess_mask``), and broadcasts it to (batch,
    heads, queries, keys). The log-sum-exp is kept only where a gradient will flow.
    """
    if mask is not None:
        if mask.dtype == torch.bool:
            zero = torch.zeros((), dtype=query.dtype, device=mask.device)
            mask = torch.where(mask, zero, torch.full_like(zero, float("-inf")))
        strides = mask.stride()
        if strides[-1] != 1 or any(stride % 8 for stride in strides[:-1]):
            length = mask.shape[-1]
            mask = torch.nn.functional.pad(mask, (0, 8 - length % 8))[..., :length]
        mask = mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    grads = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    outputs = _EFFICIENT(query, key, value, mask, grads, dropout, causal, scale=scale)
    output: torch.Tensor = outputs[0]  # then the log-sum-exp and the Philox seed and offset
    return output


def fused_attention_backward_bytes(args: tuple[Any, ...]) -> int:
    """Scratch of a fused attention's backward on CUDA, from the traced op's arguments.

    ``args`` are those of the fused backward the trace runs (``grad_out,
    query, key, ...``, each (batch, heads, sequence, head_dim)). CUDA's kernels accumulate
    the query's gradient in fp32 and keep one fp32 row sum per query: batch x heads x
    sequence x (4 x head_dim + 4) bytes, allocated after the three gradients and freed
    with the op; with grouped key/value heads the key and value gradients are made for
    every query head first, in the inputs' dtype, then summed. Measured in H200
    snapshots (torch 2.11): ViT-B/16 bf16 at batch 64 (39,336,960 bytes by this rule,
    256 more allocated), Llama-3.2-1B's GQA at 4 x 2048 (135,266,304; 256 more), GPT-2
    fp32 through the memory-efficient kernel at 8 x 1024 (25,559,040; 1.5% fewer
    allocated).

    Example:
        >>> q = torch.empty(64, 12, 197, 64, device="meta", dtype=torch.bfloat16)
        >>> fused_attention_backward_bytes((q, q, q))
        39336960
    """
    query, key = args[1], args[2]
    batch, heads, length, width = query.shape
    scratch = batch * heads * length * (4 * width + 4)
    if key.shape[1] < heads:  # grouped keys/values: per-query-head gradients, then summed
        scratch += 2 * batch * heads * key.shape[2] * width * key.element_size()
    return int(scratch)


def prefer_foreach(optimizer: torch.optim.Optimizer) -> bool:
    """Use the ``foreach`` implementation, CUDA's default, where the user left it unset."""
    changed = False
    for group in optimizer.param_groups:
        if "foreach" in group and group["foreach"] is None and not group.get("fused"):
            group["foreach"] = True
            changed = True
    return changed


#: A CUDA trace's note on cuBLAS's workspaces, which an estimate that carries its events
#: drops: `torchfit.memory.allocator.to_device` adds them there.
CUBLAS_NOTE = (
    "device=cuda: cuBLAS workspaces are not in this estimate (created at the first call and "
    "kept; to_device adds them)"
)


def cuda_notes(
    *, fused_sdpa: int, math_sdpa: int, dropouts: int = 0, foreach: bool, convolutions: int = 0
) -> list[str]:
    """The notes a CUDA-target estimate carries (``convolutions``: cuDNN calls traced)."""
    notes = [
        (
            f"device=cuda: every storage rounded up to {CUDA_BLOCK} B (CUDA caching "
            "allocator block); the rounding is reported as overhead"
        ),
        CUBLAS_NOTE,
    ]
    if convolutions:
        notes.append(
            f"device=cuda: {convolutions} convolution(s) traced with cuDNN's workspaces as an "
            "H200 with cuDNN 9 allocated them (NHWC copies of NCHW operands; "
            "torchfit.memory.kernels.cudnn); another card or cuDNN version may pick other "
            "algorithms, and cudnn.benchmark=True is not modelled"
        )
    if fused_sdpa:
        notes.append(
            f"device=cuda: {fused_sdpa} scaled_dot_product_attention call(s) modelled as the "
            "flash/memory-efficient kernel: output + log-sum-exp saved, dropout in-kernel "
            "(Philox seed/offset are CPU scalars), no O(seq^2) scores"
        )
    if math_sdpa:
        notes.append(
            f"device=cuda: {math_sdpa} scaled_dot_product_attention call(s) left on the math "
            f"path (head size > {_MAX_FUSED_HEAD} or not 4-D)"
        )
    if dropouts:
        notes.append(
            f"device=cuda: {dropouts} dropout call(s) as CUDA's fused native_dropout "
            "(a bool mask, 1 byte per element, where CPU keeps the input's dtype)"
        )
    if foreach:
        notes.append("device=cuda: optimizer traced with foreach=True (PyTorch's CUDA default)")
    return notes
