"""Pick a batch size for a ResNet before training: predicted per card, then verified.

1. From the catalog (no weights, no GPU): the largest batch each card holds with a 7%
   margin, in fp32 and in mixed precision.
2. Your own ResNet (any ``nn.Module``; a torchvision ``resnet50()`` works the same way):
   predict, then let ``find_batch_size`` verify the prediction with real steps. On a
   CPU, ``simulate_gpu`` plays the card.

Run: python examples/resnet_batch_size.py [--smoke]
"""

import argparse

import torch
from torch import nn

import torchfit
from torchfit import memory

parser = argparse.ArgumentParser()
parser.add_argument("--smoke", action="store_true", help="small sizes (CI)")
args = parser.parse_args()

# 1. Catalog ResNet, SGD with momentum (the ImageNet recipe), one sample's shape.
name, shape = ("resnet-18", (3, 64, 64)) if args.smoke else ("resnet-50", (3, 224, 224))
print(f"{name} at {shape[1]}x{shape[2]}, SGD momentum: largest batch with a 7% margin")
print(f"  {'card':<34}{'fp32':>6}{'mixed':>7}")
cards = ("GTX 1060",) if args.smoke else ("GTX 1060", "RTX 3060", "RTX 4090", "A100 80GB")
for card in map(torchfit.gpu, cards):
    picks = []
    for dtype in ("fp32", "bf16" if card.bf16 else "fp16"):

        def predict(batch_size, dtype=dtype):
            return memory.estimate(
                name,
                batch_size=batch_size,
                input_shape=shape,
                dtype=dtype,
                optimizer="sgd-momentum",
            )

        picks.append(memory.max_batch_size(predict, card))
    print(f"  {card.name:<34}{picks[0]:>6}{picks[1]:>7}")


# 2. Your own model: predict for the card, then verify with real steps.
def block(c_in, c_out, stride):
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
        nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
    )


net = nn.Sequential(
    block(3, 32, 1),
    block(32, 64, 2),
    block(64, 128, 2),
    nn.AdaptiveAvgPool2d(1),
    nn.Flatten(),
    nn.Linear(128, 10),
)
opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
size = 16 if args.smoke else 32


def predict_own(batch_size):
    return memory.estimate(
        net,
        batch_size=batch_size,
        input_shape=(3, size, size),
        optimizer="sgd-momentum",
        device="cpu",  # use the default "cuda" when training on a GPU
    )


@torchfit.find_batch_size(predict=predict_own, restore=(net, opt))
def train_step(batch_size):
    x, y = torch.randn(batch_size, 3, size, size), torch.randint(0, 10, (batch_size,))
    nn.functional.cross_entropy(net(x), y).backward()
    opt.step()
    opt.zero_grad()


card = "16MiB" if args.smoke else "64MiB"
with memory.simulate_gpu(card, track=(net, opt)):  # on a GPU: just call train_step()
    result = train_step()
print(f"\nown ResNet at {size}x{size} on a simulated {card} card:")
print(result)
