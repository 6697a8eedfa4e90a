"""The command line's values, each read and checked as argparse parses its flag.

A flag's value is checked by the same function the library checks it with (a dtype by
``parse_dtype``, a size by ``parse_bytes``, ...), at parse time, so a wrong value ends
as one line that names the flag, the value and what was expected::

    torchfit: error: argument --gpus: expected a whole number >= 1 (e.g. 8); got '0'

`Parser` prints every usage error that way (no usage block), and `flags_in` names the
flags of the parameters an error from the library mentions.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, NoReturn

__all__ = [
    "Parser",
    "amount",
    "attention",
    "bitsandbytes_version",
    "context",
    "count",
    "cuda_version",
    "dtype",
    "dtype_or_auto",
    "first_line",
    "flags_in",
    "fraction",
    "gpu",
    "machine",
    "model_name",
    "names",
    "optimizer",
    "plot_path",
    "precision",
    "precision_or_auto",
    "price",
    "recipe_file",
    "shape",
    "size",
    "strategy",
    "text",
    "torch_version",
    "whole",
]


def first_line(error: BaseException) -> str:
    """An error's message in one line (its first), or its type's name when it has none."""
    message = str(error).strip()
    return message.splitlines()[0] if message else type(error).__name__


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line: ``torchfit: error: ...``."""

    def error(self, message: str) -> NoReturn:
        """Print ``message`` as one line and exit with status 2 (argparse's usage error)."""
        self.exit(2, f"torchfit: error: {message.strip().splitlines()[0]}\n")


def _reader(name: str, read: Callable[[str], object], *, keep: bool) -> Callable[[str], Any]:
    """An argparse ``type=``: ``read(text)``'s value (or ``text`` when ``keep``)."""

    def convert(text: str) -> Any:
        try:
            value = read(text)
        except (ValueError, TypeError, LookupError) as error:
            raise argparse.ArgumentTypeError(first_line(error)) from None
        return text if keep else value

    convert.__name__ = name
    return convert


def _whole(text: str, at_least: int) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        value = at_least - 1
    if value < at_least:
        example = "8" if at_least > 0 else "0"
        msg = f"expected a whole number >= {at_least} (e.g. {example}); got {text!r}"
        raise ValueError(msg)
    return value


def _text(text: str) -> str:
    if not text.strip():
        raise ValueError(f"expected a non-empty value; got {text!r}")
    return text


#: A whole number >= 1: a count of cards, a batch, tokens, steps, a rank.
count = _reader("count", lambda t: _whole(t, 1), keep=False)
#: A whole number >= 0: parameters that train.
whole = _reader("whole", lambda t: _whole(t, 0), keep=False)
#: Non-empty text (a search).
text = _reader("text", _text, keep=True)


def _dtype(text: str) -> object:
    from torchfit._core.units import parse_dtype  # noqa: PLC0415

    return parse_dtype(_text(text))


def _auto(text: str) -> object:
    return text if text.strip().lower() == "auto" else _dtype(text)


def _optimizer(text: str) -> object:
    from torchfit._core.optimizers import parse_optimizer  # noqa: PLC0415

    return parse_optimizer(_text(text))


def _attention(text: str) -> object:
    from torchfit.memory.analytic.formulas import parse_attention  # noqa: PLC0415

    return parse_attention(_text(text))


def _strategy(text: str) -> object:
    from torchfit.memory.sharding import parse_strategy  # noqa: PLC0415

    return parse_strategy(_text(text))


def _precision(text: str) -> object:
    from torchfit._core.step import parse_precision_name  # noqa: PLC0415

    return parse_precision_name(_text(text))


def _precision_or_auto(text: str) -> object:
    return text if text.strip().lower() == "auto" else _precision(text)


def _fraction(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        value = -1.0
    if not 0.0 <= value < 1.0:
        msg = f"expected a fraction from 0 up to (not including) 1, e.g. 0.05; got {text!r}"
        raise ValueError(msg)
    return value


def _cuda(text: str) -> object:
    from torchfit.memory.allocator.context import parse_cuda_version  # noqa: PLC0415

    return parse_cuda_version(_text(text))


def _size(text: str) -> object:
    from torchfit._core.units import parse_bytes  # noqa: PLC0415

    return parse_bytes(_text(text))


def _context(text: str) -> object:
    """A size, or ``measure`` (the context measured on this machine's GPU, at plan time)."""
    from torchfit.memory.allocator.context import asks_to_measure  # noqa: PLC0415

    return text if asks_to_measure(_text(text)) else _size(text)


def _bitsandbytes(text: str) -> object:
    from torchfit._bnb.layout import keeps_4bit_input  # noqa: PLC0415

    return keeps_4bit_input(_text(text))


def _torch(text: str) -> object:
    from torchfit._core.torch_rules import mean_keeps_input  # noqa: PLC0415

    return mean_keeps_input(_text(text))


def _amount(text: str) -> float:
    """A positive count that may be written in scientific notation (``1e9`` tokens)."""
    try:
        value = float(text.strip().replace("_", ""))
    except ValueError:
        value = -1.0
    if not (value > 0 and value != float("inf")):
        msg = f"expected a positive number such as 1e9 or 2_000_000; got {text!r}"
        raise ValueError(msg)
    return value


def _price(text: str) -> tuple[str, float]:
    """``CARD=USD``: a card's price per hour."""
    card, sep, usd = text.rpartition("=")
    try:
        value = float(usd.strip().lstrip("$"))
    except ValueError:
        value = -1.0
    if not sep or not card.strip() or not (value >= 0 and value != float("inf")):
        msg = f"expected CARD=USD per hour, such as 'H100=2.49'; got {text!r}"
        raise ValueError(msg)
    return card.strip(), value


def _machine(text: str) -> object:
    """An example machine's name, or ``this`` (this machine, read when the plan runs)."""
    from torchfit.host import machine  # noqa: PLC0415

    return text if text.strip().lower() == "this" else machine(_text(text))


def _gpu(text: str) -> object:
    from torchfit.memory.gpus.budget import resolve_budget  # noqa: PLC0415

    return resolve_budget(_text(text))


def _names(text: str) -> object:
    parts = [part.strip() for part in text.split(",")]
    if not all(parts):
        msg = f"expected comma-separated names such as q_proj,v_proj (none empty); got {text!r}"
        raise ValueError(msg)
    return parts


def _shape(text: str) -> object:
    try:
        shape = tuple(int(part) for part in text.replace("x", ",").split(","))
    except ValueError:
        shape = ()
    if not shape or min(shape) < 1:
        msg = f"expected whole sizes >= 1 such as 3,224,224; got {text!r}"
        raise ValueError(msg)
    return shape


def _model(text: str) -> object:
    if not text.strip():
        msg = (
            f"an empty model name ({text!r}); pass a catalog name such as 'gpt2', a Hugging "
            "Face Hub id or a config.json path"
        )
        raise ValueError(msg)
    return text


def _plot(text: str) -> object:
    from torchfit.memory.plan.plot import plot_path  # noqa: PLC0415

    return plot_path(text)


def _recipe(text: str) -> object:
    """A recipe's name, or its config file read once into a mapping; recognized either way.

    `Step.from_recipe` takes both, so the file is not read again.
    """
    from torchfit.memory.step.recipes import (  # noqa: PLC0415
        NAMED_RECIPES,
        config_mapping,
        recipe_fields,
    )

    path = Path(_text(text))
    if text.strip().lower() in NAMED_RECIPES:
        recipe_fields(text)  # if a file has the name too, the error saying so
        return text
    if not path.is_file():
        what = "a folder" if path.is_dir() else "no such file"
        raise ValueError(
            f"expected a torchtune or LitGPT config file (YAML) or a recipe name "
            f"({', '.join(NAMED_RECIPES)}); {text!r} is {what}"
        )
    try:
        config = config_mapping(path)
    except OSError as error:
        raise ValueError(f"cannot read {text!r}: {error.strerror or error}") from None
    recipe_fields(config)  # torchtune's or LitGPT's, or the error saying what it is not
    return config


dtype = _reader("dtype", _dtype, keep=True)
dtype_or_auto = _reader("dtype", _auto, keep=True)
optimizer = _reader("optimizer", _optimizer, keep=True)
attention = _reader("attention", _attention, keep=True)
strategy = _reader("strategy", _strategy, keep=True)
precision = _reader("precision", _precision, keep=True)
precision_or_auto = _reader("precision", _precision_or_auto, keep=True)
fraction = _reader("fraction", _fraction, keep=False)
cuda_version = _reader("cuda_version", _cuda, keep=True)
size = _reader("size", _size, keep=True)
context = _reader("context", _context, keep=True)
bitsandbytes_version = _reader("bitsandbytes_version", _bitsandbytes, keep=True)
torch_version = _reader("torch_version", _torch, keep=True)
gpu = _reader("gpu", _gpu, keep=True)
machine = _reader("machine", _machine, keep=True)
amount = _reader("amount", _amount, keep=False)
price = _reader("price", _price, keep=False)
names = _reader("names", _names, keep=False)
recipe_file = _reader("recipe", _recipe, keep=False)
model_name = _reader("model", _model, keep=True)
plot_path = _reader("plot", _plot, keep=True)
shape = _reader("shape", _shape, keep=False)


def flags_in(message: str, flags: Mapping[str, str], *, skip: Iterable[str] = ()) -> list[str]:
    """The flags of the parameters ``message`` names, in the order it names them.

    Example:
        >>> flags_in("quantize_head=True needs dtype='nf4'", {"dtype": "--dtype",
        ...     "quantize_head": "--quantize-head"})
        ['--quantize-head', '--dtype']
    """
    skipped = set(skip)
    found: dict[str, int] = {}
    for parameter, flag in flags.items():
        if parameter in skipped:
            continue
        hit = re.search(rf"(?<![\w-]){re.escape(parameter)}(?![\w-])", message)
        if hit is not None:
            found.setdefault(flag, hit.start())
    return sorted(found, key=found.__getitem__)
