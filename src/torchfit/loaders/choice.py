"""How `tuned_loader` chooses among measured trials: pure rules, no measurement."""

from __future__ import annotations

from torchfit.loaders.report import LoaderConfig, LoaderTrial, plural

__all__ = ["PERSISTENT_SHARE", "TIE", "fastest_fewest", "in_words", "persistence"]

#: Among trials within 2% of the best, the fewest workers (then the smallest prefetch)
#: wins: the same speed for less memory.
TIE = 0.98
#: Worker start-up costing this share of an epoch makes workers persistent.
PERSISTENT_SHARE = 0.01


def fastest_fewest(trials: list[LoaderTrial]) -> LoaderTrial | None:
    """The trial with the fewest workers (then prefetch) within `TIE` of the fastest.

    Example:
        >>> fast = LoaderTrial(LoaderConfig(8, 2), 1000.0, 0.1, 10, 1.0, "")
        >>> close = LoaderTrial(LoaderConfig(4, 2), 990.0, 0.1, 10, 1.0, "")
        >>> fastest_fewest([fast, close]).config.num_workers
        4
    """
    if not trials:
        return None
    top = max(trial.samples_per_s for trial in trials)
    return min(
        (trial for trial in trials if trial.samples_per_s >= TIE * top),
        key=lambda trial: (trial.config.num_workers, trial.config.prefetch_factor or 0),
    )


def persistence(startup_s: float, epoch_s: float) -> tuple[bool, str]:
    """Whether workers should persist across epochs, and the reason in words.

    Example:
        >>> persistence(0.5, 10.0)[0], persistence(0.01, 100.0)[0]
        (True, False)
    """
    share = startup_s / max(epoch_s, 1e-9)
    keep = share >= PERSISTENT_SHARE
    reason = (
        f"persistent_workers {'on' if keep else 'off'}: worker start-up took "
        f"{startup_s:.2f} s, {share:.1%} of a {epoch_s:.1f} s epoch "
        f"(on from {PERSISTENT_SHARE:.0%})"
    )
    return keep, reason


def in_words(cfg: LoaderConfig) -> str:
    """A configuration in a few words, for the reasons a report gives."""
    if not cfg.num_workers:
        return "loading in the main process (0 workers)"
    return f"{plural(cfg.num_workers, 'worker')} with prefetch {cfg.prefetch_factor}"
