"""The ``torchfit`` command's parser and subcommands (`torchfit.cli.main` runs it)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from torchfit import __version__
from torchfit._core.units import format_bytes
from torchfit.cli import compare, extras, values
from torchfit.cli.flags import (
    add_cuda_flags,
    add_step_flags,
    recipe_step,
    refuse_idle_flags,
    step_fields,
)

__all__ = ["main"]

_USAGE_ERROR = 2


def _parser() -> argparse.ArgumentParser:
    parser = values.Parser(
        prog="torchfit",
        description="Will it fit? PyTorch memory plans checked against real allocations.",
    )
    parser.add_argument("--version", action="version", version=f"torchfit {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    plan = commands.add_parser(
        "plan",
        help="does MODEL fit a card: breakdown, verdict, largest batch, advice",
        description="MODEL is a Hugging Face Hub id (meta-llama/Llama-3.1-8B: the catalog, "
        "the local cache, then the Hub, config.json only), a catalog name (torchfit models), "
        "torchvision/<name> or timm/<name>, a config.json or a model folder.",
    )
    plan.add_argument("model", type=values.model_name)
    plan.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="run the model repository's own Python code to read a model_type transformers "
        "does not know (only for repositories you trust)",
    )
    plan.add_argument(
        "--gpu",
        required=True,
        action="append",
        type=values.gpu,
        help='card name ("RTX 3060") or size ("12GiB"); given several times, compares the '
        "cards: fits, largest batch, step time, throughput, hours and cost",
    )
    plan.add_argument(
        "--gpus", type=values.count, default=1, help="number of such cards (default 1)"
    )
    plan.add_argument(
        "--strategy",
        default=None,
        type=values.strategy,
        help="with --gpus N: ddp, zero1, zero2, fsdp, hsdp (per-rank plan)",
    )
    plan.add_argument(
        "--gpus-per-node",
        type=values.count,
        default=None,
        help="GPUs per node (--strategy hsdp shards within a node; offload host memory)",
    )
    plan.add_argument(
        "--offload-optimizer",
        action="store_true",
        help="with --strategy zero1/zero2/fsdp: optimizer state and step on the CPU",
    )
    plan.add_argument(
        "--offload-params",
        action="store_true",
        help="with --strategy fsdp: parameter and gradient shards on the CPU too",
    )
    plan.add_argument(
        "--param-dtype",
        default=None,
        type=values.dtype,
        help="with --strategy fsdp: FSDP2 MixedPrecisionPolicy(param_dtype=...), bf16 or fp16",
    )
    mode = plan.add_mutually_exclusive_group()
    mode.add_argument(
        "--train",
        dest="mode",
        action="store_const",
        const="train",
        help="plan a training step: forward, backward, optimizer step (the default)",
    )
    mode.add_argument(
        "--inference",
        dest="mode",
        action="store_const",
        const="inference",
        help="plan inference: one forward without gradients (--new-tokens N: generate N tokens)",
    )
    plan.set_defaults(mode="train")
    plan.add_argument(
        "--dtype",
        default="auto",
        type=values.dtype_or_auto,
        help="auto (bf16, or fp16 without native bf16), fp32, bf16, fp16, int8, nf4",
    )
    add_step_flags(plan)
    plan.add_argument(
        "--trace",
        action="store_true",
        help="also trace the real step on fake tensors (a meta-device build; shows progress)",
    )
    plan.add_argument(
        "--time",
        action="store_true",
        help="also predict the step's time on the card: ms per step, tokens/s, MFU, the time "
        "by kernel class (torchfit.step_time; one card)",
    )
    plan.add_argument(
        "--device-map",
        action="store_true",
        help="with --inference: place the layers on the --gpus cards (accelerate), each "
        "keeping room for its KV cache and activations",
    )
    add_cuda_flags(plan)
    compare.add_flags(plan)
    plan.add_argument(
        "--machine",
        default=None,
        type=values.machine,
        metavar="NAME",
        help="also plan the host: RAM to load and to run the model (desktop-3060, "
        "workstation-a100, or 'this' for this machine), and a verdict for the whole machine",
    )
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.add_argument(
        "--plot",
        metavar="PNG",
        type=values.plot_path,
        help="draw memory against batch size (plot extra)",
    )

    gpus = commands.add_parser("gpus", help="list the GPU catalog")
    gpus.add_argument("--json", action="store_true")
    models = commands.add_parser(
        "models",
        help="list the model catalog (names, sizes, Hub ids)",
        description="The models torchfit knows offline; any other Hub id is read from the "
        "Hugging Face cache or the Hub.",
    )
    models.add_argument(
        "--search",
        metavar="TEXT",
        type=values.text,
        help="only models whose name or Hub id has TEXT",
    )
    models.add_argument("--json", action="store_true")
    return parser


def _flags(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each of ``plan``'s dests (`Step` fields and `fits`' arguments) -> its flag."""
    plan = next(
        action.choices["plan"]
        for action in parser._actions  # noqa: SLF001 - argparse keeps subparsers only here
        if isinstance(action, argparse._SubParsersAction)  # noqa: SLF001
    )
    return {
        action.dest: "/".join(action.option_strings) or action.dest.upper()
        for action in plan._actions  # noqa: SLF001
        if action.dest != "help"
    }


def _plan(args: argparse.Namespace) -> int:
    from torchfit.memory.plan import resolve_budget  # noqa: PLC0415
    from torchfit.whole import fits  # noqa: PLC0415

    recipe = recipe_step(args)
    if len(args.gpu) > 1:
        return compare.run(args, recipe)
    compare.refuse_budget_flags(args)
    if recipe is None:
        refuse_idle_flags(args)
    card, _ = resolve_budget(args.gpu[0])
    target = [card] * args.gpus if args.gpus > 1 else card
    model = extras.model_of(args)
    step: dict[str, Any] = (
        {"mode": args.mode, "dtype": args.dtype, **step_fields(args)}
        if recipe is None
        else {"step": recipe}
    )
    plan = fits(
        model,
        target,
        **step,
        strategy=args.strategy,
        offload_optimizer=args.offload_optimizer,
        offload_params=args.offload_params,
        param_dtype=args.param_dtype,
        gpus_per_node=args.gpus_per_node,
        cuda_version=args.cuda_version,
        context_bytes=args.context_bytes,
        time=args.time,
        machine=args.machine,
    )
    if plan.settings.model != args.model:  # a config read with --trust-remote-code
        plan = dataclasses.replace(
            plan, settings=dataclasses.replace(plan.settings, model=args.model)
        )
    if args.plot:
        from torchfit.memory.plan.plot import plot_plan  # noqa: PLC0415

        plot_plan(args.model, plan, args.plot)
    traced = extras.traced(args, plan) if args.trace else None
    placed = extras.device_map(args, plan) if args.device_map else None
    chosen = args.seq_len if recipe is None else recipe.seq_len  # the recipe's own length
    if chosen is None and plan.step.seq_len is not None:  # before the answer, on stderr
        print(_default_seq(model, plan.step.seq_len), file=sys.stderr)
    found = {"traced": traced, "device_map": placed}
    if args.json:
        print(json.dumps(_plan_json(plan, found), indent=2))
        _wrote_plot(args.plot, file=sys.stderr)  # stdout stays one JSON document
        return 0
    print(plan)
    _print_extras(found)
    _wrote_plot(args.plot, file=sys.stdout)
    return 0


def _plan_json(plan: Any, found: dict[str, Any]) -> dict[str, Any]:
    """The plan as JSON (``--time`` and ``--machine`` in it), and what ``--trace`` added."""
    data: dict[str, Any] = plan.to_dict()
    for key, value in found.items():
        if value is not None:
            data[key] = value.to_dict()
    return data


def _print_extras(found: dict[str, Any]) -> None:
    """What ``--trace`` and ``--device-map`` added, after the plan."""
    if found["traced"] is not None:
        print("\ntraced (the real step on fake tensors, for the same settings):")
        print(found["traced"])
    if found["device_map"] is not None:
        print()
        print(found["device_map"])


def _default_seq(model: Any, tokens: int) -> str:
    """The line that says which sequence a plan without ``--seq`` planned."""
    from torchfit.memory.plan.settings import config_of, default_sequence  # noqa: PLC0415

    _, what = default_sequence(config_of(model))
    return f"no --seq given: planning {what}, {tokens} tokens; pass --seq N to plan N tokens"


def _wrote_plot(path: str | None, *, file: TextIO) -> None:
    """Say where ``--plot`` wrote its picture (nothing without ``--plot``)."""
    if path is not None:
        print(f"plot: {path} (device memory against batch size; the card's limit)", file=file)


def _gpus(args: argparse.Namespace) -> int:
    from torchfit.memory.gpus import list_gpus  # noqa: PLC0415

    cards = list_gpus()
    if args.json:
        print(json.dumps([card.to_dict() for card in cards], indent=2))
        return 0
    width = max(len(card.name) for card in cards)
    for card in cards:
        bf16 = "bf16" if card.bf16 else "    "
        print(f"{card.name:<{width}}  {format_bytes(card.memory):>11}  {bf16}  {card.architecture}")
    return 0


def _models(args: argparse.Namespace) -> int:
    from torchfit.memory.catalog import list_models, search_models  # noqa: PLC0415

    entries = list_models() if args.search is None else search_models(args.search)
    if args.search is not None and not entries:
        raise ValueError(
            f"--search: no catalog model matches {args.search!r}; `torchfit models` lists all "
            f"{len(list_models())}, and any Hugging Face Hub id plans too"
        )
    if args.json:
        rows = [
            {
                "name": e.name,
                "family": e.family,
                "task": e.task.value,
                "params": e.params,
                "hub_id": _hub_id(e),
                "aliases": list(e.aliases),
                "source": e.source,
            }
            for e in entries
        ]
        print(json.dumps(rows, indent=2))
        return 0
    width = max(len(entry.name) for entry in entries)
    tasks = max(len(entry.task.value) for entry in entries)
    for entry in entries:
        line = f"{entry.name:<{width}}  {entry.params:>17,}  {entry.task.value:<{tasks}}"
        print(f"{line}  {_hub_id(entry) or '-'}".rstrip())
    return 0


def _hub_id(entry: Any) -> str | None:
    """The Hub id an entry's config comes from (its source), if it has one."""
    marker = "config.json of "
    if marker not in entry.source:
        return None
    return str(entry.source.split(marker, 1)[1].split()[0])


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # a usage error (already said in one line), --help, --version
        return exit_.code if isinstance(exit_.code, int) else _USAGE_ERROR
    handlers = {"plan": _plan, "gpus": _gpus, "models": _models}
    try:
        return handlers[args.command](args)
    except BrokenPipeError:  # `torchfit gpus | head`: the reader left; not an error
        sys.stdout = open(os.devnull, "w")  # noqa: PTH123, SIM115 - silence the final flush
        return 0
    except (ValueError, TypeError, FileNotFoundError, ImportError) as error:
        message = values.first_line(error)
        if args.command == "plan" and "--" not in message:  # the library names parameters
            named = values.flags_in(message, _flags(parser), skip=_GENERIC)
            message = f"{', '.join(named)}: {message}" if named else message
        print(f"torchfit: error: {message}", file=sys.stderr)
        return _USAGE_ERROR
    except RuntimeError as error:  # a model whose forward cannot run on the meta device
        print(f"torchfit: error: {values.first_line(error)}", file=sys.stderr)
        return 1


#: Words that name a parameter but also appear in messages about something else.
_GENERIC = frozenset({"mode", "json", "trace", "plot", "gpus", "model", "command"})
