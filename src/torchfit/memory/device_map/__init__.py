"""Inference over several GPUs: a device map whose GPUs also hold their KV cache and activations."""

from torchfit.memory.device_map.placement import evaluate_device_map, plan_device_map
from torchfit.memory.device_map.result import DeviceMap, DeviceShare

__all__ = [
    "DeviceMap",
    "DeviceShare",
    "evaluate_device_map",
    "plan_device_map",
]
