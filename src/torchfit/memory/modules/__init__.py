"""What a model keeps for backward, layer by layer, from one meta-device pass of any nn.Module."""

from torchfit.memory.modules.saved import (
    ActivationReport,
    LayerRecord,
    activation_bytes,
    estimate_module,
    inference_peak,
)

__all__ = [
    "ActivationReport",
    "LayerRecord",
    "activation_bytes",
    "estimate_module",
    "inference_peak",
]
