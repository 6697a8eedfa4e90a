"""Device memory against batch size, with the card's limit (needs the ``plot`` extra).

The picture states the plan's answer: what ``nvidia-smi`` would show at each batch size
(from 0, so heights compare), the card's memory as a line with the region above it
shaded, and the largest batch that fits marked with its GiB. Every point is the plan's
own device estimate (the one its verdict uses: per rank under a strategy, with the CUDA
stack it was given), so the picture and the verdict cannot disagree.
"""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchfit._core.imports import require
from torchfit._core.units import format_bytes

if TYPE_CHECKING:
    from torchfit.memory.plan import Plan

__all__ = [
    "YLABEL",
    "answer",
    "batch_sizes",
    "device_needs",
    "draw_plan",
    "plot_path",
    "plot_plan",
    "title",
]

_GIB = 2**30
#: The y-axis: the quantity every point is.
YLABEL = "device memory needed (OOM line + CUDA context), GiB"


def batch_sizes(largest: int) -> list[int]:
    """Batch sizes to draw: 1 to about twice ``largest``, with ``largest`` and one past it.

    Example:
        >>> batch_sizes(6)
        [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
        >>> batch_sizes(0)[:3]
        [1, 2, 3]
    """
    top = max(2 * largest, 8)
    sizes = {max(1, round(top * step / 16)) for step in range(17)}
    if largest:
        sizes |= {largest, largest + 1}
    return sorted(sizes)


def device_needs(model: Any, plan: Plan, sizes: Sequence[int]) -> list[int]:
    """The plan's device need (`MemoryEstimate.device_needed`) at each batch size."""
    from torchfit.memory.plan.device import device_estimate  # noqa: PLC0415

    return [
        device_estimate(model, plan.settings.replace(batch_size=size), plan.gpu).device_needed
        for size in sizes
    ]


def title(plan: Plan) -> str:
    """What was planned (model, mode, numbers, sequence) and on which card, in two lines."""
    step = plan.step
    numbers = step.precision
    if step.quantization is not None:
        numbers = f"{step.quantization} base, {numbers}"
    what = f"{plan.settings.model}: {step.mode}, {numbers}"
    what += f", seq {step.seq_len}" if step.seq_len else ""
    what += ", gradient checkpointing" if step.gradient_checkpointing else ""
    cards = plan.gpu.name if plan.num_gpus == 1 else f"{plan.num_gpus} x {plan.gpu.name}"
    if plan.settings.strategy is not None:
        cards += f" ({plan.settings.strategy}, per GPU)"
    return f"{what}\non {cards} ({format_bytes(plan.budget)})"


def answer(plan: Plan, sizes: Sequence[int], totals: Sequence[int]) -> tuple[int, int, str]:
    """The point to mark (batch, bytes) and its label: the largest batch, or batch 1.

    Example:
        >>> from types import SimpleNamespace
        >>> plan = SimpleNamespace(largest_batch=2, budget=4 * 2**30)
        >>> answer(plan, [1, 2, 3], [2**30, 3 * 2**30, 5 * 2**30])
        (2, 3221225472, 'largest batch 2: 3.00 of 4.00 GiB')
    """
    card = plan.budget / _GIB
    batch = plan.largest_batch or 1
    used = totals[list(sizes).index(batch)]
    if plan.largest_batch:
        return batch, used, f"largest batch {batch}: {used / _GIB:.2f} of {card:.2f} GiB"
    return batch, used, f"batch 1 does not fit: {used / _GIB:.2f} of {card:.2f} GiB"


def draw_plan(model: Any, plan: Plan) -> Any:
    """The matplotlib ``Figure`` of device memory against batch size for ``plan``.

    Args:
        model: The model the plan was made for (what `fits` was given).
        plan: The `Plan`; its settings are re-estimated at each batch size.

    Returns:
        A ``matplotlib.figure.Figure`` (close it with ``matplotlib.pyplot.close``).
    """
    require("matplotlib", feature="--plot")
    import matplotlib as mpl  # noqa: PLC0415

    mpl.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    sizes = batch_sizes(plan.largest_batch)
    totals = device_needs(model, plan, sizes)
    card = plan.budget / _GIB
    top = max(max(totals) / _GIB, card) * 1.15
    figure, axes = plt.subplots(figsize=(8, 4.5))
    red = "#d62728"
    axes.axhspan(card, top, color=red, alpha=0.08, linewidth=0)
    right = axes.get_yaxis_transform()  # x in axes coordinates, y in GiB
    axes.text(0.98, card, "does not fit ", color=red, ha="right", va="bottom", transform=right)
    axes.axhline(card, color=red, linestyle="--", label=f"{plan.gpu.name}: {card:.2f} GiB")
    axes.plot(sizes, [t / _GIB for t in totals], marker="o", label="estimate at each batch size")
    batch, used, label = answer(plan, sizes, totals)
    axes.plot([batch], [used / _GIB], marker="o", markersize=11, color="black", zorder=3)
    # below and to the right of the point: the curve rises to the right, above the card
    axes.annotate(
        label, (batch, used / _GIB), xytext=(14, -26), textcoords="offset points", weight="bold"
    )
    axes.set_ylim(0, top)
    axes.set_xlim(0, sizes[-1] * 1.04 + 1)
    axes.set_title(title(plan), fontsize=10)
    axes.set_xlabel("batch size" if plan.settings.strategy is None else "batch size per GPU")
    axes.set_ylabel(YLABEL)
    axes.legend(loc="upper left", fontsize=9)
    figure.tight_layout()
    return figure


def plot_path(path: str | os.PathLike[str]) -> Path:
    r"""``path`` as the file a picture is written to, or a ``ValueError`` saying why not.

    A name must name something: matplotlib adds ``.png`` to a name without a suffix, so
    an empty or blank one (``""``, ``" "``, a tab) would write a hidden ``.png``,
    ``" .png"`` or ``"\t.png"`` where the command runs. Control characters and spaces at
    either end of the name are refused too (a tab in a file name breaks Windows
    checkouts), and so are folders and paths whose folder does not exist.

    Example:
        >>> str(plot_path("plan.png"))
        'plan.png'
        >>> plot_path(" ")
        Traceback (most recent call last):
        ValueError: expected a file to write in an existing folder, e.g. plan.png; got ' '
    """
    text = os.fspath(path)
    name = Path(text).name
    stem = name.removesuffix(".png")
    unportable = name != name.strip() or any(unicodedata.category(c) == "Cc" for c in name)
    found = Path(text)
    if not stem.strip() or unportable or found.is_dir() or not found.parent.is_dir():
        msg = f"expected a file to write in an existing folder, e.g. plan.png; got {text!r}"
        raise ValueError(msg)
    return found


def plot_plan(model: Any, plan: Plan, path: str | os.PathLike[str]) -> None:
    """Save `draw_plan`'s picture of ``plan`` as a PNG at ``path``, exactly there.

    Raises:
        ValueError: ``path`` cannot be the picture's file (see `plot_path`).
    """
    target = plot_path(path)
    figure = draw_plan(model, plan)
    # format= keeps matplotlib from adding ".png" to a name without it: the file is `path`
    figure.savefig(target, format="png", dpi=120, metadata={"Software": None})
    import matplotlib.pyplot as plt  # noqa: PLC0415

    plt.close(figure)
