"""Load a model in 4 bits and compare its footprint: predicted, real, and what HF reports.

1. Before downloading anything: the predicted weight bytes of a catalog model in bf16,
   int8 (LLM.int8) and NF4, from its config alone.
2. A small Llama saved to a folder, loaded with ``load_quantized(bits=4)``: torchfit's
   prediction, the bytes the loaded model really holds (quantization state included),
   and transformers' ``get_memory_footprint()``, which leaves that state out.

Run: python examples/quantized_footprint.py [--smoke]
"""

import argparse
import tempfile

import torch
import transformers

import torchfit
from torchfit import quantize

parser = argparse.ArgumentParser()
parser.add_argument("--smoke", action="store_true", help="small sizes (CI)")
args = parser.parse_args()
transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()
fmt = torchfit.format_bytes

# 1. A 7B model's weights, predicted from its config (a meta-device build: no memory).
name = "tinyllama-1.1b" if args.smoke else "llama-2-7b"
print(f"{name} weights, predicted:")
for dtype in ("bf16", "int8", "nf4"):
    fp = quantize.weights_footprint(name, dtype)
    print(f"  {dtype:<5}{fmt(fp.total):>12}  {fp.bits_per_parameter:5.2f} bits/parameter")

# 2. A small Llama, saved and loaded in 4 bits (NF4 + double quantization).
hidden, layers = (256, 2) if args.smoke else (1024, 8)
config = transformers.LlamaConfig(
    hidden_size=hidden,
    intermediate_size=4 * hidden,
    num_hidden_layers=layers,
    num_attention_heads=8,
    vocab_size=8192,
)
with tempfile.TemporaryDirectory() as folder:
    transformers.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
    model = quantize.load_quantized(folder, bits=4)

predicted = quantize.quantized_footprint(config, bits=4, dtype="bf16", device="cpu")
real = quantize.footprint(model)
print(f"\nsmall Llama ({layers} layers, hidden {hidden}) in NF4:")
print(real)
print(f"predicted before loading       {fmt(predicted.total):>12}")
print(f"really held (footprint)        {fmt(real.total):>12}")
print(f"model.get_memory_footprint()   {fmt(model.get_memory_footprint()):>12}")

# The quantized model runs (on CPU too, with bitsandbytes >= 0.47).
with torch.no_grad():
    logits = model(torch.randint(0, config.vocab_size, (1, 8))).logits
print(f"forward ok: logits {tuple(logits.shape)}, {logits.dtype}")
