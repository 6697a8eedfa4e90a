"""`Step`: one training or inference step, described once, and where one comes from.

- `description`: the `Step` itself, frozen and checked where it is made.
- `spellings`: `estimate`'s older keywords (``dtype=``, ``mixed_precision=``) read.
- `training_arguments`, `lightning`, `recipes`: the fields a ``transformers.TrainingArguments``,
  a Lightning ``Trainer`` or a torchtune/LitGPT config names (`Step.from_training_arguments`,
  `Step.from_lightning`, `Step.from_recipe`), joined with the caller's by
  `fields.merge_fields`, which refuses a contradiction.
- `built`: what a model already built says (a ``PeftModel``'s ``LoraConfig``, a 4/8-bit
  model's ``quantization_config``, the frozen base's dtype), read by every entry point
  that takes a model and a step, merged the same way.

The device is never read from a framework's settings: transformers needs ``use_cpu=True``
to build ``bf16=True`` arguments on a machine without a bf16 GPU, and Lightning's
``accelerator="auto"`` is the CPU on a laptop, while the step planned is usually a GPU's.
Neither reader imports transformers or Lightning: their objects are read by attribute.
"""

from torchfit.memory.step.description import AUTO, FIELD_NAMES, Step
from torchfit.memory.step.fields import NotModelledWarning, StepFields, merge_fields
from torchfit.memory.step.lightning import LIGHTNING_ALIASES, lightning_fields
from torchfit.memory.step.recipes import TORCHTUNE_OPTIMIZERS, recipe_fields
from torchfit.memory.step.training_arguments import (
    TRANSFORMERS_OPTIMIZERS,
    training_arguments_fields,
)

__all__ = [
    "AUTO",
    "FIELD_NAMES",
    "LIGHTNING_ALIASES",
    "TORCHTUNE_OPTIMIZERS",
    "TRANSFORMERS_OPTIMIZERS",
    "NotModelledWarning",
    "Step",
    "StepFields",
    "lightning_fields",
    "merge_fields",
    "recipe_fields",
    "training_arguments_fields",
]
