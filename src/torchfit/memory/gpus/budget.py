"""Budgets: bytes, a size string, a `GPU` or a card name, read by one rule.

Every place that takes "a card or a memory size" (`torchfit.memory.plan.fits`,
`max_batch_size` and `find_batch_size`, `simulate_gpu`, `plan_device_map`, the
``torchfit plan --gpu`` option) reads it with `read_budget`:

* a `GPU` is that card;
* a string is a catalog card when `gpu` knows the name (``"RTX 3060"``, ``"3060"``,
  ``"T4"``), else a size (``"12GiB"``, ``"12GB"``, ``"12884901888"``); sizes never
  name a card, so the order only decides bare model numbers such as ``"3060"``;
* a number is bytes.

`budget_of` (bytes and a display name), `card_of` (a card, custom for a size) and
`resolve_budget` (a card or a list of cards, for a plan) are views of that one answer.
"""

from __future__ import annotations

from collections.abc import Sequence

from torchfit._core.units import format_bytes, parse_bytes
from torchfit.memory.gpus.card import GPU
from torchfit.memory.gpus.lookup import gpu

__all__ = ["budget_of", "card_of", "read_budget", "resolve_budget"]

#: The name `card_of` gives a card made from a plain number of bytes.
NUMBER_CARD_NAME = "budget"


def read_budget(value: float | str | GPU) -> GPU | int:
    """A budget as the card it names, or as bytes.

    Raises:
        ValueError: a string that is neither a card the catalog knows nor a size (the
            message has the close card names and both fixes), or a negative size.
        TypeError: anything but a number, a string or a `GPU`.

    Example:
        >>> read_budget("3060").name, read_budget("12GiB"), read_budget(2**30)
        ('NVIDIA GeForce RTX 3060 12GB', 12884901888, 1073741824)
    """
    if isinstance(value, GPU):
        return value
    if isinstance(value, str):
        try:
            return gpu(value)
        except ValueError as card_error:
            try:
                return parse_bytes(value)
            except ValueError:
                raise ValueError(
                    f"cannot read {value!r} as a memory budget: it is neither a size such as "
                    "'12GB' nor a GPU name torchfit knows; pass bytes, a size string or a "
                    f"torchfit.memory.GPU ({card_error})"
                ) from None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return parse_bytes(value)
    raise TypeError(
        f"a budget is a card name, a GPU, a size such as '12GiB' or a number of bytes; "
        f"got {value!r} of type {type(value).__name__}"
    )


def budget_of(value: float | str | GPU) -> tuple[int, str]:
    """Bytes and a display name for a budget (`read_budget`'s rule).

    Example:
        >>> budget_of("12GB")
        (12000000000, '12GB')
        >>> budget_of("T4")
        (16106127360, 'NVIDIA T4')
    """
    found = read_budget(value)
    if isinstance(found, GPU):
        return int(found.total), found.name
    return found, value.strip() if isinstance(value, str) else format_bytes(found)


def card_of(value: float | str | GPU) -> GPU:
    """The card a budget describes: a catalog card, or a custom card of that size.

    A size string names its custom card (``"12GiB"``); a number gives one called
    ``"budget"``.

    Example:
        >>> card_of("12GiB").memory, card_of(8 * 2**30).name
        (12884901888, 'budget')
    """
    found = read_budget(value)
    if isinstance(found, GPU):
        return found
    name = value.strip() if isinstance(value, str) else NUMBER_CARD_NAME
    return GPU.custom(name, memory=found)


def resolve_budget(target: float | str | GPU | Sequence[float | str | GPU]) -> tuple[GPU, int]:
    """The card to plan for and how many: a name, a `GPU`, a byte budget or a list.

    A list plans for its smallest card (data parallelism replicates everything). A plain
    budget (``12884901888`` or ``"12GiB"``) becomes a custom card of that size.

    Raises:
        ValueError: an empty list, or an item `read_budget` refuses.
        TypeError: an item of another type.

    Example:
        >>> card, count = resolve_budget(["RTX 3090", "RTX 3060"])
        >>> card.name, count
        ('NVIDIA GeForce RTX 3060 12GB', 2)
    """
    if isinstance(target, list | tuple):
        if not target:
            raise ValueError("an empty list of GPUs was given; name at least one card")
        cards = [card_of(item) for item in target]
        return min(cards, key=lambda card: card.total), len(cards)
    if isinstance(target, GPU | str | int | float) and not isinstance(target, bool):
        return card_of(target), 1
    raise TypeError(
        f"gpu must be a card name, a GPU, a byte budget or a list of cards; got {target!r}"
    )
