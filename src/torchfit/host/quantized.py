"""bitsandbytes quantization on load: what each weight keeps, and its scratch on the host.

transformers 5 quantizes each weight as it is read (``integrations/bitsandbytes.py``,
``Bnb4bitQuantize.convert``: ``Params4bit(value, ...).to(value.device)``; ``Bnb8bitQuantize``
likewise with ``Int8Params``), one weight at a time: on-the-fly quantization turns the
loader's thread pool off (``core_model_loading.convert_and_load_state_dict_in_model``,
``has_on_the_fly_quantization``). The bytes kept are bitsandbytes' layout
(`torchfit._bnb.layout`); the layers chosen are `torchfit._bnb.selection`'s.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from torchfit._bnb.layout import quantized_linear_bytes
from torchfit._bnb.selection import QuantSettings, out_in, select_layers

__all__ = ["QuantizedWeight", "quantized_weights", "scratch_per_element"]

#: Scratch bytes per weight element of one quantization on the CPU, above the source.
#: 4-bit: bitsandbytes' default ``quantize_4bit`` kernel (``backends/default/ops.py``)
#: works in fp32 (``A.reshape(-1).float()``, the scaled copy, ``clamp``, ``bucketize``'s
#: int32 codes, the uint8 codes, the packed halves); measured at 24 bytes per element above
#: an fp32 source with bitsandbytes 0.50.2 on torch 2.13 (CPU), 4 more for a 16-bit source,
#: whose ``.float()`` is a copy. 8-bit: ``Int8Params._quantize`` (``nn/modules.py``) makes an
#: fp16 copy (``.to(dtype=torch.float16)``: none for an fp16 source), then
#: ``int8_vectorwise_quant`` (``abs``, the scaled product, ``round``, the int8 result):
#: measured 8 bytes per element above an fp16 source, 10 above bf16 or fp32.
_SCRATCH_4BIT_FP32 = 24
_SCRATCH_8BIT_FP16 = 8


def scratch_per_element(bits: int, source: torch.dtype) -> int:
    """Scratch bytes per element of quantizing one weight stored as ``source`` on the CPU.

    Example:
        >>> scratch_per_element(4, torch.bfloat16), scratch_per_element(8, torch.float16)
        (28, 8)
    """
    if bits == 4:
        return _SCRATCH_4BIT_FP32 + (0 if source == torch.float32 else 4)
    if bits == 8:
        return _SCRATCH_8BIT_FP16 + (0 if source == torch.float16 else 2)
    raise ValueError(f"bitsandbytes quantizes to 4 or 8 bits; got bits={bits!r}")


@dataclasses.dataclass(frozen=True)
class QuantizedWeight:
    """One weight bitsandbytes quantizes on load.

    Attributes:
        kept: Bytes the quantized weight and its scales hold on the CPU.
        numel: Elements of the full-precision weight (its scratch scales with this).
    """

    kept: int
    numel: int


def quantized_weights(
    model: nn.Module, *, bits: int, double_quant: bool, skip_modules: tuple[str, ...] = ()
) -> dict[str, QuantizedWeight]:
    """The state-dict keys of the weights bitsandbytes quantizes, with their sizes.

    ``model`` may be on the meta device. The layers are the ones `torchfit.quantize` and
    transformers choose (the default skip list keeps the output head and tied embeddings).

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        ...                      num_attention_heads=4, vocab_size=100)
        >>> with torch.device("meta"):
        ...     model = LlamaForCausalLM(config)
        >>> weights = quantized_weights(model, bits=8, double_quant=False)
        >>> sorted(weights)[0], weights["model.layers.0.mlp.down_proj.weight"].kept
        ('model.layers.0.mlp.down_proj.weight', 8448)
    """
    settings = QuantSettings(bits=bits, double_quant=double_quant and bits == 4)
    selection = select_layers(model, settings, skip_modules)
    modules = dict(model.named_modules())
    out = {}
    for name in selection.quantize:
        out_f, in_f = out_in(modules[name])
        weight, scales = quantized_linear_bytes(
            out_f, in_f, bits=bits, double_quant=settings.double_quant, device="cpu"
        )
        out[f"{name}.weight"] = QuantizedWeight(weight + scales, out_f * in_f)
    return out
