"""Does it fit the card? `plan_card` turns a step and a card into a verdict, limits, advice.

`torchfit.fits` is the front door: it calls `plan_card` and adds the step's time and the
host when asked.
"""

from torchfit.memory.gpus.budget import resolve_budget
from torchfit.memory.plan.advice import Advice
from torchfit.memory.plan.settings import Settings
from torchfit.memory.plan.verdict import Plan, plan_card

__all__ = [
    "Advice",
    "Plan",
    "Settings",
    "plan_card",
    "resolve_budget",
]
