"""The longest sequence that fits a card, as a maximum-context table measures it.

Sources such as unsloth's context-length tables publish, per card, the longest padded
sequence a recipe trained at. torchfit's twin of that figure is the longest ``seq_len``
whose OOM line (``device_needed``) is at most the card's memory; `longest_fitting` finds
it with few estimates (each one costs seconds), by interpolating on a bracket: memory
grows almost linearly with the sequence, so a secant step lands close, and every third
step halves the bracket so that a bend cannot stall it.

This module is pure: it takes the memory as a function of the length.
"""

from __future__ import annotations

from collections.abc import Callable


def _between(lo: int, lo_needed: int, hi: int, hi_needed: int, capacity: int) -> int:
    """The length where the line through the two points meets ``capacity``, inside (lo, hi)."""
    if hi_needed == lo_needed:
        return (lo + hi) // 2
    guess = lo + (capacity - lo_needed) * (hi - lo) // (hi_needed - lo_needed)
    return min(max(guess, lo + 1), hi - 1)


def longest_fitting(
    needed: Callable[[int], int],
    capacity: int,
    *,
    start: int,
    limit: int,
    tolerance: float = 0.005,
    tries: int = 12,
) -> int:
    """The longest length in ``[1, limit]`` whose ``needed(length)`` is at most ``capacity``.

    Args:
        needed: Bytes the card must hold at a length (torchfit's ``device_needed``); taken
            to grow with the length.
        capacity: The card's bytes.
        start: A first guess (the published longest length).
        limit: The longest length the model takes (its positions).
        tolerance: Stop once the bracket is this fraction of its upper end (0.5%).
        tries: At most this many calls of ``needed``.

    Returns:
        The longest length found to fit (within ``tolerance`` of the true one when
        ``tries`` sufficed); 0 when one token does not fit.

    Example:
        >>> longest_fitting(lambda n: 1000 + 3 * n, 4000, start=700, limit=10_000)
        1000
        >>> longest_fitting(lambda n: 5000 + n, 4000, start=700, limit=10_000)
        0
    """
    memo: dict[int, int] = {}

    def at(length: int) -> int:
        if length not in memo:
            memo[length] = needed(length)
        return memo[length]

    if at(1) > capacity:
        return 0
    lo, lo_needed = 1, at(1)
    hi, hi_needed = 0, 0  # hi = 0: nothing found too long yet
    length = min(max(start, 2), limit)
    for step in range(tries - 1):
        used = at(length)
        if used <= capacity:
            lo, lo_needed = length, used
        else:
            hi, hi_needed = length, used
        if lo == limit or (hi and hi - lo <= max(1.0, tolerance * hi)):
            break
        if not hi:  # extend the line from one token through the longest fit, 1% beyond
            slope = max(1, (lo_needed - at(1)) // max(lo - 1, 1))
            grown = lo + (capacity - lo_needed) // slope
            length = min(limit, max(grown + grown // 100, lo + 1))
        elif step % 3 == 2:
            length = (lo + hi) // 2
        else:
            length = _between(lo, lo_needed, hi, hi_needed, capacity)
    return lo


def longest_error(published: int, found: int) -> float | None:
    """(torchfit - published) / published; None for a row where no length fit (0)."""
    return None if published == 0 else (found - published) / published


def longest_table(rows: list[tuple[str, str, int, int]]) -> list[str]:
    """Markdown lines: a summary, then (case, card, published longest, torchfit's) per row.

    A published longest of 0 is a row where no length tried fit (an out-of-memory row).

    Example:
        >>> lines = longest_table([("a", "24 GB", 1000, 1050), ("b", "8 GB", 0, 0)])
        >>> print(lines[0].replace("; ", ";\\n  "))
        - longest sequences within 10%: 1 of 1;
          signed from +5.0% to +5.0%;
          no length fits where none did: 1 of 1
        >>> print("\\n".join(lines[2:]))
        | case | card | published longest | torchfit's longest | error |
        |---|---|---:|---:|---:|
        | a | 24 GB | 1,000 | 1,050 | +5.0% |
        | b | 8 GB | none fit | 0 |  |
    """
    errors = [e for _, _, p, f in rows if (e := longest_error(p, f)) is not None]
    none_fit = [f for _, _, p, f in rows if p == 0]
    parts = []
    if errors:
        within = sum(abs(e) <= 0.10 for e in errors)
        parts.append(
            f"longest sequences within 10%: {within} of {len(errors)}; signed from "
            f"{min(errors):+.1%} to {max(errors):+.1%}"
        )
    if none_fit:
        agree = sum(f == 0 for f in none_fit)
        parts.append(f"no length fits where none did: {agree} of {len(none_fit)}")
    lines = ["- " + "; ".join(parts), ""]
    lines += [
        "| case | card | published longest | torchfit's longest | error |",
        "|---|---|---:|---:|---:|",
    ]
    for key, card, published, found in rows:
        error = longest_error(published, found)
        shown = "none fit" if published == 0 else f"{published:,}"
        lines.append(
            f"| {key} | {card} | {shown} | {found:,} | {'' if error is None else f'{error:+.1%}'} |"
        )
    return lines
