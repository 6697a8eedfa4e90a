"""A comparison of cards as a picture: throughput, and hours or cost (needs the ``plot`` extra).

The picture states the comparison's answer: one bar per card for the step's throughput
at the batch it was timed at (the card's largest, unless a batch was asked for), a card
that does not hold the step drawn as an empty row saying so, the fastest card's bar
marked; with a budget a second panel gives the hours for it, and with prices its cost,
the cheapest marked. Every number is the comparison's own (`Comparison.rows`), so the
picture and the table cannot disagree.
"""

from __future__ import annotations

import os
from typing import Any

from torchfit._core.imports import require

#: `torchfit.speed.compare`'s `Comparison` and `CardRow`, read by attribute (compare
#: draws with this module, so it is not imported here, not even for types).
Comparison = Any
CardRow = Any

__all__ = ["draw_comparison", "plot_comparison"]

#: Bar colours: every card, the best one of a panel.
_BAR, _BEST = "#4C72B0", "#DD8452"


def _rate(row: CardRow) -> float:
    return float(row.time.tokens_per_s or row.time.samples_per_s or 0.0) if row.time else 0.0


def _unit(table: Comparison) -> str:
    timed = [row for row in table.rows if row.time is not None]
    return "tokens/s" if timed and timed[0].time.tokens_per_s is not None else "samples/s"


def draw_comparison(table: Comparison) -> Any:
    """The comparison's picture as a matplotlib ``Figure`` (module notes)."""
    require("matplotlib", feature="the comparison's plot")
    import matplotlib as mpl  # noqa: PLC0415

    mpl.use("Agg")  # draw to files; no display needed
    import matplotlib.pyplot as plt  # noqa: PLC0415

    rows = list(table.rows)
    second = _second_panel(rows)
    panels = 2 if second else 1
    figure, axes = plt.subplots(
        1, panels, figsize=(5.5 * panels, 1.4 + 0.45 * len(rows)), squeeze=False, sharey=True
    )
    names = [row.gpu for row in rows]
    _throughput(axes[0][0], rows, names, _unit(table))
    if second:
        label, values = second
        _budget(axes[0][1], rows, names, label, values)
    title = f"{table.model}: {table.budget}" if table.budget else table.model
    figure.suptitle(f"{title}\n{_batches(rows)}")
    figure.tight_layout()
    return figure


def _batches(rows: list[CardRow]) -> str:
    """Which batch each card was timed at: one asked for, or each card's largest."""
    timed = {row.batch_size for row in rows if row.time is not None}
    if len(timed) == 1 and any(row.batch_size != row.largest_batch for row in rows if row.time):
        return f"the step at batch {timed.pop()} on every card"
    return "the step at each card's largest batch that fits"


def _throughput(ax: Any, rows: list[CardRow], names: list[str], unit: str) -> None:
    rates = [_rate(row) for row in rows]
    best = max(range(len(rows)), key=lambda i: rates[i]) if any(rates) else None
    colours = [_BEST if i == best else _BAR for i in range(len(rows))]
    ax.barh(names, rates, color=colours)
    ax.invert_yaxis()  # the first card on top, as in the table
    top = max(rates, default=0.0) or 1.0
    for i, row in enumerate(rows):
        if row.time is None:
            ax.text(0, i, "  does not fit at batch 1", va="center", color="#C44E52")
            continue
        text = f"  batch {row.batch_size}, {row.time.seconds * 1e3:,.0f} ms"
        ax.text(rates[i], i, text, va="center", fontsize=8)
    ax.set_xlim(0, top * 1.6)  # room for the labels
    ax.set_xlabel(f"{unit} (higher is faster)")


def _second_panel(rows: list[CardRow]) -> tuple[str, list[float | None]] | None:
    """("cost, USD", costs) with prices, ("hours", hours) with a budget only, else None."""
    if any(row.cost is not None for row in rows):
        return "cost for the budget, USD (lower is cheaper)", [row.cost for row in rows]
    if any(row.hours is not None for row in rows):
        return "hours for the budget (lower is sooner)", [row.hours for row in rows]
    return None


def _budget(
    ax: Any, rows: list[CardRow], names: list[str], label: str, values: list[float | None]
) -> None:
    known = [(i, v) for i, v in enumerate(values) if v is not None]
    best = min(known, key=lambda pair: pair[1])[0] if known else None
    heights = [v or 0.0 for v in values]
    ax.barh(names, heights, color=[_BEST if i == best else _BAR for i in range(len(rows))])
    for i, value in enumerate(values):
        if rows[i].time is None:
            text = "  -"
        elif value is None:
            text = "  no price"
        else:
            text = f"  {value:,.1f}"
        ax.text(value or 0.0, i, text, va="center", fontsize=8)
    ax.set_xlim(0, max(heights, default=0.0) * 1.4 or 1.0)
    ax.set_xlabel(label)


def plot_comparison(table: Comparison, path: str | os.PathLike[str]) -> None:
    """Save `draw_comparison`'s picture of ``table`` as a PNG at ``path``, exactly there.

    Raises:
        ValueError: ``path`` cannot be the picture's file (as for a plan's plot).
    """
    from torchfit.memory.plan.plot import plot_path  # noqa: PLC0415

    target = plot_path(path)
    figure = draw_comparison(table)
    figure.savefig(target, format="png", dpi=120, metadata={"Software": None})
    import matplotlib.pyplot as plt  # noqa: PLC0415

    plt.close(figure)
