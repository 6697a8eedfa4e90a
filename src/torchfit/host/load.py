"""`load_memory`: how much host RAM getting a model loaded takes, before loading it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torchfit._core.units import DType
from torchfit.host.checkpoint import (
    SAVE_PRETRAINED_SHARD,
    Checkpoint,
    CheckpointFormat,
    imagine_checkpoint,
    read_checkpoint,
)
from torchfit.host.loading import predict_load
from torchfit.host.result import LoadMemory
from torchfit.host.spec import LoadMethod, LoadSpec

__all__ = ["load_memory", "meta_module"]


def meta_module(model: Any) -> nn.Module:
    """The model on the meta device: a module as given, else built by `torchfit.memory`.

    ``model`` may be a catalog name, a Hub id, a transformers config or a folder holding
    ``config.json`` (a checkpoint folder); it is built in the dtype its config records.
    """
    if isinstance(model, nn.Module):
        return model
    from torchfit.memory.catalog import build_model  # noqa: PLC0415 - transformers loads on use

    return build_model(str(model) if isinstance(model, Path) else model)


def _checkpoint_of(
    model: nn.Module,
    checkpoint: Checkpoint | str | Path | None,
    *,
    source: Any,
    checkpoint_dtype: torch.dtype | DType | str | None,
    checkpoint_format: CheckpointFormat | str,
    max_shard_size: int | str,
) -> Checkpoint:
    if isinstance(checkpoint, Checkpoint):
        return checkpoint
    if checkpoint is not None:
        if not Path(checkpoint).exists():
            raise ValueError(
                f"checkpoint {str(checkpoint)!r} does not exist; pass a checkpoint folder or "
                "file, or None to imagine the one save_pretrained would write"
            )
        return read_checkpoint(checkpoint)
    if isinstance(source, str | Path) and Path(source).is_dir():
        try:
            return read_checkpoint(source)
        except FileNotFoundError:
            pass  # a config folder without weights: imagine them
    stored = None if checkpoint_dtype is None else LoadSpec(dtype=checkpoint_dtype).torch_dtype
    return imagine_checkpoint(
        model, dtype=stored, format=checkpoint_format, max_shard_size=max_shard_size
    )


def load_memory(
    model: Any,
    checkpoint: Checkpoint | str | Path | None = None,
    *,
    method: LoadMethod | str = LoadMethod.FROM_PRETRAINED,
    dtype: torch.dtype | DType | str | None = None,
    mmap: bool = True,
    bits: int | None = None,
    double_quant: bool = True,
    skip_modules: Iterable[str] = (),
    device_map: str | Mapping[str, str | int] | None = None,
    checkpoint_dtype: torch.dtype | DType | str | None = None,
    checkpoint_format: CheckpointFormat | str = CheckpointFormat.SAFETENSORS,
    max_shard_size: int | str = SAVE_PRETRAINED_SHARD,
) -> LoadMemory:
    """Predict the peak host RSS of loading a model, and what stays, by load path.

    Nothing is loaded: the model is built on the meta device and the checkpoint is
    described from its headers (or imagined as ``save_pretrained`` would write it).

    Args:
        model: A catalog name (``"llama-3.1-8b"``), a Hub id, a transformers config, a
            checkpoint folder, or an ``nn.Module`` (the meta device is enough).
        checkpoint: A checkpoint folder or file, or a `Checkpoint`; ``None``: the folder
            ``model`` names if it holds one, else the one ``save_pretrained`` would write.
        method: ``"from_pretrained"``, ``"torch.load"``, ``"load_state_dict"`` or
            ``"assign"`` (`LoadMethod`).
        dtype: The dtype to load in (``from_pretrained(dtype=...)``; the model's build
            dtype for ``load_state_dict``). ``None``: the config's (transformers 5's
            ``"auto"``).
        mmap: Memory-map the checkpoint (``from_pretrained``'s default;
            ``torch.load(mmap=...)``).
        bits: Quantize to 4 or 8 bits with bitsandbytes while loading.
        double_quant: 4-bit double quantization.
        skip_modules: Modules left unquantized beyond the default skip list.
        device_map: ``"cpu"``, ``"cuda"``/``"auto"`` (all on the GPU) or a mapping.
        checkpoint_dtype: The stored dtype of an imagined checkpoint (``None``: the
            model's).
        checkpoint_format: ``"safetensors"`` or ``"pickle"`` for an imagined checkpoint.
        max_shard_size: Shard size of an imagined checkpoint.

    Returns:
        A `LoadMemory`: the peak by kind (anonymous, file-backed, transient), what the
        loaded model holds, and what it holds once every weight was read.

    Raises:
        ValueError: an option that does not belong to the method, an unknown device.
        ValueError: ``checkpoint`` does not exist.
        FileNotFoundError: ``checkpoint`` is a folder without a checkpoint.

    Example:
        >>> from transformers import LlamaConfig
        >>> config = LlamaConfig(hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
        ...                      num_attention_heads=8, vocab_size=1000, dtype="float32")
        >>> cast = load_memory(config, dtype="bf16")  # fp32 on disk -> bf16 in memory
        >>> f"{cast.anon_at_peak / 2**20:.1f} MiB made, {cast.file_at_peak / 2**20:.1f} MiB read"
        '12.0 MiB made, 23.9 MiB read'
        >>> load_memory(config).after < 2**25  # same dtype: views of the map, read on use
        True
    """
    pretrained = str(method) == LoadMethod.FROM_PRETRAINED.value
    if pretrained and dtype is None and checkpoint is None and checkpoint_dtype is not None:
        dtype = checkpoint_dtype  # "auto": the dtype save_pretrained records in config.json
    spec = LoadSpec(
        method=method,
        dtype=dtype,
        mmap=mmap,
        bits=bits,
        double_quant=double_quant,
        skip_modules=tuple(skip_modules),
        device_map=device_map,
    )
    # built in the config's dtype: what is stored; `dtype` is applied per tensor on load
    built = meta_module(model)
    ckpt = _checkpoint_of(
        built,
        checkpoint,
        source=model,
        checkpoint_dtype=checkpoint_dtype,
        checkpoint_format=checkpoint_format,
        max_shard_size=max_shard_size,
    )
    return predict_load(built, ckpt, spec)
