"""Does it fit? `fits` turns an estimate and a card into a verdict, limits and advice."""

from torchfit.memory.gpus.budget import resolve_budget
from torchfit.memory.plan.advice import Advice
from torchfit.memory.plan.settings import Settings
from torchfit.memory.plan.verdict import Plan, fits

__all__ = [
    "Advice",
    "Plan",
    "Settings",
    "fits",
    "resolve_budget",
]
