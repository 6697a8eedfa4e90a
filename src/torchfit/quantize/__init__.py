"""4- and 8-bit weights with bitsandbytes, with safe defaults and honest footprints.

`load_quantized` wraps transformers' ``from_pretrained`` with a ``BitsAndBytesConfig``
whose defaults are the safe ones: NF4 with double quantization, a compute dtype that
matches the model (not bitsandbytes' slow fp32 default), and the user's skip list
*merged with* the default one (``lm_head``, tied embeddings), every name checked against
the model's real module names. `quantize_model` does the same for a model already built.

`quantized_footprint` predicts, from a config and before anything is loaded, the bytes
the quantized model will hold, from bitsandbytes' real layout rules (4-bit codes packed
two per byte, an absmax per block of 64, the last block padded, nested absmax per 256
blocks with double quantization, a row scale per output for LLM.int8). `footprint` reads
the same figures from a loaded model, ``quant_state`` included, which transformers'
``get_memory_footprint()`` leaves out. Tests check that the two agree to the byte.

Example:
    >>> from transformers import GPT2Config
    >>> config = GPT2Config(n_layer=2, n_embd=128, n_head=2, vocab_size=1000, bos_token_id=0,
    ...                     eos_token_id=0)
    >>> fp = quantized_footprint(config, bits=4, device="cpu")
    >>> fp.quantized_parameters, fp.quantized
    (393216, 196608)
    >>> print(f"{fp.quantized_bits_per_parameter:.3f}")
    4.305
"""

from torchfit._bnb.selection import QuantSettings, QuantType
from torchfit.quantize.accounting import footprint, quantized_footprint, weights_footprint
from torchfit.quantize.loading import load_quantized, quantize_model
from torchfit.quantize.result import Footprint, FootprintRow

# The settings are defined beside bitsandbytes' rules (torchfit._bnb); their public home is here.
QuantSettings.__module__ = QuantType.__module__ = __name__

__all__ = [
    # loading
    "QuantSettings",
    "QuantType",
    "load_quantized",
    "quantize_model",
    # bytes, predicted and measured
    "Footprint",
    "FootprintRow",
    "footprint",
    "quantized_footprint",
    "weights_footprint",
]
