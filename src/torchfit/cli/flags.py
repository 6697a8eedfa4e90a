"""``torchfit plan``'s flags: the step's, made from `torchfit.Step`'s fields, and the CUDA stack's.

Each `Step` field with a ``flag`` in its metadata becomes that flag, with its help and a
reader for its kind; its argparse dest is the field's name, so a parsed namespace gives
the step by name and an error from the library names the flag through the same field.
Each such flag records that it was given (``args.given``), so ``--recipe`` can tell a
flag set on the command line from one left at its default.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import warnings
from typing import Any

from torchfit.cli import values
from torchfit.memory.step import Step

__all__ = [
    "STEP_FLAGS",
    "add_cuda_flags",
    "add_step_flags",
    "recipe_step",
    "refuse_idle_flags",
    "step_fields",
]

#: A `Step` field's kind -> (the reader of its flag's value, the value's metavar).
_KINDS: dict[str, tuple[Any, str]] = {
    "count": (values.count, "N"),
    "whole": (values.whole, "N"),
    "shape": (values.shape, "C,H,W"),
    "precision": (values.precision_or_auto, "NAME"),
    "dtype": (values.dtype, "DTYPE"),
    "optimizer": (values.optimizer, "NAME"),
    "names": (values.names, "NAMES"),
    "fraction": (values.fraction, "P"),
    "attention": (values.attention, "KIND"),
    "bitsandbytes_version": (values.bitsandbytes_version, "X.Y.Z"),
    "torch_version": (values.torch_version, "X.Y.Z"),
}

#: The `Step` fields ``torchfit plan`` has a flag for -> the flag.
STEP_FLAGS = {
    f.name: f.metadata["flag"] for f in dataclasses.fields(Step) if f.metadata.get("flag")
}


def _recorded(action: type[argparse.Action]) -> type[argparse.Action]:
    """``action`` that also adds its dest to ``namespace.given``."""

    class Recorded(action):  # type: ignore[misc,valid-type]
        def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
            super().__call__(parser, namespace, values, option)
            namespace.given = {*getattr(namespace, "given", ()), self.dest}

    return Recorded


_STORE = _recorded(argparse._StoreAction)  # noqa: SLF001 - argparse's action classes
_STORE_CONST = _recorded(argparse._StoreConstAction)  # noqa: SLF001
_STORE_TRUE = _recorded(argparse._StoreTrueAction)  # noqa: SLF001
_STORE_FALSE = _recorded(argparse._StoreFalseAction)  # noqa: SLF001


def add_step_flags(plan: argparse.ArgumentParser) -> None:
    """A flag for each `Step` field that has one (a boolean's is a switch), and ``--recipe``."""
    for field in dataclasses.fields(Step):
        flag = field.metadata.get("flag")
        if flag is None:
            continue
        help_ = field.metadata["help"]
        kind = field.metadata["kind"]
        if kind:
            read, metavar = _KINDS[kind]
            default = None if field.name == "batch_size" else field.default  # None: not given
            plan.add_argument(
                flag, dest=field.name, type=read, default=default, metavar=metavar, help=help_,
                action=_STORE,
            )  # fmt: skip
        elif field.default is None:  # a tri-state: unset means the step's own default
            plan.add_argument(
                flag, dest=field.name, action=_STORE_CONST, const=False, default=None,
                help=help_,
            )  # fmt: skip
        else:  # the flag turns a boolean away from its default
            action = _STORE_FALSE if field.default else _STORE_TRUE
            plan.add_argument(flag, dest=field.name, action=action, help=help_)
    plan.add_argument(
        "--recipe",
        default=None,
        type=values.recipe_file,
        metavar="FILE",
        help="a torchtune or LitGPT fine-tuning config (YAML), or 'unsloth' (its README's "
        "QLoRA): the step as that code runs it; step flags beside it fill what it leaves "
        "open or must agree with it (an unsloth default they replace)",
    )


def recipe_step(args: argparse.Namespace) -> Step | None:
    """The `Step` of ``--recipe`` with the step flags given beside it; None without one.

    What the config sets that torchfit does not model is printed on stderr.

    Raises:
        ValueError: ``--inference`` or ``--dtype`` beside ``--recipe`` (a recipe is a
            fine-tuning run in the precision it names), or a flag that contradicts it.
    """
    if args.recipe is None:
        return None
    if args.mode != "train" or str(args.dtype).lower() != "auto":
        raise ValueError(
            "--recipe describes a fine-tuning run in its own precision; leave --inference "
            "and --dtype out (--precision agrees with it or fills an unset one)"
        )
    given: set[str] = getattr(args, "given", set())
    fields = {k: v for k, v in step_fields(args).items() if k in given}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step = Step.from_recipe(args.recipe, **fields)
    for warning in caught:
        print(f"note: {warning.message}", file=sys.stderr)
    return step


def add_cuda_flags(plan: argparse.ArgumentParser) -> None:
    """The CUDA stack the job runs: its version and a measured context."""
    plan.add_argument(
        "--cuda-version",
        default=None,
        type=values.cuda_version,
        help="the job's CUDA version (torch.version.cuda); before 11.7 the context is larger",
    )
    plan.add_argument(
        "--context",
        dest="context_bytes",
        default=None,
        type=values.context,
        metavar="SIZE",
        help="the CUDA context you measured, e.g. 420MiB, or 'measure' (on this machine's GPU)",
    )


def step_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The `Step` fields a parsed ``torchfit plan`` gives, by name.

    ``--batch`` left out is None (a comparison then times each card at its largest
    batch); the step then keeps its default.
    """
    fields = {name: getattr(args, name) for name in STEP_FLAGS}
    if fields["batch_size"] is None:
        del fields["batch_size"]
    return fields


_FOUR_BIT = frozenset({"nf4", "fp4", "int4"})


def refuse_idle_flags(args: argparse.Namespace) -> None:
    """Refuse a flag that this plan would ignore (its value would be printed, not used).

    Raises:
        ValueError: naming the flag, what it needs, and what to change.
    """
    four_bit = str(args.dtype).strip().lower() in _FOUR_BIT
    lora = any(v is not None for v in (args.lora_rank, args.lora_targets, args.trainable_params))
    bits = "4-bit weights (--dtype nf4, fp4 or int4)"
    idle = [
        (not args.double_quant and not four_bit, "--no-double-quant", bits),
        (args.bitsandbytes_version is not None and not four_bit, "--bitsandbytes-version", bits),
        (args.base_dtype is not None and not (lora or four_bit), "--base-dtype",
         "a frozen base (--lora-rank, --lora-targets or --trainable-params) or 4-bit weights"),
        (args.gpus_per_node is not None and args.strategy is None, "--gpus-per-node",
         "a --strategy (hsdp shards within a node; offload shares a node's memory)"),
    ]  # fmt: skip
    for ignored, flag, needs in idle:
        if ignored:
            raise ValueError(
                f"{flag} applies to {needs}, which this plan does not have; add that or "
                f"leave {flag} out"
            )
