"""What any ``nn.Module`` keeps for backward, from one meta-device pass, and the step's peak."""

from torchfit.memory.modules.peak import estimate_module, inference_peak
from torchfit.memory.modules.saved import ActivationReport, LayerRecord, activation_bytes

__all__ = [
    "ActivationReport",
    "LayerRecord",
    "activation_bytes",
    "estimate_module",
    "inference_peak",
]
