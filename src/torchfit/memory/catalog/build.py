"""The one model builder: which transformers class, which dtype, and the build itself.

`build_model` (`torchfit.memory.catalog`), the device-map planner and `torchfit.quantize`
(its footprints and `load_quantized`'s class) all build through `model_class_for` and
`instantiate`, so the class and the module names they see are the same.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
from collections.abc import Iterator
from typing import Any, cast

import torch
from torch import nn

from torchfit._core.units import DType, parse_dtype
from torchfit.memory.catalog.entries import (
    ModelTask,
    _parse_task,
    _transformers,
    _transformers_major,
)

__all__ = [
    "AUTO_CLASS",
    "checkpointing_on",
    "experts_on_fake_tensors",
    "one_sequence_per_row",
    "transformers_without_data",
    "instantiate",
    "model_class_for",
    "model_dtype",
    "recorded_dtype",
]

#: The Auto class each task builds.
AUTO_CLASS: dict[ModelTask, str] = {
    ModelTask.CAUSAL_LM: "AutoModelForCausalLM",
    ModelTask.ENCODER: "AutoModel",
    ModelTask.SEQ2SEQ: "AutoModelForSeq2SeqLM",
    ModelTask.SPEECH: "AutoModelForSpeechSeq2Seq",
    ModelTask.VISION: "AutoModelForImageClassification",
    ModelTask.CNN: "AutoModelForImageClassification",
}


def model_class_for(
    config: Any, model_class: Any = None, *, task: str | ModelTask | None = None
) -> Any:
    """The class to build or load a config with.

    In order: ``model_class`` when given; the Auto class of ``task``; the class the
    config's ``architectures`` names (the class a checkpoint was saved from); else the
    Auto class its ``model_type`` implies: image classification for vision models, a
    causal LM for decoders, a sequence-to-sequence LM for encoder-decoders (T5, BART,
    and Whisper's speech-to-text), the base model (``AutoModel``) for encoders such as
    BERT.

    Raises:
        ValueError: an unknown ``task``.

    Example:
        >>> from transformers import BertConfig, GPT2Config
        >>> model_class_for(GPT2Config(architectures=["GPT2LMHeadModel"])).__name__
        'GPT2LMHeadModel'
        >>> model_class_for(BertConfig()).__name__, model_class_for(GPT2Config()).__name__
        ('AutoModel', 'AutoModelForCausalLM')
    """
    if model_class is not None:
        return model_class
    transformers = _transformers()
    if task is not None:
        return getattr(transformers, AUTO_CLASS[_parse_task(task)])
    architectures = getattr(config, "architectures", None) or []
    if architectures and isinstance(architectures[0], str):
        try:
            cls: Any = getattr(transformers, architectures[0], None)
        except (ImportError, AttributeError):  # a class whose backend is missing
            cls = None
        if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel):
            return cls
    return getattr(transformers, AUTO_CLASS[_infer_task(config)])


def _infer_task(config: Any) -> ModelTask:
    """The class family for a config without a usable ``architectures`` entry."""
    from transformers.models.auto import modeling_auto  # noqa: PLC0415 - optional dependency

    model_type = config.model_type
    if model_type in modeling_auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES:
        return ModelTask.VISION
    if model_type in modeling_auto.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES:
        return ModelTask.SPEECH
    if model_type in modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES:
        return ModelTask.SEQ2SEQ
    # Encoders such as BERT also have a causal-LM class; a masked-LM class marks them.
    if (
        model_type in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        and model_type not in modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES
    ):
        return ModelTask.CAUSAL_LM
    return ModelTask.ENCODER


def recorded_dtype(config: Any) -> torch.dtype | None:
    """The floating dtype a config records for its weights (``dtype``; 4.x: ``torch_dtype``).

    Example:
        >>> from transformers import LlamaConfig
        >>> recorded_dtype(LlamaConfig(dtype="bfloat16")), recorded_dtype(LlamaConfig())
        (torch.bfloat16, None)
    """
    field = "dtype" if _transformers_major(_transformers()) >= 5 else "torch_dtype"
    recorded = getattr(config, field, None)
    if isinstance(recorded, str):
        recorded = getattr(torch, recorded, None)  # "bfloat16" -> torch.bfloat16; "auto" -> None
    if isinstance(recorded, torch.dtype) and recorded.is_floating_point:
        return recorded
    return None


def model_dtype(config: Any, given: Any = None) -> torch.dtype:
    """The dtype unquantized modules get: ``given``, else the config's, else torch's default.

    ``given`` may be a ``torch.dtype``, anything `parse_dtype` reads, or ``None`` /
    ``"auto"`` for the config's own dtype (what ``from_pretrained(dtype=...)`` does).

    Example:
        >>> from transformers import LlamaConfig
        >>> model_dtype(LlamaConfig(dtype="float16")), model_dtype(LlamaConfig(), "bf16")
        (torch.float16, torch.bfloat16)
    """
    if isinstance(given, torch.dtype):
        return given
    if given is not None and given != "auto":
        return parse_dtype(given if isinstance(given, DType) else str(given)).torch_dtype
    return recorded_dtype(config) or torch.get_default_dtype()


def instantiate(
    config: Any, model_class: Any, dtype: torch.dtype, *, device: str | torch.device = "meta"
) -> nn.Module:
    """Build ``model_class`` from a copy of ``config`` in ``dtype`` on ``device``.

    On the meta device (the default) weight initialisation is switched off
    (transformers' own ``no_init_weights``, as ``from_pretrained`` does): on meta tensors
    it computes nothing, yet the init calls were 60% of the build (87M-parameter Llama:
    5.6 ms with them, 2.2 ms without). The skipped ``init_weights`` also ties the
    embeddings, so that is done here. Any other device gets initialised weights.

    Example:
        >>> from transformers import GPT2Config
        >>> config = GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64)
        >>> model = instantiate(config, model_class_for(config), torch.float16)
        >>> model.lm_head.weight is model.transformer.wte.weight, model.lm_head.weight.device
        (True, device(type='meta'))
    """
    config = copy.deepcopy(config)  # building a model may write to its config
    on_meta = torch.device(device).type == "meta"
    kwarg = "dtype" if _transformers_major(_transformers()) >= 5 else "torch_dtype"
    build = getattr(model_class, "_from_config", None) or model_class.from_config
    skip_init = _no_init_weights() if on_meta else contextlib.nullcontext()
    with skip_init, torch.device(device):
        model = build(config, **{kwarg: dtype})
    if not isinstance(model, nn.Module):  # pragma: no cover - transformers always returns one
        raise TypeError(f"transformers built a {type(model).__name__}, not an nn.Module")
    tie = getattr(model, "tie_weights", None)
    if on_meta and callable(tie):  # init_weights ties them, and it was skipped
        tie()
    return model


def _no_init_weights() -> contextlib.AbstractContextManager[object]:
    """Transformers' weight-init switch-off (5.x: ``initialization``, 4.x: ``modeling_utils``)."""
    for module in ("transformers.initialization", "transformers.modeling_utils"):
        try:
            context = getattr(importlib.import_module(module), "no_init_weights", None)
        except ImportError:
            continue
        if context is not None:
            return cast("contextlib.AbstractContextManager[object]", context())
    return contextlib.nullcontext()


@contextlib.contextmanager
def experts_on_fake_tensors() -> Iterator[None]:
    """Run transformers' mixture-of-experts layers with an op that meta and fake tensors take.

    transformers 5 runs experts with ``torch.nn.functional.grouped_mm``, whose meta and
    fake kernels demand bf16 on CPU (fp32 raises "Expected inputs of BF16 type"), while
    the real CPU kernel takes fp32. Inside this context its own fallback op
    (``transformers::grouped_mm_fallback``, one matmul per expert into one output, with
    a fake kernel for every dtype) runs instead: it allocates the same tensors (measured:
    the same CPU peak, byte for byte, on a 2-layer Mixtral) and meta/fake tensors take
    it. Does nothing on transformers without the dispatcher.
    """
    try:
        moe = importlib.import_module("transformers.integrations.moe")
    except ImportError:
        yield
        return
    original = getattr(moe, "_can_use_grouped_mm", None)
    if original is None:
        yield
        return

    def fake_friendly(input: Any, weight: Any, offs: Any) -> bool:  # noqa: A002 - its signature
        fake = any(t.device.type == "meta" or _is_fake(t) for t in (input, weight))
        return False if fake else bool(original(input, weight, offs))

    setattr(moe, "_can_use_grouped_mm", fake_friendly)  # noqa: B010 - a private hook
    try:
        yield
    finally:
        setattr(moe, "_can_use_grouped_mm", original)  # noqa: B010


@contextlib.contextmanager
def one_sequence_per_row() -> Iterator[None]:
    """Read a data-free batch as one sequence per row, as transformers reads a real one.

    transformers' mask builder looks for sequences packed into one row by reading the
    position ids (``masking_utils.find_packed_sequence_indices``: ``.all()`` on a tensor).
    On meta tensors that read raises; on fake tensors transformers takes itself to be
    traced and keeps the packed mask, so it builds a 4-D mask and SDPA repeats the keys
    and values of grouped-query attention (``repeat_kv``), which the real run does not
    (on an H200: 32 such copies more at a Llama-3.2-1B step's peak, +2.3%). A planned or
    traced batch holds one sequence per row, the real run's answer: ``None``.
    """
    try:
        masking = importlib.import_module("transformers.masking_utils")
    except ImportError:
        yield
        return
    original = getattr(masking, "find_packed_sequence_indices", None)
    if original is None:
        yield
        return

    def unpacked_without_data(position_ids: Any) -> Any:
        if position_ids.device.type == "meta" or _is_fake(position_ids):
            return None
        return original(position_ids)

    setattr(masking, "find_packed_sequence_indices", unpacked_without_data)  # noqa: B010
    try:
        yield
    finally:
        setattr(masking, "find_packed_sequence_indices", original)  # noqa: B010


@contextlib.contextmanager
def transformers_without_data() -> Iterator[None]:
    """Run transformers' models on meta or fake tensors, as on data.

    `experts_on_fake_tensors` and `one_sequence_per_row` together, for every data-free
    pass (the meta-device pass, the trace, the step-time recorder).
    """
    with experts_on_fake_tensors(), one_sequence_per_row():
        yield


def _is_fake(tensor: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor  # noqa: PLC0415

    return isinstance(tensor, FakeTensor)


def checkpointing_on(module: Any) -> None:
    """Turn on a transformers model's activation (gradient) checkpointing.

    transformers 5 names it ``activation_checkpointing_enable`` and warns that
    ``gradient_checkpointing_enable`` will go in v6 (modeling_utils.py); older releases
    have the second only. Either way the model recomputes each block in backward.

    Raises:
        ValueError: ``module`` has neither method (not a transformers model).
    """
    enable = getattr(module, "activation_checkpointing_enable", None)
    enable = enable or getattr(module, "gradient_checkpointing_enable", None)
    if enable is None:
        raise ValueError(
            f"gradient checkpointing needs a transformers model; {type(module).__name__} has "
            "no activation_checkpointing_enable() or gradient_checkpointing_enable()"
        )
    enable()
