"""Models by name: a name, a Hub id, a config or a folder to a config, a meta model, a count.

`resolve_model` is the one resolver (config or module, local folder, torchvision/timm
names, the embedded catalog, the Hugging Face cache, the Hub); `list_models` and
`search_models` show the catalog.
"""

from torchfit.memory.catalog.count import count_parameters
from torchfit.memory.catalog.entries import (
    ModelEntry,
    ModelTask,
    list_models,
    model_entry,
    search_models,
)
from torchfit.memory.catalog.resolve import build_model, model_config, resolve_model

__all__ = [
    "ModelEntry",
    "ModelTask",
    "build_model",
    "count_parameters",
    "list_models",
    "model_config",
    "model_entry",
    "resolve_model",
    "search_models",
]
