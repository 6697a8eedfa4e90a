"""Known models, offline: a name gives a transformers config, a meta-device model, a count.

The catalog lives in ``models.json`` beside this file. Each entry reproduces the
architecture fields of a published ``config.json`` (the hub repo id is its ``source``;
GPT-3 175B comes from its paper) and records the exact parameter count of the
transformers class `build_model` builds for it. Nothing here touches the network: a
model that is not in the catalog is described by a local ``config.json`` or by a
transformers config object; only ``resolve_config(..., hub=True)`` (torchfit.quantize,
`plan_device_map`) reads a Hub id the catalog lacks (`torchfit.memory.catalog.hub`).

Which head is counted (it changes the count):

- ``causal-lm`` entries build ``AutoModelForCausalLM`` (the LM head included; tied to
  the input embedding for GPT-2/GPT-3 and counted once, untied for Llama, Mistral, Qwen
  and Phi).
- ``encoder`` entries (BERT) build ``AutoModel``: the encoder and its pooler, without
  pre-training heads.
- ``vision`` and ``cnn`` entries build ``AutoModelForImageClassification`` with the
  checkpoint's classification head (1000 ImageNet classes; 1001 for MobileNetV2).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from torchfit._core.units import DType, parse_dtype
from torchfit.memory.catalog.build import instantiate, model_class_for, model_dtype
from torchfit.memory.catalog.entries import ModelTask, _transformers, model_entry
from torchfit.memory.catalog.hub import is_hub_id, load_config, looks_like_path

if TYPE_CHECKING:
    from transformers import PretrainedConfig

__all__ = ["build_model", "is_vision", "model_config", "resolve_config", "vision_input_shape"]

#: dtypes a module can be built in; quantized formats need torchfit.quantize.
_BUILD_DTYPES = frozenset({DType.FP64, DType.FP32, DType.TF32, DType.FP16, DType.BF16})


def model_config(model: str | os.PathLike[str] | PretrainedConfig) -> PretrainedConfig:
    """A transformers config from a catalog name, a local config.json, or a config.

    Offline: catalog configs come from the data file, local files are read with
    ``local_files_only=True``, and remote code is never run.

    Args:
        model: A catalog name or alias (see `model_entry`), the path of a
            ``config.json`` or of a folder holding one (as ``save_pretrained`` writes
            it), or a transformers ``PretrainedConfig`` (returned as is).

    Returns:
        A new config object for names and paths (changing it changes nothing here).

    Raises:
        ImportError: transformers is not installed (``pip install 'torchfit[hf]'``).
        FileNotFoundError: a path was given and holds no config.json.
        ValueError: an unknown or ambiguous name (close matches are listed), or a
            config.json that transformers cannot read.
        TypeError: ``model`` is none of the above.

    Example:
        >>> config = model_config("GPT-2")
        >>> type(config).__name__, config.n_layer, config.n_embd
        ('GPT2Config', 12, 768)
        >>> model_config("llama-3-70b").num_key_value_heads
        8
    """
    transformers = _transformers()
    if isinstance(model, transformers.PretrainedConfig):
        return cast("PretrainedConfig", model)
    if isinstance(model, os.PathLike):
        return _load_local(Path(model))
    if not isinstance(model, str):
        raise TypeError(
            "expected a catalog name, a config.json path or a transformers config; "
            f"got {type(model).__name__}"
        )
    path = Path(model).expanduser()
    if path.is_file() or (path / "config.json").is_file():
        return _load_local(path)
    try:
        entry = model_entry(model)
    except ValueError:
        if looks_like_path(model):
            return _load_local(path)  # raises FileNotFoundError naming the path
        raise
    return entry.config()


def _load_local(path: Path) -> PretrainedConfig:
    transformers = _transformers()
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(
            f"no config.json at {str(path)!r}; pass a config.json file or a folder holding one "
            "(config.save_pretrained(folder) writes it), or a catalog name such as 'gpt2'"
        )
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{str(file)!r} is not a JSON config file: {error}") from error
    model_type = data.get("model_type") if isinstance(data, dict) else None
    if not model_type:
        raise ValueError(
            f"{str(file)!r} has no 'model_type'; transformers needs it to pick the config "
            'class: add e.g. "model_type": "llama"'
        )
    if model_type not in transformers.CONFIG_MAPPING:
        raise ValueError(
            f"{str(file)!r}: model_type {model_type!r} is unknown to transformers "
            f"{transformers.__version__}; upgrade transformers (torchfit never runs a "
            "model's remote code)"
        )
    target = file.parent if file.name == "config.json" else file
    try:
        config = transformers.AutoConfig.from_pretrained(str(target), local_files_only=True)
    except (OSError, ValueError, TypeError) as error:
        raise ValueError(f"transformers could not read {str(file)!r}: {error}") from error
    return cast("PretrainedConfig", config)


def build_model(
    model: str | os.PathLike[str] | PretrainedConfig,
    *,
    device: str | torch.device = "meta",
    dtype: str | torch.dtype | DType | None = None,
    task: str | ModelTask | None = None,
) -> nn.Module:
    """Build the transformers model for a name, config.json or config, by default on meta.

    On the meta device the parameters have shapes and dtypes but no storage, so even
    a 70B model builds in well under a second with no memory. The class is the one the
    config's ``architectures`` names (catalog entries record the class their count
    refers to, see the module docstring); otherwise it follows from ``task`` or from
    the ``model_type`` (image classification, causal LM, else the base model).

    Args:
        model: Anything `model_config` accepts. A given config is copied, not changed.
        device: Where to build; ``"meta"`` allocates nothing, any other device
            allocates and initializes real weights.
        dtype: Parameter dtype (``"bf16"``, ``torch.float16``...). ``None`` means the
            dtype the config records (the published weights' dtype for catalog
            entries), else torch's default dtype.
        task: Overrides the class choice: ``"causal-lm"`` (with the LM head),
            ``"encoder"`` (base model), ``"vision"``/``"cnn"`` (image classification).

    Returns:
        The model (``nn.Module``). On meta it is built without weight initialisation
        (there is nothing to initialise) and with its embeddings tied, as
        `torchfit.memory.catalog.build.instantiate` does for every torchfit build;
        elsewhere, in the state its constructor leaves it.

    Raises:
        ImportError: transformers is not installed (``pip install 'torchfit[hf]'``).
        ValueError: an unknown name or task, or a quantized ``dtype`` (int8/4-bit
            weights are loaded with torchfit.quantize, not built here).

    Example:
        >>> model = build_model("gpt2")
        >>> type(model).__name__, next(model.parameters()).device
        ('GPT2LMHeadModel', device(type='meta'))
        >>> from torchfit.memory import count_parameters
        >>> count_parameters(model)
        124439808
        >>> next(build_model("llama-3-8b").parameters()).dtype
        torch.bfloat16
    """
    config = model_config(model)
    chosen = model_dtype(config, _build_dtype(dtype))
    return instantiate(config, model_class_for(config, task=task), chosen, device=device)


def _build_dtype(dtype: str | torch.dtype | DType | None) -> torch.dtype | None:
    """``dtype`` checked for an unquantized build (``None``: the config's own)."""
    if dtype is None:
        return None
    parsed = parse_dtype(dtype)
    if parsed not in _BUILD_DTYPES:
        raise ValueError(
            f"build_model builds unquantized modules in fp64, fp32, fp16 or bf16; got "
            f"{dtype!r}. Load int8/4-bit weights with torchfit.quantize, or pass the "
            "dtype to a memory estimate instead"
        )
    return parsed.torch_dtype


def resolve_config(model: Any, *, hub: bool = False) -> Any:
    """A transformers config from a config, a transformers model, a name or a folder.

    The one model resolver of torchfit: `model_config` for names and paths (offline),
    and with ``hub=True`` a Hub id the catalog lacks (``"org/name"``) is read with
    ``AutoConfig`` from the network or the Hugging Face cache (`load_config`).

    Raises:
        ValueError: an unknown name (the catalog's error, with close matches).
        FileNotFoundError: a path with no config.json.
        OSError: ``hub=True`` and the Hub could not give the config.

    Example:
        >>> resolve_config("gpt2").n_layer
        12
    """
    if hasattr(model, "model_type") and hasattr(model, "to_dict"):
        return model  # a transformers config
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "model_type"):
        return config  # a transformers model: its config describes it
    try:
        return model_config(model)
    except ValueError:
        if hub and isinstance(model, str) and is_hub_id(model):
            return load_config(model, {})
        raise


def is_vision(config: Any) -> bool:
    """Whether a config describes an image model (it has channels or an image size)."""
    return hasattr(config, "num_channels") or hasattr(config, "image_size")


def vision_input_shape(config: Any) -> tuple[int, int, int]:
    """One image as the config describes it: ``(num_channels, image_size, image_size)``.

    Example:
        >>> from transformers import ResNetConfig
        >>> vision_input_shape(ResNetConfig())
        (3, 224, 224)
    """
    size = getattr(config, "image_size", 224)
    size = size[0] if isinstance(size, list | tuple) else size
    return (int(getattr(config, "num_channels", 3)), int(size), int(size))
