"""``torchfit plan MODEL --gpu A --gpu B ...``: the same step on several cards.

Each card gets `torchfit.fits`' verdict and largest batch, and the step's predicted time
there (`torchfit.speed.compare_gpus`); with ``--tokens`` (or ``--samples``) the hours for
that budget, and with ``--price CARD=USD`` what they cost. The answer ends with the
fastest card and, given prices, the cheapest.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from torchfit.cli import values
from torchfit.cli.flags import STEP_FLAGS, step_fields
from torchfit.memory.step import Step

__all__ = ["add_flags", "refuse_budget_flags", "run"]

#: Step fields `step_time` cannot time (it refuses them): a comparison refuses their flags.
_UNTIMED = ("trainable_params",)
#: Flags of a single-card plan that a comparison does not take, by their argparse dest.
_SINGLE = {
    "strategy": "--strategy", "gpus_per_node": "--gpus-per-node",
    "offload_optimizer": "--offload-optimizer", "offload_params": "--offload-params",
    "param_dtype": "--param-dtype", "trace": "--trace", "device_map": "--device-map",
    "machine": "--machine", "cuda_version": "--cuda-version",
    "context_bytes": "--context", "trust_remote_code": "--trust-remote-code",
}  # fmt: skip


def add_flags(plan: argparse.ArgumentParser) -> None:
    """The budget and the prices of a comparison (several ``--gpu``)."""
    budget = plan.add_mutually_exclusive_group()
    budget.add_argument(
        "--tokens",
        type=values.amount,
        default=None,
        metavar="N",
        help="with several --gpu: hours (and cost) to train on N tokens, e.g. 1e9",
    )
    budget.add_argument(
        "--samples",
        type=values.amount,
        default=None,
        metavar="N",
        help="with several --gpu: hours (and cost) for N samples (images)",
    )
    plan.add_argument(
        "--price",
        action="append",
        type=values.price,
        default=None,
        metavar="CARD=USD",
        help='with several --gpu: a card\'s price per hour, e.g. --price "H100=2.49"',
    )


def refuse_budget_flags(args: argparse.Namespace) -> None:
    """``--tokens``, ``--samples`` and ``--price`` need several cards to compare."""
    for dest, flag in (("tokens", "--tokens"), ("samples", "--samples"), ("price", "--price")):
        if getattr(args, dest) is not None:
            raise ValueError(
                f"{flag} applies to a comparison of several cards; give --gpu more than once "
                f"(--gpu H100 --gpu 'A100 80GB') or leave {flag} out"
            )


def run(args: argparse.Namespace, recipe: Any = None) -> int:
    """Compare the cards of ``args.gpu`` for the step the flags (or ``recipe``) describe."""
    from torchfit.memory.gpus import gpu  # noqa: PLC0415
    from torchfit.speed import compare_gpus  # noqa: PLC0415

    _refuse_single_card_flags(args)
    cards = [gpu(name) for name in args.gpu]
    fields = step_fields(args)  # without --batch: each card at its largest batch
    keywords: dict[str, Any] = {"mode": args.mode, **fields}
    if recipe is not None:
        keywords = {"step": recipe}
    elif str(args.dtype).lower() != "auto":
        keywords["dtype"] = args.dtype
    elif fields.get("precision") in {None, "auto"}:
        keywords["precision"] = _shared_precision(cards, training=args.mode == "train")
    prices = dict(args.price or [])
    unknown = sorted(set(prices) - set(args.gpu))
    if unknown:
        raise ValueError(
            f"--price names {unknown}, which is not a compared --gpu ({args.gpu}); use the "
            "name as given to --gpu"
        )
    table = compare_gpus(
        args.model,
        args.gpu,
        tokens=args.tokens,
        samples=args.samples,
        price_per_hour=prices or None,
        **keywords,
    )
    if args.plot:
        from torchfit.speed.plot import plot_comparison  # noqa: PLC0415

        plot_comparison(table, args.plot)
    wrote = f"plot: {args.plot} (throughput per card; hours or cost for the budget)"
    if args.json:
        print(json.dumps(table.to_dict(), indent=2))
        if args.plot:
            print(wrote, file=sys.stderr)  # stdout stays one JSON document
        return 0
    print(table)
    for line in verdicts(table):
        print(line)
    if args.plot:
        print(wrote)
    return 0


def verdicts(table: Any) -> list[str]:
    """The fastest card and, with prices, the cheapest, in words (none when nothing fits).

    Example:
        >>> from types import SimpleNamespace as S
        >>> rows = [S(gpu="A", fits=True, batch_size=8, cost=None, hours=None,
        ...           time=S(seconds=0.2, tokens_per_s=900.0, samples_per_s=None)),
        ...         S(gpu="B", fits=True, batch_size=4, cost=None, hours=None,
        ...           time=S(seconds=0.1, tokens_per_s=1200.0, samples_per_s=None))]
        >>> verdicts(S(rows=rows, budget=""))
        ['fastest: B (1,200 tok/s at batch 4)']
    """
    timed = [row for row in table.rows if row.fits and row.time is not None]
    if not timed:
        return ["no card holds the step: see the plan of each (torchfit plan MODEL --gpu CARD)"]

    def rate(row: Any) -> float:
        return float(row.time.tokens_per_s or row.time.samples_per_s or 0.0)

    fastest = max(timed, key=rate)
    unit = "tok/s" if fastest.time.tokens_per_s is not None else "samples/s"
    lines = [f"fastest: {fastest.gpu} ({rate(fastest):,.0f} {unit} at batch {fastest.batch_size})"]
    priced = [row for row in timed if row.cost is not None]
    if priced:
        cheapest = min(priced, key=lambda row: row.cost)
        lines.append(
            f"cheapest for {table.budget}: {cheapest.gpu} (${cheapest.cost:,.2f} in "
            f"{cheapest.hours:,.1f} hours)"
        )
    return lines


def _shared_precision(cards: list[Any], *, training: bool) -> str:
    """``precision="auto"`` for every card at once: bf16 when all have it, else fp16."""
    half = "bf16" if all(card.bf16 for card in cards) else "16"
    return f"{half}-mixed" if training else f"{half}-true"


def _refuse_single_card_flags(args: argparse.Namespace) -> None:
    """A comparison times one step per card: refuse what only a single-card plan takes."""
    given = [flag for dest, flag in _SINGLE.items() if getattr(args, dest) not in (None, False)]
    if args.gpus > 1:
        given.insert(0, "--gpus")
    defaults = {name: field.default for name, field in Step.__dataclass_fields__.items()}
    untimed = [
        STEP_FLAGS[name]
        for name, value in step_fields(args).items()
        if name in _UNTIMED and value != defaults[name]
    ]
    if given or untimed:
        names = ", ".join(given + untimed)
        raise ValueError(
            f"{names}: a comparison of several --gpu times one step on each card and does "
            "not take these; plan one card with them (torchfit plan MODEL --gpu CARD ...)"
        )
