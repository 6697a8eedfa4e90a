"""Models the published runs used that torchfit's catalog cannot build here.

torchvision does not install beside this torch, so ``vit_l_16`` is rebuilt from its
source, module for module: pytorch/vision ``torchvision/models/vision_transformer.py`` @
07a929e8b851242b1c75c9016ee06a8e502961d8 (``VisionTransformer``, ``Encoder``,
``EncoderBlock``, ``MLPBlock`` = ``torchvision.ops.misc.MLP``: Linear, GELU, Dropout,
Linear, Dropout) with ``vit_l_16``'s sizes (patch 16, 24 layers, 16 heads, width 1024,
MLP 4096, no dropout, LayerNorm eps 1e-6). Parameter names and initialisation are not
copied: only what holds memory (parameter shapes, the ops of ``forward``) matters here.

``AdamBefore104780`` is ``torch.optim.Adam``'s multi-tensor step as PyTorch ran it until
July 2023, for runs made with a PyTorch of that time (`adam_of`). Likewise a run of a
PyTorch before 2.2 ran its 16-bit attention through FlashAttention v1 (`flash_v1_of`),
whose output is laid out otherwise than FlashAttention-2's (`flash_v1_layout`).

The runs that used it are traced with their own training loop (`rasbt_step`), torchfit's
``trace_step`` on fake tensors, since torchfit's meta-device pass models only a loop that
frees the gradients before the forward.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

__all__ = [
    "AdamBefore104780",
    "TorchvisionViT",
    "adam_of",
    "flash_v1_layout",
    "flash_v1_of",
    "rasbt_step",
    "torchvision_vit_l_16",
]


def _version(written: str | None) -> tuple[int, int, str | None] | None:
    """(major, minor, nightly date) of a torch version as a source writes it."""
    found = re.search(r"torch (\d+)\.(\d+)\.\d+(?:\.dev(\d{8}))?", written or "")
    return None if found is None else (int(found[1]), int(found[2]), found[3])


def flash_v1_of(torch_version: str | None) -> bool:
    """Whether a run of ``torch_version`` ran 16-bit SDPA through FlashAttention v1.

    PyTorch 2.2 (January 2024) brought FlashAttention-2 into
    ``scaled_dot_product_attention``; 2.0 and 2.1 ran v1 (`flash_v1_layout`). A version
    not stated is the installed one.

    Example:
        >>> flash_v1_of("torch 2.1.0.dev20230623+cu118"), flash_v1_of("torch 2.2.0")
        (True, False)
    """
    version = _version(torch_version)
    return version is not None and version[:2] < (2, 2)


@contextlib.contextmanager
def flash_v1_layout() -> Iterator[None]:
    """SDPA's 16-bit attention with FlashAttention v1's layouts (PyTorch 2.0 and 2.1).

    ``_scaled_dot_product_flash_attention_cuda`` of those releases
    (aten/src/ATen/native/transformers/cuda/attention.cu, v2.1.0) reshaped the
    transposed query, key and value to (batch x sequence, heads, head size), copies
    wherever they were not laid out (batch, sequence, heads, head size) in memory, and
    ran v1's varlen kernel, whose output is allocated like those copies. Under
    ``nn.MultiheadAttention`` (sequence first) all three are copied, and the output,
    laid out batch first, is copied again before ``out_proj``: what FlashAttention-2,
    whose output follows the query, and the installed PyTorch do not. Here each 16-bit
    query, key and value is laid out so before the fused op the trace runs: the op keeps
    the copies where v1 kept the views of the in-projection (as many bytes), and its
    output comes out as v1's did. The copies v1 made again in its backward are not
    modelled.
    """
    functional = torch.nn.functional
    inner = functional.scaled_dot_product_attention

    def sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *a: Any, **k: Any) -> Any:
        if query.dtype in {torch.float16, torch.bfloat16} and query.dim() == 4:
            query, key, value = (
                t.transpose(1, 2).contiguous().transpose(1, 2) for t in (query, key, value)
            )
        return inner(query, key, value, *a, **k)

    functional.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        functional.scaled_dot_product_attention = inner


class _EncoderBlock(nn.Module):
    """torchvision's ``EncoderBlock``: pre-LN, ``nn.MultiheadAttention``, GELU MLP."""

    def __init__(self, heads: int, width: int, mlp: int, *, flash_v1: bool = False) -> None:
        super().__init__()
        self.flash_v1 = flash_v1
        self.ln_1 = nn.LayerNorm(width, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(width, heads, dropout=0.0, batch_first=True)
        self.dropout = nn.Dropout(0.0)
        self.ln_2 = nn.LayerNorm(width, eps=1e-6)
        self.mlp = nn.Sequential(
            nn.Linear(width, mlp),
            nn.GELU(),
            nn.Dropout(0.0),
            nn.Linear(mlp, width),
            nn.Dropout(0.0),
        )

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        x = self.ln_1(inputs)
        with flash_v1_layout() if self.flash_v1 else contextlib.nullcontext():
            x, _ = self.self_attention(query=x, key=x, value=x, need_weights=False)
        x = self.dropout(x) + inputs
        return x + self.mlp(self.ln_2(x))


class TorchvisionViT(nn.Module):
    """torchvision's ``VisionTransformer`` (no conv stem, no representation layer)."""

    def __init__(
        self,
        *,
        image: int,
        patch: int,
        layers: int,
        heads: int,
        width: int,
        mlp: int,
        classes: int,
        flash_v1: bool = False,
    ) -> None:
        super().__init__()
        self.patch, self.width = patch, width
        self.conv_proj = nn.Conv2d(3, width, kernel_size=patch, stride=patch)
        self.class_token = nn.Parameter(torch.zeros(1, 1, width))
        self.pos_embedding = nn.Parameter(torch.zeros(1, (image // patch) ** 2 + 1, width))
        self.dropout = nn.Dropout(0.0)
        self.layers = nn.Sequential(
            *(_EncoderBlock(heads, width, mlp, flash_v1=flash_v1) for _ in range(layers))
        )
        self.ln = nn.LayerNorm(width, eps=1e-6)
        self.head = nn.Linear(width, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        n, _, h, w = images.shape
        x = self.conv_proj(images).reshape(n, self.width, (h // self.patch) * (w // self.patch))
        x = torch.cat([self.class_token.expand(n, -1, -1), x.permute(0, 2, 1)], dim=1)
        x = self.ln(self.layers(self.dropout(x + self.pos_embedding)))
        return self.head(x[:, 0])


def torchvision_vit_l_16(*, classes: int = 1000, flash_v1: bool = False) -> TorchvisionViT:
    """``torchvision.models.vit_l_16()`` on the meta device, its head for ``classes``.

    ``flash_v1``: its attention as PyTorch before 2.2 ran it in 16 bits (`flash_v1_layout`).

    Example:
        >>> model = torchvision_vit_l_16()
        >>> sum(p.numel() for p in model.parameters())  # torchvision's num_params
        304326632
    """
    with torch.device("meta"):
        return TorchvisionViT(
            image=224,
            patch=16,
            layers=24,
            heads=16,
            width=1024,
            mlp=4096,
            classes=classes,
            flash_v1=flash_v1,
        )


def rasbt_step(*, accumulation: int, autocast: torch.dtype | None = None) -> Callable[..., None]:
    """One optimizer step of rasbt/pytorch-memory-optim's ViT loop, as its scripts order it.

    01_pytorch-vit.py (and 01-2, 02, 03, 04) @ f6eddcd28c40770a097ffd9f18797a043457a2d0,
    lines 29-36: ``logits = model(features)``, the loss, ``optimizer.zero_grad()``,
    ``backward``, ``optimizer.step()``: zero_grad comes after the forward, so the previous
    step's gradients are alive through every forward. 05_gradient-accum.py and
    06_sgd-with-scheduler.py: forward, ``loss / accumulation_steps``, backward, and every
    ``accumulation_steps`` micro-batches ``step()`` then ``zero_grad()``. ``autocast``:
    Fabric's ``"16-mixed"`` (02_mixed-precision.py) runs the module's forward under
    ``torch.autocast("cuda", dtype=torch.float16)``; the loss is computed outside it.
    """

    def step(model: nn.Module, optimizer: Any, images: torch.Tensor, labels: torch.Tensor) -> None:
        for micro in range(accumulation):
            with torch.autocast("cuda", dtype=autocast, enabled=autocast is not None):
                logits = model(images)
            loss = nn.functional.cross_entropy(logits, labels) / accumulation
            if accumulation == 1:
                optimizer.zero_grad()
            loss.backward()
            if micro == accumulation - 1:
                optimizer.step()
                if accumulation > 1:
                    optimizer.zero_grad()

    return step


class AdamBefore104780(torch.optim.Optimizer):
    """Adam's multi-tensor (``foreach``) step as PyTorch ran it before pytorch/pytorch#104780.

    Until that change (merged 10 July 2023; in 2.1.0, not in 2.0.x) the step built the
    denominator out of place: ``sqrt(v) / bias_correction2_sqrt`` as one list, then
    ``+ eps`` as a second, both the size of every parameter and alive together until the
    update (pytorch/pytorch#97712: "Foreach optimizers use higher memory due to
    intermediates"). PyTorch 2.1 and later hold one such list, as the installed Adam does.
    The arithmetic is Adam's (no weight decay, no amsgrad: what the runs used); only the
    order of allocations matters here.
    """

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999)):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": 1e-8})

    @torch.no_grad()
    def step(self) -> None:  # type: ignore[override]  # no closure: the loops pass none
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            for p in params:  # lazily, on the first step, as torch.optim.Adam does
                if not self.state[p]:
                    self.state[p].update(
                        step=torch.tensor(0.0),
                        exp_avg=torch.zeros_like(p),
                        exp_avg_sq=torch.zeros_like(p),
                    )
            grads = [p.grad for p in params]
            first = [self.state[p]["exp_avg"] for p in params]
            second = [self.state[p]["exp_avg_sq"] for p in params]
            steps = [self.state[p]["step"] for p in params]
            beta1, beta2 = group["betas"]
            torch._foreach_add_(steps, 1)
            torch._foreach_lerp_(first, grads, 1 - beta1)
            torch._foreach_mul_(second, beta2)
            torch._foreach_addcmul_(second, grads, grads, 1 - beta2)
            counts = [int(s.item()) for s in steps]
            root = torch._foreach_sqrt(second)  # noqa: SLF001  # the first intermediate list
            torch._foreach_div_(root, [(1 - beta2**k) ** 0.5 for k in counts])
            denominator = torch._foreach_add(root, group["eps"])  # noqa: SLF001  # the second
            sizes = [-group["lr"] / (1 - beta1**k) for k in counts]
            torch._foreach_addcdiv_(params, first, denominator, sizes)


def adam_of(torch_version: str | None) -> type[torch.optim.Optimizer]:
    """The Adam a run with ``torch_version`` (as its source writes it) stepped with.

    Example:
        >>> adam_of("torch 2.1.0.dev20230623+cu118").__name__, adam_of("torch 2.1.0").__name__
        ('AdamBefore104780', 'Adam')
    """
    version = _version(torch_version)
    if version is None:
        return torch.optim.Adam
    major, minor, nightly = version
    before = (major, minor) < (2, 1) or (
        (major, minor) == (2, 1) and nightly is not None and nightly < "20230711"
    )
    return AdamBefore104780 if before else torch.optim.Adam
