"""Which layer eats my memory? A per-layer table of what a CNN keeps for backward.

Run: python examples/layer_table.py [--smoke]
"""

import argparse

import torch
from torch import nn

from torchfit import memory

parser = argparse.ArgumentParser()
parser.add_argument("--smoke", action="store_true", help="small sizes (CI)")
args = parser.parse_args()

net = nn.Sequential(
    nn.Conv2d(3, 64, 7, stride=2, padding=3),
    nn.BatchNorm2d(64),
    nn.ReLU(inplace=True),
    nn.MaxPool2d(3, stride=2, padding=1),
    nn.Conv2d(64, 128, 3, padding=1),
    nn.BatchNorm2d(128),
    nn.ReLU(inplace=True),
    nn.Dropout(0.2),
    nn.AdaptiveAvgPool2d(1),
    nn.Flatten(),
    nn.Linear(128, 1000),
)
size = 64 if args.smoke else 224
batch = 4 if args.smoke else 32
# meta tensors: nothing is allocated, the model is untouched
report = memory.activation_bytes(net, torch.empty(batch, 3, size, size, device="meta"))
print(report)
plan = memory.estimate(net, batch_size=batch, input_shape=(3, size, size), dtype="fp16")
print()
print(plan)
