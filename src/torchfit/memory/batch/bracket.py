"""What a batch-size search knows after each step, and the size it tries next.

`Bracket` keeps the sizes that ran and those that ran out of memory, with the bytes
measured (a simulated card or CUDA), and fits a line ``fixed + batch * per_sample`` to
them. It follows that line while the line foresees every OOM seen. An OOM it did not
foresee (fragmentation, another process, cuDNN or NCCL handles: memory the meter does
not see) makes it optimistic: the search then shrinks by a real factor and bisects
between the last size that ran and the failure, instead of retrying just below it.

Shrinking skips sizes, which is safe only while memory grows with the batch. It does
not always: cuDNN and cuBLAS pick kernels and workspaces by shape, and a cuDNN
"not supported" (an OOM in disguise) strikes some shapes only. So when every size down
to 1 ran out of memory and no measured line explains why, the search walks back up
through the sizes it skipped, smallest first, before it gives up.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from torchfit._core.bisection import gallop, last_true
from torchfit.memory.batch.fit import Line

__all__ = ["Bracket"]

# After an out-of-memory error no model foresaw, the next size is the failed one times
# _SHRINK (the model is taken as up to ~43% optimistic), then _HALVE after a second one in
# a row. Between a size that ran and one that failed, a bisection on a geometric grid of
# ratio _CLOSE stops once they are within that ratio, so the answer is within 10% of the
# largest size that runs: from 0.7 it takes two more steps (1.43 ** (1/4) < 1.1).
_SHRINK = (7, 10)  # as a fraction: 90 * 0.7 is 62.999... in floating point
_HALVE = (1, 2)
_CLOSE = 1.1
# A bracket of at most this many grid steps (4 sizes between the ends: 0.7 to 1 of the
# failed size) is walked up one size at a time: more steps, but one OOM at most.
_WALK = 5


@dataclasses.dataclass
class _Observed:
    batch_size: int
    peak: int
    resident: int


class Bracket:
    """The sizes tried, what was measured, and the next size to try.

    Example:
        >>> b = Bracket(usable=1000, budget=1000, line=Line(100.0, 10.0), cap=None)
        >>> b.observe(90, ok=False, peak=1050, held=900, resident=100)
        >>> b.after_oom(90)  # the line said 90 fits: shrink by a real factor
        63
    """

    def __init__(
        self,
        *,
        usable: int | None,
        budget: int | None,
        line: Line | None,
        cap: int | None,
        probe_upward: bool = False,
    ) -> None:
        """Nothing tried yet: the usable bytes, the budget, the predicted line, the cap."""
        self.usable = usable
        self.budget = budget
        self.line = line
        self.cap = cap
        self.probe_upward = probe_upward
        self.lo = 0  # the largest size that ran
        self.hi: int | None = None  # the smallest size that ran out of memory
        self.oks: list[_Observed] = []
        self.ooms: list[_Observed] = []
        self.failed = 0  # OOMs, measured or not
        self.tried: set[int] = set()
        self.failed_sizes: set[int] = set()
        self.streak = 0
        self.bisecting = False
        # Bytes held, and held plus the refused request, at OOMs that struck below the budget
        self.ceiling: tuple[int, int] | None = None

    def observe(
        self, batch_size: int, *, ok: bool, peak: int | None, held: int | None,
        resident: int | None, fitted: bool = True,
    ) -> None:  # fmt: skip
        """Record one trial: its peak (after an OOM: held plus the refused request).

        ``fitted=False`` (the warm-up) keeps its bytes out of the line.
        """
        self.failed += not ok
        self.tried.add(batch_size)
        if not ok:
            self.failed_sizes.add(batch_size)
        if peak is not None and resident is not None and fitted:
            (self.oks if ok else self.ooms).append(_Observed(batch_size, peak, resident))
        below = self.budget is not None and peak is not None and peak <= self.budget
        if not ok and held is not None and peak is not None and below:
            # It struck below the budget: memory the meter does not see.
            low, high = self.ceiling or (held, peak)
            self.ceiling = (min(low, held), min(high, peak))

    def model(self) -> Line | None:
        """Fixed and per-sample bytes: from measured successes, else the prediction.

        A step's peak is ``max(P0, F + S * batch)``: at small batches a phase that does
        not grow with the batch (the optimizer step) can set it. So the per-sample cost
        is the secant between the two largest measured successes, anchored at the
        largest (0 while the peak is still flat: the caller then doubles); with a single
        success it is ``(peak - resident) / batch``, an over-estimate. A measured OOM
        above the anchor proves ``S >= (demand - anchor peak) / (batch - anchor batch)``.
        """
        if self.oks:
            top = max(self.oks, key=lambda o: o.batch_size)
            below = [o for o in self.oks if o.batch_size < top.batch_size]
            if below:
                near = max(below, key=lambda o: o.batch_size)
                slope = (top.peak - near.peak) / (top.batch_size - near.batch_size)
            else:
                slope = (top.peak - top.resident) / top.batch_size
            bounds = [
                (o.peak - top.peak) / (o.batch_size - top.batch_size)
                for o in self.ooms
                if o.batch_size > top.batch_size
            ]
            per_sample = max([slope, *bounds])
            return Line(top.peak - per_sample * top.batch_size, per_sample)
        if self.line is not None:
            bounds = [(o.peak - self.line.fixed) / o.batch_size for o in self.ooms]
            return Line(self.line.fixed, max([self.line.per_sample, *bounds]))
        if self.ooms:
            fixed = float(self.ooms[-1].resident)
            return Line(fixed, max((o.peak - o.resident) / o.batch_size for o in self.ooms))
        return None

    def solve(self, *, optimistic: bool = False) -> int | None:
        """The size the fitted line predicts for the usable bytes (`room`), if it can tell."""
        line = self.model()
        room = self.room(optimistic=optimistic)
        if line is None or room is None or line.per_sample <= 0:
            return None
        return line.solve(room)

    def room(self, *, optimistic: bool = False) -> int | None:
        """Usable bytes, lowered when an OOM struck below the budget.

        Such an OOM came from memory the meter does not see (another process, the
        allocator's fragmentation): the card gave out between the bytes held then and
        those plus the refused request (``optimistic``), less the margin's share.
        """
        if self.usable is None or self.budget is None or self.ceiling is None:
            return self.usable
        ceiling = self.ceiling[1 if optimistic else 0]
        return min(self.usable, math.floor(ceiling * self.usable / self.budget))

    def explained(self) -> bool:
        """Whether the fitted line foresees every out-of-memory error seen so far.

        It does when it puts each failed size above the usable bytes. An OOM it does not
        foresee (fragmentation, another process, cuDNN or NCCL handles, a kernel's
        scratch: memory the meter does not see) makes it optimistic, and the search
        stops following it: it shrinks, then bisects.
        """
        line = self.model()
        room = self.room()
        if line is None or room is None or len(self.ooms) < self.failed:
            return False
        return all(line.at(o.batch_size) > room for o in self.ooms)

    def close(self) -> bool:
        """True when the last success and the smallest failure are within ``_CLOSE``."""
        if self.hi is None:
            return False
        exact = self.probe_upward and self.model() is None
        return self.hi - self.lo <= 1 or (not exact and self.hi <= self.lo * _CLOSE)

    def after_oom(self, batch_size: int) -> int:
        """The next size after an out-of-memory error at ``batch_size``.

        Every size tried was one the model said fits, so an OOM is a surprise. Right
        after a success whose step was measured, an OOM the meter saw (its bytes past
        the budget) gives the secant from that success: its size is tried once. Else,
        with a size that ran below, bisect between them (`bisect`); with none, shrink
        by a real factor, never above what the model still allows. Once size 1 has
        failed too, the sizes the shrinking skipped are tried, smallest first
        (`walk_back`), unless the measured line explains every OOM.
        """
        self.hi = batch_size if self.hi is None else min(self.hi, batch_size)
        self.streak += 1
        if self.lo:
            last = self.ooms[-1] if self.ooms else None
            seen = (
                last is not None
                and last.batch_size == batch_size
                and self.budget is not None
                and last.peak > self.budget
            )
            solved = self.solve() if seen and self.streak == 1 else None
            if solved is not None and self.explained() and self.lo < solved < self.hi:
                return solved
            self.bisecting = not self.close()
            return 0
        solved = self.solve()
        numerator, denominator = _SHRINK if self.streak == 1 else _HALVE
        nxt = self.hi * numerator // denominator
        nxt = min(nxt if solved is None else min(solved, nxt), self.hi - 1)
        nxt = max(nxt, min(1, self.hi - 1))
        return nxt or self.walk_back()

    def walk_back(self) -> int:
        """After every size down to 1 failed: the smallest size skipped (0: give up).

        A line fitted to measured steps that puts every failed size past the usable
        bytes (the model itself does not fit) means no smaller size can run: 0. Else
        memory may not grow with the batch (a kernel chosen by shape, a cuDNN refusal
        of some shapes), so a skipped size may run where a smaller one did not, and the
        search tries each one, smallest first, while trials remain: after 128, 89,
        44, 22, 11, 5, 2 and 1 fail, it tries 3, 4, 6, 7, 8, ...
        """
        if self.explained() or not self.failed_sizes:
            return 0
        top = max(self.failed_sizes)
        return next((b for b in range(1, top) if b not in self.tried), 0)

    def after_ok(self, batch_size: int) -> int:
        """The next size after ``batch_size`` ran (0: stop, or bisect when `bisecting`)."""
        self.lo = max(self.lo, batch_size)
        self.streak = 0
        if self.hi is not None and self.hi <= self.lo:
            # A walk back found a size that runs above one that failed: the bracket
            # now ends at the smallest failure above it.
            self.hi = min((b for b in self.failed_sizes if b > self.lo), default=None)
        if self.hi is not None and not self.explained():
            # The measured steps do not foresee the failure above: bisect, not extrapolate.
            self.bisecting = not self.close()
            return 0
        if not self.probe_upward:
            # After a back-off, the measured step may show room below the size that ran
            # out of memory: close that gap (never above the first size tried).
            solved = self.solve() if self.oks and self.hi is not None else None
            if solved is None or self.hi is None:
                return 0
            nxt = min(self.capped(solved), self.hi - 1)
            if nxt > self.lo:
                return nxt
            # Out of sizes the line surely allows: bisect up to where the line crosses
            # the bytes at which an OOM struck below the budget (no size above can run).
            line = self.model()
            if line is not None and line.per_sample > 0 and self.ceiling is not None:
                self.hi = min(self.hi, max(line.solve(self.ceiling[1]) + 1, self.lo + 1))
                self.bisecting = not self.close()
            return 0
        solved = self.solve() if self.oks else None
        if solved is None:  # nothing measured, or a flat peak: double, then bisect
            solved = 2 * self.lo if self.hi is None else (self.lo + self.hi) // 2
        elif len(self.oks) == 1 and (room := self.room()) is not None and self.oks[0].peak < room:
            # One point cannot tell a flat peak (set by the optimizer step) from a steep
            # line; with bytes to spare, a second point one size up gives the secant.
            solved = max(solved, self.lo + 1)
        nxt = self.capped(solved)
        if self.hi is not None:
            nxt = min(nxt, self.hi - 1)
        return nxt if nxt > self.lo else 0

    def bisect(self, run: Callable[[int], bool | None]) -> None:
        """Bisect between the last success and the smallest failure, on a geometric grid.

        ``run(size)`` runs one trial (True: it ran; None: out of trials, which counts
        as a failure, so the answer stays a size that ran). The grid steps by at most
        ``_CLOSE`` (and at least 1), so the search ends within 10% of the largest size
        that runs. A short bracket (up to 4 sizes inside) is walked up one size at a
        time, so it costs one OOM at most; a longer one is galloped up from the success
        (`gallop`: the next grid point, then doubling the step), then bisected
        (`last_true`). The two ends, which are known, are not tried. Probing upward with
        nothing measured (no model to be wrong, OOMs expected), it finds the exact size.
        """
        assert self.hi is not None  # noqa: S101 - set by the OOM that started it
        ratio = 1.0 if self.probe_upward and self.model() is None else _CLOSE
        grid = [self.lo]
        while grid[-1] < self.hi:
            grid.append(min(max(math.floor(grid[-1] * ratio), grid[-1] + 1), self.hi))

        def runs(index: int) -> bool:
            ok = run(grid[index])
            if ok:
                self.lo = max(self.lo, grid[index])
            elif ok is not None:
                self.hi = min(self.hi or grid[index], grid[index])
            return bool(ok)

        top = len(grid) - 1  # the failure, not tried again
        if top <= _WALK:  # a short bracket: walked up, at most one OOM
            next(filter(lambda index: not runs(index), range(1, top)), None)
        else:  # from the bottom (OOMs are the cost), then bisection
            good, bad = gallop(runs, 0, 1, limit=top - 1)
            last_true(runs, good, min(bad, top))
        self.bisecting = False

    def capped(self, batch_size: int) -> int:
        """``batch_size`` within the user's limit, and at least 1."""
        return max(1, batch_size if self.cap is None else min(batch_size, self.cap))

    def chosen(self) -> int:
        """The largest verified size, shrunk (never grown) to keep the margin.

        It shrinks when that step was measured above the usable bytes.
        """
        solved = self.solve(optimistic=True) if self.oks else None
        return self.lo if solved is None else max(min(self.lo, solved), 1)
