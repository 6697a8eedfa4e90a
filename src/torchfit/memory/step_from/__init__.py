"""`Step` fields from what a user already has: ``TrainingArguments`` or a Lightning ``Trainer``.

Each reader is a pure function that returns a `StepFields`: the `Step` fields the
framework's settings name, the setting each was read from, the settings that have no
`Step` value (refused when the fields are merged, unless the caller names the field), and
notes on settings that change memory but are not modelled. `merge_fields` joins them with
the fields a caller gives and refuses a given field that contradicts the settings. So
``Step.from_training_arguments(args, **fields)`` is::

    read = training_arguments_fields(args)
    step = Step.of(**merge_fields(read, fields))
    read.warn()  # each note as a NotModelledWarning

The device is never read: transformers needs ``use_cpu=True`` to build ``bf16=True``
arguments on a machine without a bf16 GPU, and Lightning's ``accelerator="auto"`` is the
CPU on a laptop, while the step planned is usually a GPU's. Neither reader imports
transformers or Lightning: their objects are read by attribute.
"""

from torchfit.memory.step_from.fields import NotModelledWarning, StepFields, merge_fields
from torchfit.memory.step_from.lightning import LIGHTNING_ALIASES, lightning_fields
from torchfit.memory.step_from.training_arguments import (
    TRANSFORMERS_OPTIMIZERS,
    training_arguments_fields,
)

__all__ = [
    "LIGHTNING_ALIASES",
    "TRANSFORMERS_OPTIMIZERS",
    "NotModelledWarning",
    "StepFields",
    "lightning_fields",
    "merge_fields",
    "training_arguments_fields",
]
