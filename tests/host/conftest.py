"""Small real checkpoints (tens of MB) of one Llama config, saved every way the tests load."""

import pytest
import torch

SHARD = "12MB"


def small_config():
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=512,
        intermediate_size=1376,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=8000,
        tie_word_embeddings=False,
    )


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """``{name: folder}``: bf16, fp32, fp32 sharded, fp32 as pytorch_model.bin, and sd.pt."""
    from transformers import LlamaForCausalLM

    root = tmp_path_factory.mktemp("ckpt")
    torch.manual_seed(0)
    with torch.device("meta"):
        model = LlamaForCausalLM(small_config())
    model = model.to_empty(device="cpu")
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.02)
    paths = {name: root / name for name in ("bf16", "fp32", "fp32-sharded", "fp32-bin")}
    model.to(torch.bfloat16).save_pretrained(paths["bf16"])
    model.to(torch.float32).save_pretrained(paths["fp32"])
    model.save_pretrained(paths["fp32-sharded"], max_shard_size=SHARD)
    paths["fp32-bin"].mkdir()
    model.config.save_pretrained(paths["fp32-bin"])
    torch.save(model.state_dict(), paths["fp32-bin"] / "pytorch_model.bin")
    return paths
