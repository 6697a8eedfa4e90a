"""`compare_gpus`: the same step on several cards: does it fit, how fast, what it costs."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from torchfit._core import checks
from torchfit.memory.gpus import GPU, gpu
from torchfit.memory.plan.device import device_estimate, estimated_once
from torchfit.memory.plan.verdict import card_fit
from torchfit.memory.step import Step
from torchfit.memory.step.entry import card_step
from torchfit.speed.result import StepTime
from torchfit.speed.timing import step_time

__all__ = ["CardRow", "Comparison", "compare_gpus"]


@dataclasses.dataclass(frozen=True)
class CardRow:
    """One card of a comparison.

    Attributes:
        gpu: The card's name.
        fits: The step at ``batch_size`` fits in the card's memory (`torchfit.fits`' rule:
            the allocator's OOM line plus the CUDA context).
        peak_bytes: What the step at ``batch_size`` needs on the card
            (`MemoryEstimate.device_needed`).
        largest_batch: The largest batch that fits (0: none), as `torchfit.fits` finds it.
        batch_size: The batch timed: the one asked for, else ``largest_batch``.
        time: The step's `StepTime` at ``batch_size`` (None when nothing fits).
        hours: Hours for the comparison's budget (None without a budget or a fit).
        cost: What those hours cost at the card's price (None without a price).
    """

    gpu: str
    fits: bool
    peak_bytes: int
    largest_batch: int
    batch_size: int
    time: StepTime | None
    hours: float | None
    cost: float | None

    def __repr__(self) -> str:
        """One line: the card, the verdict, the batch and its time."""
        verdict = "fits" if self.fits else "does not fit"
        timed = f", {self.time.seconds * 1e3:,.1f} ms per step" if self.time else ""
        return (
            f"<CardRow {self.gpu}: {verdict}, batch {self.batch_size} "
            f"(largest {self.largest_batch}){timed}>"
        )


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Several cards for one step: a table (`__str__`), `to_dict`, `plot`.

    Attributes:
        model: The model's name.
        rows: One `CardRow` per card, in the order given.
        budget: What ``hours`` and ``cost`` are for, e.g. ``"1e+09 tokens"`` (or "").
    """

    model: str
    rows: tuple[CardRow, ...]
    budget: str

    def to_dict(self) -> dict[str, Any]:
        """The comparison as JSON-ready values."""
        rows = []
        for row in self.rows:
            data = dataclasses.asdict(row)
            data["time"] = None if row.time is None else row.time.to_dict()
            rows.append(data)
        return {"model": self.model, "budget": self.budget, "rows": rows}

    def __repr__(self) -> str:
        """One line: the model, the cards and the fastest (``print`` for the table).

        Example:
            >>> compare_gpus("gpt2", ["H100", "L4"], batch_size=8, seq_len=1024)
            <Comparison gpt2 on 2 cards: fastest NVIDIA H100 SXM>
        """
        timed = [row for row in self.rows if row.fits and row.time is not None]
        fastest = max(timed, key=_rate, default=None)
        best = f"fastest {fastest.gpu}" if fastest else "none holds the step"
        return f"<Comparison {self.model} on {len(self.rows)} cards: {best}>"

    def __str__(self) -> str:
        """One line per card: fits, largest batch, step time, throughput, hours, cost."""
        head = f"{self.model}: {self.budget}" if self.budget else self.model
        lines = [
            head,
            (
                f"  {'card':<30} {'fits':<5} {'max b':>6} {'batch':>6} {'step ms':>9} "
                f"{'per s':>12} {'MFU':>5} {'hours':>9} {'cost':>9}"
            ),
        ]
        for row in self.rows:
            if row.time is None:
                lines.append(f"  {row.gpu:<30} {'no':<5} {row.largest_batch:>6}")
                continue
            rate = row.time.tokens_per_s or row.time.samples_per_s
            unit = "tok" if row.time.tokens_per_s is not None else "smp"
            hours = "" if row.hours is None else f"{row.hours:9.1f}"
            cost = "" if row.cost is None else f"{row.cost:9.2f}"
            lines.append(
                f"  {row.gpu:<30} {'yes' if row.fits else 'no':<5} {row.largest_batch:>6} "
                f"{row.batch_size:>6} {row.time.seconds * 1e3:9.1f} {rate:>8,.0f} {unit} "
                f"{row.time.mfu:5.0%} {hours:>9} {cost:>9}"
            )
        return "\n".join(lines)

    def plot(self) -> Any:
        """The picture of the comparison, a matplotlib ``Figure`` (`torchfit.speed.plot`).

        Throughput per card at its batch, the fastest marked; with a budget, the hours (or
        with prices the cost) beside it. Needs ``pip install 'torchfit[plot]'``.
        """
        from torchfit.speed.plot import draw_comparison  # noqa: PLC0415

        return draw_comparison(self)


def _checked(
    gpus: object, *, tokens: object, samples: object, price_per_hour: object
) -> dict[str, float]:
    """`compare_gpus`' cards, budget and prices checked at the door; the prices as a dict."""
    if tokens is not None and samples is not None:
        raise ValueError("give tokens= or samples= as the budget, not both")
    for label, budget in (("tokens", tokens), ("samples", samples)):
        if budget is not None and (
            isinstance(budget, bool)
            or not isinstance(budget, int | float)
            or not 0 < budget < float("inf")
        ):
            raise ValueError(f"{label}={budget!r}: a budget is a number > 0, e.g. {label}=1e9")
    if isinstance(gpus, str | GPU) or not isinstance(gpus, Sequence) or not gpus:
        raise TypeError(
            f"gpus={gpus!r}: expected a non-empty list of card names or GPU objects, "
            'e.g. gpus=["RTX 4090", "A100 80GB"]'
        )
    if price_per_hour is not None and not isinstance(price_per_hour, Mapping):
        raise TypeError(
            f"price_per_hour={price_per_hour!r}: expected a mapping of card name to price "
            'per card-hour, e.g. {"H100": 2.5}'
        )
    prices = dict(price_per_hour or {})
    for card_name, price in prices.items():
        if isinstance(price, bool) or not isinstance(price, int | float) or not price >= 0:
            raise ValueError(
                f"price_per_hour[{card_name!r}]={price!r}: a price is a number >= 0 per card-hour"
            )
    return prices


@checks.arguments()
def compare_gpus(
    model: Any,
    gpus: Sequence[str | GPU],
    step: Step | None = None,
    *,
    at_largest_batch: bool | None = None,
    tokens: float | None = None,
    samples: float | None = None,
    price_per_hour: Mapping[str, float] | None = None,
    channels_last: bool = False,
    **keywords: Any,
) -> Comparison:
    """Time one step on several cards, each at a batch that fits.

    Each card plans and times the same step (`torchfit.fits`, `step_time`); a step
    without ``precision`` takes each card's own (bf16 where it has native bf16, else
    fp16), as `fits` does.

    Args:
        model: What `step_time` takes.
        gpus: Card names or `torchfit.memory.GPU` objects.
        step: The step, a `torchfit.Step`; or give its fields as ``keywords``.
        at_largest_batch: Time each card at the largest batch that fits it. By default
            yes when no batch is given (keywords without ``batch_size``), else the step's
            batch on every card.
        tokens: A token budget (language models): hours and cost to process it.
        samples: A sample budget, instead of ``tokens``.
        price_per_hour: Price per card-hour by the names given in ``gpus``.
        channels_last: `step_time`'s: an image model in NHWC memory format.
        **keywords: The step's fields (``seq_len``, ``precision``, ...).

    Returns:
        A `Comparison`; print it for the table.

    Raises:
        ValueError: both budgets, a price for a card not compared, ``batch_size`` with
            ``at_largest_batch=True``, or a bad field.
        TypeError: a `Step` and keywords together, or an unknown keyword.

    Example:
        >>> table = compare_gpus("gpt2", ["H100", "A100 80GB"], batch_size=8, seq_len=1024,
        ...                      precision="bf16-mixed", tokens=1e9)
        >>> [row.fits for row in table.rows], table.rows[0].hours < table.rows[1].hours
        ([True, True], True)
    """
    prices = _checked(gpus, tokens=tokens, samples=samples, price_per_hour=price_per_hour)
    names = [g if isinstance(g, str) else g.name for g in gpus]
    unknown = sorted(set(prices) - set(names))
    if unknown:
        raise ValueError(f"price_per_hour names cards not compared: {unknown}; compared: {names}")
    if keywords.get("batch_size", 0) is None:  # batch_size=None: the same as left out
        del keywords["batch_size"]
    largest_wanted = _largest_wanted(
        at_largest_batch=at_largest_batch, step=step, keywords=keywords
    )
    rows = []
    with estimated_once():  # cards that run the same step share its estimates
        for name, card in zip(names, (gpu(g) for g in gpus), strict=True):
            chosen_step = card_step(
                step, keywords, card, where="compare_gpus(model, gpus, step)", model=model
            )
            settings, current, largest = card_fit(model, card, chosen_step)
            chosen = largest if largest_wanted else chosen_step.batch_size
            peak = 0
            if chosen == chosen_step.batch_size:
                peak = current.device_needed
            elif chosen:
                at = settings.replace(batch_size=chosen)
                peak = device_estimate(model, at, card).device_needed
            fits = 1 <= chosen <= largest
            timed = None
            if chosen:
                at_batch = chosen_step.replace(batch_size=chosen)
                timed = step_time(model, card, at_batch, channels_last=channels_last)
            hours = cost = None
            if timed is not None and (tokens is not None or samples is not None):
                hours = timed.hours(tokens=tokens, samples=samples)  # one of them: checked
                if name in prices:
                    cost = timed.cost(prices[name], tokens=tokens, samples=samples)
            rows.append(CardRow(card.name, fits, int(peak), largest, chosen, timed, hours, cost))
    budget = f"{tokens:.3g} tokens" if tokens is not None else ""
    budget = f"{samples:.3g} samples" if samples is not None else budget
    label = rows[0].time.model if rows and rows[0].time else str(model)
    return Comparison(label, tuple(rows), budget)


def _rate(row: CardRow) -> float:
    """Tokens (or samples) per second of a row's step; 0 when it was not timed."""
    if row.time is None:
        return 0.0
    return float(row.time.tokens_per_s or row.time.samples_per_s)


def _largest_wanted(
    *, at_largest_batch: bool | None, step: Step | None, keywords: dict[str, Any]
) -> bool:
    """Each card at its largest batch: asked, or by default when no batch is given."""
    given = step is not None or keywords.get("batch_size") is not None
    if at_largest_batch and keywords.get("batch_size") is not None:
        raise ValueError(
            f"batch_size={keywords['batch_size']} and at_largest_batch=True: two batches; "
            "leave batch_size out to time each card at its largest, or drop at_largest_batch"
        )
    if at_largest_batch is None:
        return not given
    return at_largest_batch
