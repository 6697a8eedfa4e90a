"""torchfit._core.bisection against a brute-force scan of every monotone predicate."""

from hypothesis import given
from hypothesis import strategies as st

from torchfit._core.bisection import gallop, largest_fitting, last_true


def brute(fits, low, high):
    """The largest n in [low, high] with fits(n), else low - 1."""
    return max((n for n in range(low, high + 1) if fits(n)), default=low - 1)


@given(boundary=st.integers(-1, 300), upper=st.integers(0, 300))
def test_largest_fitting_is_the_last_accepted_number(boundary, upper):
    calls = []

    def fits(n):
        calls.append(n)
        return n <= boundary

    found = largest_fitting(fits, upper)
    assert found == max(brute(lambda n: n <= boundary, 1, upper), 0)
    asked = [n for n in calls if n <= upper]
    assert asked == calls  # nothing above upper is ever asked


@given(boundary=st.integers(0, 10**6), good=st.integers(-1, 0))
def test_last_true_never_asks_the_bracket_ends(boundary, good):
    bad = 10**6 + 1
    seen = []

    def fits(n):
        seen.append(n)
        return n <= boundary

    assert last_true(fits, good, bad) == boundary
    assert good not in seen
    assert bad not in seen
    assert len(seen) <= (bad - good).bit_length()


@given(boundary=st.integers(1, 10**9), limit=st.integers(1, 10**9))
def test_gallop_brackets_the_boundary_or_passes_the_limit(boundary, limit):
    good, bad = gallop(lambda n: n <= boundary, 1, 2, limit=limit)
    assert good <= boundary
    assert bad > boundary or bad > limit
    assert bad == 2 * good


@given(boundary=st.integers(-1, 3000), upper=st.integers(0, 3000), guess=st.integers(-5, 3005))
def test_a_guess_changes_the_calls_not_the_answer(boundary, upper, guess):
    calls = []

    def fits(n):
        calls.append(n)
        return n <= boundary

    found = largest_fitting(fits, upper, guess=guess)
    assert found == largest_fitting(lambda n: n <= boundary, upper)
    assert all(1 <= n <= upper for n in calls)  # never 0, never above upper
    miss = abs(min(max(guess, 1), upper) - found) + 1 if upper >= 1 else 1
    assert len(calls) <= 2 * miss.bit_length() + 2


@given(boundary=st.integers(1, 10**6))
def test_the_right_guess_costs_two_calls(boundary):
    calls = []
    assert largest_fitting(lambda n: calls.append(n) or n <= boundary, 10**7, guess=boundary) == (
        boundary
    )
    assert calls == [boundary, boundary + 1]
