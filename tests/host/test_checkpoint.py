import json

import pytest
import safetensors.torch
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchfit.host import CheckpointFormat, imagine_checkpoint, read_checkpoint
from torchfit.memory.catalog import build_model


def test_read_single_safetensors_matches_the_models_tensors(checkpoints):
    ckpt = read_checkpoint(checkpoints["bf16"])
    model = build_model(checkpoints["bf16"])
    state = model.state_dict()
    assert ckpt.format is CheckpointFormat.SAFETENSORS
    assert len(ckpt.file_bytes) == 1
    assert {t.name for t in ckpt.tensors} == set(state)
    for tensor in ckpt.tensors:
        assert tensor.dtype == torch.bfloat16
        assert tensor.numel == state[tensor.name].numel()
        assert tensor.nbytes == tensor.numel * 2
    # the file is the tensors plus a JSON header
    assert 0 < ckpt.file_bytes[0] - ckpt.tensor_bytes < 64 * 1024


def test_read_sharded_folder_in_sorted_order(checkpoints):
    ckpt = read_checkpoint(checkpoints["fp32-sharded"])
    index = json.loads((checkpoints["fp32-sharded"] / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(ckpt.file_bytes) == len(files) > 1
    for tensor in ckpt.tensors:
        assert files[tensor.file] == index["weight_map"][tensor.name]
    assert ckpt.tensor_bytes == read_checkpoint(checkpoints["fp32"]).tensor_bytes


def test_read_pickle_counts_each_storage_once(tmp_path):
    weight = torch.zeros(16, 8)
    torch.save({"a": weight, "b": weight, "c": weight[:4], "n": torch.ones(3, dtype=torch.int64)},
               tmp_path / "sd.pt")  # fmt: skip
    ckpt = read_checkpoint(tmp_path / "sd.pt")
    assert ckpt.format is CheckpointFormat.PICKLE
    assert ckpt.tensor_bytes == 16 * 8 * 4 + 3 * 8
    assert sorted(t.nbytes for t in ckpt.tensors) == [0, 0, 24, 512]


def test_read_pytorch_model_bin_folder(checkpoints):
    ckpt = read_checkpoint(checkpoints["fp32-bin"])
    assert ckpt.format is CheckpointFormat.PICKLE
    assert ckpt.tensor_bytes == read_checkpoint(checkpoints["fp32"]).tensor_bytes


def test_missing_checkpoint_says_what_was_expected(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors"):
        read_checkpoint(tmp_path)


def test_unknown_safetensors_dtype_is_refused(tmp_path):
    header = json.dumps({"w": {"dtype": "F4X", "shape": [2], "data_offsets": [0, 1]}}).encode()
    (tmp_path / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"0")
    with pytest.raises(ValueError, match="F4X"):
        read_checkpoint(tmp_path)


def test_imagined_checkpoint_is_what_save_pretrained_writes(checkpoints):
    real = read_checkpoint(checkpoints["fp32-sharded"])
    imagined = imagine_checkpoint(build_model(checkpoints["fp32"]), max_shard_size="12MB")
    assert [(t.name, t.dtype, t.numel) for t in imagined.tensors] == sorted(
        [(t.name, t.dtype, t.numel) for t in real.tensors],
        key=lambda row: [t.name for t in imagined.tensors].index(row[0]),
    )
    assert imagined.tensor_bytes == real.tensor_bytes
    # the same shards (save_pretrained may number them in another order)
    assert sorted(imagined.file_tensor_bytes()) == sorted(real.file_tensor_bytes())


def test_imagined_checkpoint_saves_tied_weights_once():
    from transformers import LlamaConfig

    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        vocab_size=100,
        tie_word_embeddings=True,
    )
    ckpt = imagine_checkpoint(build_model(config))
    names = {t.name for t in ckpt.tensors}
    assert "model.embed_tokens.weight" in names
    assert "lm_head.weight" not in names


@settings(max_examples=25, deadline=None)
@given(
    shapes=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 40)), min_size=1, max_size=6),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.int8]),
)
def test_read_matches_what_safetensors_wrote(tmp_path_factory, shapes, dtype):
    folder = tmp_path_factory.mktemp("st")
    tensors = {f"t{i}": torch.zeros(shape, dtype=dtype) for i, shape in enumerate(shapes)}
    safetensors.torch.save_file(tensors, folder / "model.safetensors")
    ckpt = read_checkpoint(folder)
    assert {t.name: (t.dtype, t.numel) for t in ckpt.tensors} == {
        name: (tensor.dtype, tensor.numel()) for name, tensor in tensors.items()
    }
    assert ckpt.tensor_bytes == sum(t.numel() * t.element_size() for t in tensors.values())
