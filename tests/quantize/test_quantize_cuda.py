"""torchfit.quantize on a real GPU: predicted bytes vs the allocator, logits, generate, reload."""

import pytest
import torch

pytest.importorskip("bitsandbytes", reason="torchfit.quantize tests need bitsandbytes")
transformers = pytest.importorskip("transformers", reason="torchfit.quantize needs transformers")

from torchfit.quantize import (  # noqa: E402 - after the importorskip guards
    footprint,
    load_quantized,
    quantized_footprint,
)

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

TOKENS = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
SETTINGS = [
    {"bits": 4},
    {"bits": 4, "double_quant": False},
    {"bits": 4, "quant_type": "fp4"},
    {"bits": 8},
]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny Llama (GQA, untied head) saved in bf16."""
    config = transformers.LlamaConfig(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1000,
        max_position_embeddings=64,
        **TOKENS,
    )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("models") / "llama"
    transformers.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(path)
    return path


@pytest.mark.parametrize("options", SETTINGS, ids=str)
def test_predicted_bytes_equal_the_allocator(saved, options):
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    model = load_quantized(saved, device_map={"": 0}, **options)
    allocated = torch.cuda.memory_allocated() - before
    predicted = quantized_footprint(saved, device="cuda", **options)
    # footprint counts tensor bytes; the allocator rounds each to 512 B, as the
    # prediction for device="cuda" does.
    assert predicted.total == allocated
    assert footprint(model).parameters == predicted.parameters
    del model
    torch.cuda.empty_cache()


@pytest.mark.parametrize("bits", [4, 8])
def test_logits_stay_close_and_generate_works(saved, bits):
    reference = transformers.AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32)
    reference = reference.cuda()
    model = load_quantized(saved, bits=bits, device_map={"": 0})
    tokens = torch.randint(3, 1000, (2, 16), device="cuda")
    with torch.no_grad():
        want = reference(tokens).logits.float()
        got = model(tokens).logits.float()
    error = ((got - want).norm() / want.norm()).item()
    assert error < (0.30 if bits == 4 else 0.05), error  # the CPU tests' bounds
    out = model.generate(tokens[:1, :5], max_new_tokens=4, do_sample=False)
    assert out.shape == (1, 9)


def test_save_and_reload_round_trip_on_the_gpu(saved, tmp_path):
    model = load_quantized(saved, bits=4, device_map={"": 0})
    model.save_pretrained(tmp_path / "q")
    again = load_quantized(tmp_path / "q", bits=4, device_map={"": 0})
    assert footprint(again).rows == footprint(model).rows
