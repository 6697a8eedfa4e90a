"""What a checkpoint holds on disk: its tensors (name, dtype, size) and its files.

`read_checkpoint` reads a real one without loading its weights: a safetensors file is an
8-byte little-endian header length, a JSON header of ``{name: {dtype, shape,
data_offsets}}``, then the bytes (https://github.com/huggingface/safetensors, "Format");
a pickle checkpoint (``torch.save``, a zip archive) is opened with ``torch.load(mmap=True,
weights_only=True)``, which maps the file and reads none of the tensor bytes. Sharded
folders list their files in ``*.index.json``; transformers loads them in sorted order
(``utils/hub.py``, ``get_checkpoint_shard_files``: ``sorted(set(weight_map.values()))``).

`imagine_checkpoint` describes the checkpoint ``save_pretrained`` would write for a model
(built on the meta device): each storage once (tied weights are saved once), shards
filled in order up to ``max_shard_size`` (huggingface_hub ``serialization/_base.py``,
``split_state_dict_into_shards_factory``; transformers 5 saves ``max_shard_size="50GB"``).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torchfit._core.units import format_bytes, parse_bytes

__all__ = [
    "Checkpoint",
    "CheckpointFormat",
    "StoredTensor",
    "imagine_checkpoint",
    "read_checkpoint",
]

#: safetensors dtype names (the header's "dtype") -> torch dtypes.
_SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}  # fmt: skip

#: The default shard size of ``PreTrainedModel.save_pretrained`` in transformers 5.
SAVE_PRETRAINED_SHARD = "50GB"


class CheckpointFormat(enum.StrEnum):
    """How the tensors are serialized."""

    SAFETENSORS = "safetensors"
    PICKLE = "pickle"


@dataclasses.dataclass(frozen=True)
class StoredTensor:
    """One tensor as stored.

    Attributes:
        name: Its key in the state dict.
        dtype: Its dtype on disk.
        numel: Its number of elements.
        file: Index of its file in `Checkpoint.file_bytes`.
        nbytes: Bytes it occupies on disk (0 for a view of a storage already counted).
    """

    name: str
    dtype: torch.dtype
    numel: int
    file: int
    nbytes: int


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """The tensors and files of a checkpoint, in the order a loader reads them.

    Attributes:
        format: safetensors or pickle.
        tensors: Every stored tensor.
        file_bytes: Size on disk of each file, in load order.
        source: The folder or file read, or what the checkpoint was imagined from.

    Example:
        >>> ckpt = imagine_checkpoint(torch.nn.Linear(4, 2), dtype=torch.bfloat16)
        >>> ckpt.tensor_bytes, len(ckpt.file_bytes)
        (20, 1)
    """

    format: CheckpointFormat
    tensors: tuple[StoredTensor, ...]
    file_bytes: tuple[int, ...]
    source: str

    @property
    def tensor_bytes(self) -> int:
        """Bytes of all tensors (each storage once)."""
        return sum(t.nbytes for t in self.tensors)

    def file_tensor_bytes(self) -> list[int]:
        """Tensor bytes held by each file, in load order."""
        per_file = [0] * len(self.file_bytes)
        for tensor in self.tensors:
            per_file[tensor.file] += tensor.nbytes
        return per_file

    def by_name(self) -> dict[str, StoredTensor]:
        """The tensors by state-dict key."""
        return {t.name: t for t in self.tensors}

    def __str__(self) -> str:
        """One line: format, tensors, bytes, files."""
        files = len(self.file_bytes)
        return (
            f"{self.format} checkpoint: {len(self.tensors)} tensors, "
            f"{format_bytes(self.tensor_bytes)} in {files} file{'s' if files > 1 else ''} "
            f"({self.source})"
        )


def _safetensors_header(path: Path) -> dict[str, Any]:
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header: dict[str, Any] = json.loads(handle.read(length))
    header.pop("__metadata__", None)
    return header


def _read_safetensors(files: list[Path]) -> Iterator[StoredTensor]:
    for index, path in enumerate(files):
        for name, info in _safetensors_header(path).items():
            start, stop = info["data_offsets"]
            dtype = _SAFETENSORS_DTYPES.get(info["dtype"])
            if dtype is None:
                raise ValueError(
                    f"{path} stores {name!r} as {info['dtype']!r}, a dtype torchfit does not "
                    f"size; known: {sorted(_SAFETENSORS_DTYPES)}"
                )
            numel = 1
            for size in info["shape"]:
                numel *= int(size)
            yield StoredTensor(name, dtype, numel, index, int(stop) - int(start))


def _read_pickle(files: list[Path]) -> Iterator[StoredTensor]:
    for index, path in enumerate(files):
        # mmap=True maps the file and reads no tensor bytes; weights_only refuses code.
        state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        seen: set[int] = set()
        for name, tensor in _flat(state):
            storage = tensor.untyped_storage()
            first = storage.data_ptr() not in seen
            seen.add(storage.data_ptr())
            nbytes = storage.nbytes() if first else 0
            yield StoredTensor(name, tensor.dtype, tensor.numel(), index, nbytes)


def _flat(state: object, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(state, torch.Tensor):
        yield prefix, state
    elif isinstance(state, dict):
        for key, value in state.items():
            yield from _flat(value, f"{prefix}.{key}" if prefix else str(key))


def _files(path: Path) -> tuple[CheckpointFormat, list[Path]]:
    if path.is_file():
        kind = CheckpointFormat.SAFETENSORS if path.suffix == ".safetensors" else None
        return kind or CheckpointFormat.PICKLE, [path]
    for kind, single in (
        (CheckpointFormat.SAFETENSORS, "model.safetensors"),
        (CheckpointFormat.PICKLE, "pytorch_model.bin"),
    ):
        index = path / f"{single}.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            return kind, [path / name for name in sorted(set(weight_map.values()))]
        if (path / single).is_file():
            return kind, [path / single]
    raise FileNotFoundError(
        f"no checkpoint in {path}: expected model.safetensors, model.safetensors.index.json, "
        "pytorch_model.bin or its index.json; pass a folder written by save_pretrained or a "
        "single .safetensors / torch.save file"
    )


def read_checkpoint(path: str | Path) -> Checkpoint:
    """Describe a checkpoint on disk without loading its weights.

    Args:
        path: A folder written by ``save_pretrained`` (single or sharded, safetensors or
            ``pytorch_model.bin``), or one ``.safetensors`` or ``torch.save`` file.

    Returns:
        A `Checkpoint` with each tensor's dtype and size and each file's size.

    Raises:
        FileNotFoundError: no checkpoint at ``path``.
        ValueError: a safetensors dtype torchfit does not know.

    Example:
        >>> import tempfile, safetensors.torch
        >>> folder = Path(tempfile.mkdtemp())
        >>> safetensors.torch.save_file({"w": torch.zeros(4, 4)}, folder / "model.safetensors")
        >>> read_checkpoint(folder).tensors[0]
        StoredTensor(name='w', dtype=torch.float32, numel=16, file=0, nbytes=64)
    """
    root = Path(path)
    kind, files = _files(root)
    reader = _read_safetensors if kind is CheckpointFormat.SAFETENSORS else _read_pickle
    tensors = tuple(reader(files))
    sizes = tuple(file.stat().st_size for file in files)
    return Checkpoint(kind, tensors, sizes, str(root))


def _stored(model: nn.Module, dtype: torch.dtype | None) -> list[tuple[str, torch.dtype, int]]:
    """``(key, dtype, numel)`` of each tensor ``save_pretrained`` writes: each one once."""
    seen: set[int] = set()
    out = []
    for key, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen:  # a tied weight: one tensor under two keys
            continue
        seen.add(id(tensor))
        stored = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
        out.append((key, stored, tensor.numel()))
    return out


def imagine_checkpoint(
    model: nn.Module,
    *,
    dtype: torch.dtype | None = None,
    format: CheckpointFormat | str = CheckpointFormat.SAFETENSORS,  # noqa: A002 - the word
    max_shard_size: int | str = SAVE_PRETRAINED_SHARD,
) -> Checkpoint:
    """The checkpoint ``save_pretrained`` would write for ``model`` (meta device is enough).

    Args:
        model: The model, usually built on the meta device.
        dtype: The dtype floating tensors are saved in; ``None``: as the model holds them.
        format: ``"safetensors"`` or ``"pickle"``.
        max_shard_size: Largest shard, as in ``save_pretrained``.

    Returns:
        A `Checkpoint` whose files hold the tensors in state-dict order.

    Example:
        >>> model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 256))
        >>> ckpt = imagine_checkpoint(model, max_shard_size=300_000)
        >>> [format_bytes(size) for size in ckpt.file_tensor_bytes()]
        ['257.00 KiB', '257.00 KiB']
    """
    kind = CheckpointFormat(format)
    limit = parse_bytes(max_shard_size)
    tensors: list[StoredTensor] = []
    file, used = 0, 0
    for key, stored, numel in _stored(model, dtype):
        nbytes = numel * stored.itemsize
        if used and used + nbytes > limit:
            file, used = file + 1, 0
        used += nbytes
        tensors.append(StoredTensor(key, stored, numel, file, nbytes))
    per_file = [0] * (file + 1)
    for tensor in tensors:
        per_file[tensor.file] += tensor.nbytes
    return Checkpoint(
        kind, tuple(tensors), tuple(per_file), f"imagined from {type(model).__name__}"
    )
