"""Known models, offline: a name or a config gives a transformers config, a meta model, a count."""

from torchfit.memory.catalog.count import count_parameters
from torchfit.memory.catalog.entries import ModelEntry, ModelTask, list_models, model_entry
from torchfit.memory.catalog.resolve import build_model, model_config

__all__ = [
    "ModelEntry",
    "ModelTask",
    "build_model",
    "count_parameters",
    "list_models",
    "model_config",
    "model_entry",
]
