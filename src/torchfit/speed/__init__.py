"""How long and how much: step time, throughput and cost on each card, before the run.

`step_time` records one step kernel by kernel on fake tensors and times each kernel on
a card's roofline with efficiencies from published measurements; `compare_gpus` does
it for several cards with what fits (`torchfit.memory`) and what a budget costs.
"""

from torchfit.speed.compare import CardRow, Comparison, compare_gpus
from torchfit.speed.result import KindTime, StepTime
from torchfit.speed.timing import NOT_MODELLED, step_time

__all__ = [
    # time one step, or compare cards
    "compare_gpus",
    "step_time",
    # results
    "CardRow",
    "Comparison",
    "KindTime",
    "StepTime",
    # what no prediction includes
    "NOT_MODELLED",
]
