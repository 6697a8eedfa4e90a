"""The one model resolver: whatever a user names, to a config (or a module) to plan.

`resolve_model` tries, in this order:

1. a transformers config object, or an ``nn.Module`` (a transformers model brings its
   config; any other module is planned from a meta-device pass);
2. a local folder holding ``config.json``, or the file itself;
3. ``"torchvision/<name>"`` and ``"timm/<name>"``: the library's model, built on meta;
4. the embedded catalog (``models.json``): its names and the Hub ids of its entries,
   so the common models work offline with nothing downloaded;
5. a Hub id (``"org/name"``) in the local Hugging Face cache;
6. the Hub itself: ``config.json`` only, never weights (`torchfit.memory.catalog.hub`;
   ``HF_HUB_OFFLINE``, ``HF_HOME``/``HF_HUB_CACHE`` and ``HF_TOKEN`` apply).

A ``model_type`` transformers does not know is read with the repository's own code
only with ``trust_remote_code=True``. `estimate`, `fits`, `plan_device_map`,
`torchfit.quantize` and the ``torchfit`` command all resolve through here.

Which head the catalog counts (it changes the count): ``causal-lm`` entries build
``AutoModelForCausalLM`` (the LM head, tied or not, counted once); ``seq2seq`` and
``speech-seq2seq`` entries the model with its LM head (T5, BART, Whisper); ``encoder``
entries (BERT, RoBERTa, DeBERTa) ``AutoModel``, the encoder without pre-training heads;
``vision`` and ``cnn`` entries the image classifier of the checkpoint.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from torchfit._core import checks
from torchfit._core.hardware import parse_device
from torchfit._core.units import DType, parse_dtype
from torchfit.memory.catalog.build import instantiate, model_class_for, model_dtype
from torchfit.memory.catalog.classic import CLASSICS
from torchfit.memory.catalog.entries import ModelEntry, ModelTask, _transformers, close_names
from torchfit.memory.catalog.entries import model_entry as _model_entry
from torchfit.memory.catalog.hub import HubError, HubOptions, hub_config, hub_error, is_hub_id
from torchfit.memory.catalog.hub import looks_like_path as _looks_like_path
from torchfit.memory.catalog.local import read_config
from torchfit.memory.catalog.zoo import is_zoo_name, zoo_model

if TYPE_CHECKING:
    from transformers import PretrainedConfig

__all__ = [
    "Resolved",
    "build_model",
    "is_vision",
    "model_config",
    "resolve_config",
    "resolve_model",
    "vision_input_shape",
]

#: dtypes a module can be built in; quantized formats need torchfit.quantize.
_BUILD_DTYPES = frozenset({DType.FP64, DType.FP32, DType.TF32, DType.FP16, DType.BF16})


@dataclasses.dataclass(frozen=True)
class Resolved:
    """What a model name, path, config or module resolved to.

    Attributes:
        config: The transformers config, or ``None`` for a plain ``nn.Module`` (LeNet,
            AlexNet, torchvision and timm models, a module of the user's).
        module: The module itself when one was given or built (on the meta device for
            names), else ``None``: a config is built when needed.
        source: Where it came from: ``"config"``, ``"module"``, ``"folder"``,
            ``"catalog"``, ``"cache"`` (the Hugging Face cache), ``"hub"``,
            ``"torchvision"`` or ``"timm"``.
        input_shape: One sample as the model expects it (an image), when known.
    """

    config: Any
    module: nn.Module | None
    source: str
    input_shape: tuple[int, ...] | None = None


def resolve_model(
    model: Any,
    *,
    trust_remote_code: bool = False,
    hub: bool = True,
    options: HubOptions | None = None,
) -> Resolved:
    """Resolve anything a user may name as a model (module docstring: the order).

    Args:
        model: A transformers config or model, any ``nn.Module``, a folder or
            config.json path, ``"torchvision/<name>"``, ``"timm/<name>"``, a catalog name
            or alias, or a Hugging Face Hub id (``"meta-llama/Llama-3.1-8B"``).
        trust_remote_code: Read a ``model_type`` transformers does not know with the
            repository's own code (it runs that code on this machine).
        hub: Look Hub ids up in the Hugging Face cache and on the Hub; ``False`` keeps
            to the catalog and local paths.
        options: Revision, token, cache folder, ``local_files_only`` for Hub ids.

    Raises:
        TypeError: ``model`` is none of the above.
        ValueError: an empty, unknown or ambiguous name (close catalog names listed); an
            unknown ``model_type`` without ``trust_remote_code``; a bad config.json.
        FileNotFoundError: a path with no config.json.
        torchfit.memory.catalog.hub.HubError: a Hub id that could not be read (offline,
            gated, private, unknown); it is a ``ValueError`` too.
        ImportError: transformers, or the torchvision/timm a name needs, is missing.

    Example:
        >>> resolve_model("meta-llama/Llama-2-7b-hf").source
        'catalog'
        >>> resolve_model("alexnet").input_shape
        (3, 227, 227)
    """
    options = dataclasses.replace(
        options or HubOptions(),
        trust_remote_code=trust_remote_code or (options is not None and options.trust_remote_code),
    )
    if hasattr(model, "model_type") and hasattr(model, "to_dict"):
        return Resolved(model, None, "config")
    if isinstance(model, nn.Module):
        config = getattr(model, "config", None)
        return Resolved(config if hasattr(config, "model_type") else None, model, "module")
    if isinstance(model, os.PathLike):
        config = read_config(Path(model), trust_remote_code=options.trust_remote_code)
        return Resolved(config, None, "folder")
    if not isinstance(model, str):
        raise TypeError(
            "a model is a name ('llama-3.1-8b', 'meta-llama/Llama-3.1-8B'), a config.json "
            "path, a transformers config or an nn.Module; got "
            f"{type(model).__name__} {model!r:.60}"
        )
    return _resolve_name(model, options, hub=hub)


def _resolve_name(model: str, options: HubOptions, *, hub: bool) -> Resolved:
    """Steps 2 to 6 for a string: folder, library name, catalog, cache, Hub."""
    name = model.strip()
    if not name:
        _model_entry(model)  # the error for an empty name
    path = Path(name).expanduser()
    if path.is_file() or (path / "config.json").is_file():
        return Resolved(
            read_config(path, trust_remote_code=options.trust_remote_code), None, "folder"
        )
    if is_zoo_name(name):
        module, shape = zoo_model(name)
        return Resolved(None, module, name.partition("/")[0].lower(), shape)
    try:
        return _from_entry(_model_entry(name))
    except ValueError:
        if _looks_like_path(name):
            read_config(path)  # raises FileNotFoundError naming the path
        if not (hub and is_hub_id(name)):
            raise
    try:  # the Hub's error names the close catalog entries instead of the catalog's
        config, source = hub_config(name, options)
    except HubError as error:
        cause = error.__cause__ or error
        raise hub_error(name, cause, close=", ".join(close_names(name))) from cause
    return Resolved(config, None, source)


def _from_entry(entry: ModelEntry) -> Resolved:
    if entry.builder is None:
        return Resolved(entry.config(), None, "catalog", entry.input_shape)
    with torch.device("meta"):
        module = CLASSICS[entry.builder]()
    return Resolved(None, module, "catalog", entry.input_shape)


@checks.arguments(model=checks.model_ref())
def model_config(
    model: str | os.PathLike[str] | PretrainedConfig, *, trust_remote_code: bool = False
) -> PretrainedConfig:
    """A transformers config from a name, a Hub id, a local config.json, or a config.

    `resolve_model`, keeping the config: catalog configs come from the data file, local
    files are read with ``local_files_only=True``, Hub ids from the Hugging Face cache
    or the Hub (config.json only).

    Raises:
        ImportError: transformers is not installed (``pip install 'torchfit[hf]'``).
        FileNotFoundError: a path was given and holds no config.json.
        ValueError: an unknown or ambiguous name (close matches are listed), a Hub id
            that could not be read, a config.json that transformers cannot read, or a
            model without a transformers config (LeNet, torchvision and timm names).
        TypeError: ``model`` is none of the above.

    Example:
        >>> config = model_config("GPT-2")
        >>> type(config).__name__, config.n_layer, config.n_embd
        ('GPT2Config', 12, 768)
        >>> model_config("llama-3-70b").num_key_value_heads
        8
    """
    _transformers()
    resolved = resolve_model(model, trust_remote_code=trust_remote_code)
    if resolved.config is None:
        raise ValueError(
            f"{model!r} is a plain torch model without a transformers config; "
            f"build_model({model!r}) builds it and estimate({model!r}, ...) plans it"
        )
    return cast("PretrainedConfig", resolved.config)


def resolve_config(model: Any, *, hub: bool = True, trust_remote_code: bool = False) -> Any:
    """A transformers config from a config, a transformers model, a name, a folder or a Hub id.

    `resolve_model`, for callers that need transformers (the device-map planner,
    torchfit.quantize); ``hub=False`` keeps to the catalog and local paths.

    Raises:
        TypeError: a plain ``nn.Module`` or a model without a transformers config.
        ValueError, FileNotFoundError: as `resolve_model` (a `HubError` is both a
            ``ValueError`` and an ``OSError``).

    Example:
        >>> resolve_config("gpt2").n_layer
        12
    """
    resolved = resolve_model(model, hub=hub, trust_remote_code=trust_remote_code)
    if resolved.config is None:
        what = type(model).__name__ if isinstance(model, nn.Module) else repr(model)
        raise TypeError(
            f"expected a catalog name, a config.json path or a transformers config; got "
            f"{what}, which has no transformers config (plan it with estimate(model, "
            "input_shape=...))"
        )
    return resolved.config


@checks.arguments(model=checks.model_ref(), device=checks.parsed(parse_device, kinds=(str,)))
def build_model(
    model: Any,
    *,
    device: str | torch.device = "meta",
    dtype: str | torch.dtype | DType | None = None,
    task: str | ModelTask | None = None,
) -> nn.Module:
    """Build the model for a name, Hub id, config.json or config, by default on meta.

    On the meta device the parameters have shapes and dtypes but no storage, so even
    a 70B model builds in well under a second with no memory. The class is the one the
    config's ``architectures`` names (catalog entries record the class their count
    refers to, see the module docstring); otherwise it follows from ``task`` or from
    the ``model_type`` (image classification, causal LM, sequence-to-sequence LM, else
    the base model). LeNet/AlexNet and torchvision/timm names build their own module.

    Args:
        model: Anything `resolve_model` accepts. A given config is copied, not changed.
        device: Where to build; ``"meta"`` allocates nothing, any other device
            allocates and initializes real weights (torchvision/timm: meta only).
        dtype: Parameter dtype (``"bf16"``, ``torch.float16``...). ``None`` means the
            dtype the config records (the published weights' dtype for catalog
            entries), else torch's default dtype.
        task: Overrides the class choice: ``"causal-lm"`` (with the LM head),
            ``"seq2seq"``, ``"encoder"`` (base model), ``"vision"``/``"cnn"``.

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
        >>> from torchfit.memory.catalog import count_parameters
        >>> count_parameters(model)
        124439808
        >>> next(build_model("llama-3-8b").parameters()).dtype
        torch.bfloat16
    """
    if isinstance(model, str) and not is_zoo_name(model):
        entry = _entry_or_none(model)
        if entry is not None and entry.builder is not None:
            with torch.device(device):
                built = CLASSICS[entry.builder]()
            return built.to(_build_dtype(dtype) or torch.get_default_dtype())
    resolved = resolve_model(model)
    if resolved.config is None and resolved.module is not None:
        if torch.device(device).type != "meta":
            raise ValueError(f"{model!r} builds on the meta device only; pass device='meta'")
        chosen = _build_dtype(dtype)
        return resolved.module if chosen is None else resolved.module.to(chosen)
    config = resolved.config
    chosen_dtype = model_dtype(config, _build_dtype(dtype))
    return instantiate(config, model_class_for(config, task=task), chosen_dtype, device=device)


def _entry_or_none(name: str) -> ModelEntry | None:
    try:
        return _model_entry(name)
    except ValueError:
        return None


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
