"""The largest whole number a monotone test accepts: doubling to bracket it, then bisecting.

Every "largest batch / longest sequence / most bytes that fit" search in torchfit is this
search over a predicate that holds up to some n and fails above it; the callers differ
only in the predicate, the bracket they start from and, where they can make one, a guess
(the bracket then grows from the guess: a good guess costs two calls).
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["gallop", "largest_fitting", "last_true"]


def last_true(fits: Callable[[int], bool], good: int, bad: int) -> int:
    """The largest n in ``[good, bad)`` with ``fits(n)``, by bisection.

    Assumes ``fits`` is monotone (true, then false), ``fits(good)`` holds (or ``good`` is
    a floor such as -1 or 0 that is never asked) and ``fits(bad)`` does not (or ``bad``
    is a ceiling never asked). ``fits`` is called about ``log2(bad - good)`` times,
    never at ``good`` or ``bad``.

    Example:
        >>> last_true(lambda n: n * n <= 50, 0, 100)
        7
        >>> last_true(lambda n: False, -1, 5)  # none: the floor comes back
        -1
    """
    while bad - good > 1:
        middle = (good + bad) // 2
        if fits(middle):
            good = middle
        else:
            bad = middle
    return good


def gallop(fits: Callable[[int], bool], good: int, bad: int, *, limit: int) -> tuple[int, int]:
    """Double ``bad`` while ``fits(bad)`` and ``bad <= limit``: a bracket for `last_true`.

    Returns ``(good, bad)`` with ``fits(good)`` (as given or found) and either
    ``not fits(bad)`` or ``bad > limit`` (nothing above ``limit`` was asked).

    Example:
        >>> gallop(lambda n: n <= 40, 1, 2, limit=1000)
        (32, 64)
        >>> gallop(lambda n: True, 1, 2, limit=100)
        (64, 128)
    """
    while bad <= limit and fits(bad):
        good, bad = bad, 2 * bad
    return good, bad


def largest_fitting(fits: Callable[[int], bool], upper: int, *, guess: int | None = None) -> int:
    """The largest n in ``[1, upper]`` with ``fits(n)`` (monotone); 0 if none.

    Without ``guess``, doubles from 1 to bracket the answer, then bisects: about
    ``2 log2(answer)`` calls, however large ``upper`` is. With one, the bracket grows from
    it, up or down by 1, 2, 4... until ``fits`` changes, then bisects: two calls when the
    guess is the answer, about ``2 log2(miss)`` more when it is ``miss`` away. The answer
    is the same either way; a guess outside ``[1, upper]`` is clamped into it.

    Example:
        >>> largest_fitting(lambda n: 3 * n <= 1000, 1 << 20)
        333
        >>> largest_fitting(lambda n: True, 10), largest_fitting(lambda n: False, 10)
        (10, 0)
        >>> asked = []
        >>> largest_fitting(lambda n: asked.append(n) or 3 * n <= 1000, 1 << 20, guess=333)
        333
        >>> asked
        [333, 334]
        >>> largest_fitting(lambda n: 3 * n <= 1000, 1 << 20, guess=300)
        333
    """
    if upper < 1:
        return 0
    if guess is None:
        if not fits(1):
            return 0
        good, bad = gallop(fits, 1, 2, limit=upper)
        return last_true(fits, good, min(bad, upper + 1))
    guess = min(max(guess, 1), upper)
    step = 1
    if fits(guess):  # up from the guess: (good, bad) with bad failing or past upper
        good, bad = guess, guess + 1
        while bad <= upper and fits(bad):
            good, step = bad, 2 * step
            bad = min(good + step, upper + 1)
        return last_true(fits, good, min(bad, upper + 1))
    good, bad = guess - 1, guess  # down from the guess: good fitting, or 0
    while good >= 1 and not fits(good):
        bad, step = good, 2 * step
        good = max(bad - step, 0)
    return last_true(fits, max(good, 0), bad)
