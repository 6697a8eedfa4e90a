"""The small classics in plain torch: LeNet-5 and AlexNet, with their papers' shapes.

They are not transformers models, so the catalog builds them here (`CLASSICS`). Each
builder returns an ``nn.Module``; `torchfit.memory.catalog.build_model` builds it on the
meta device like any other catalog model.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

__all__ = ["CLASSICS", "AlexNet", "LeNet5", "alexnet", "lenet5"]


class LeNet5(nn.Sequential):
    """LeNet-5's layers in order (`lenet5` builds it)."""


class AlexNet(nn.Sequential):
    """AlexNet's layers in order (`alexnet` builds it)."""


def lenet5(num_classes: int = 10) -> nn.Module:
    """LeNet-5 (LeCun et al. 1998, "Gradient-based learning applied to document recognition").

    A 32x32 grey image; C1: 6 maps of 5x5, S2: 2x2 average pooling, C3: 16 maps of 5x5
    (every map connected to all six of S2, as most reimplementations do), S4: pooling,
    C5: 120 maps of 5x5 (a 1x1 output), F6: 84 units, and the output layer; tanh
    activations. 61,706 parameters.

    Example:
        >>> sum(p.numel() for p in lenet5().parameters())
        61706
    """
    return LeNet5(
        nn.Conv2d(1, 6, kernel_size=5),
        nn.Tanh(),
        nn.AvgPool2d(2),
        nn.Conv2d(6, 16, kernel_size=5),
        nn.Tanh(),
        nn.AvgPool2d(2),
        nn.Conv2d(16, 120, kernel_size=5),
        nn.Tanh(),
        nn.Flatten(),
        nn.Linear(120, 84),
        nn.Tanh(),
        nn.Linear(84, num_classes),
    )


def alexnet(num_classes: int = 1000) -> nn.Module:
    """AlexNet as Krizhevsky, Sutskever and Hinton (NeurIPS 2012) describe it.

    A 227x227 RGB image (the paper's 224 plus the padding its first stride needs); five
    convolutions of 96, 256, 384, 384 and 256 kernels (11x11 stride 4, 5x5, 3x3, 3x3,
    3x3), the second, fourth and fifth split in two groups as the two GPUs of the paper
    held them; local response normalisation after the first two; 3x3 max pooling with
    stride 2; three fully connected layers of 4096, 4096 and ``num_classes`` with dropout.
    60,965,224 parameters (the "60 million" of the paper; torchvision's single-GPU
    variant, ``torchvision/alexnet``, has 61,100,840).

    Example:
        >>> sum(p.numel() for p in alexnet().parameters())
        60965224
    """
    return AlexNet(
        nn.Conv2d(3, 96, kernel_size=11, stride=4),
        nn.ReLU(inplace=True),
        nn.LocalResponseNorm(5, alpha=1e-4, beta=0.75, k=2.0),
        nn.MaxPool2d(3, stride=2),
        nn.Conv2d(96, 256, kernel_size=5, padding=2, groups=2),
        nn.ReLU(inplace=True),
        nn.LocalResponseNorm(5, alpha=1e-4, beta=0.75, k=2.0),
        nn.MaxPool2d(3, stride=2),
        nn.Conv2d(256, 384, kernel_size=3, padding=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(384, 384, kernel_size=3, padding=1, groups=2),
        nn.ReLU(inplace=True),
        nn.Conv2d(384, 256, kernel_size=3, padding=1, groups=2),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, stride=2),
        nn.Flatten(),
        nn.Dropout(0.5),
        nn.Linear(256 * 6 * 6, 4096),
        nn.ReLU(inplace=True),
        nn.Dropout(0.5),
        nn.Linear(4096, 4096),
        nn.ReLU(inplace=True),
        nn.Linear(4096, num_classes),
    )


#: Builder name (``models.json``'s ``builder``) -> the function that builds it.
CLASSICS: dict[str, Callable[[], nn.Module]] = {"lenet5": lenet5, "alexnet": alexnet}
