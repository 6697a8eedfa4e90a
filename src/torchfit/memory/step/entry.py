"""The step an entry point (`estimate`, `fits`) was given: a `Step`, or keywords for one."""

from __future__ import annotations

from typing import Any

from torchfit.memory.step.description import Step

__all__ = ["given_step"]


def given_step(step: Any, keywords: dict[str, Any], *, where: str) -> Step:
    """``step``, or the `Step` ``keywords`` make (`Step.of`); never both.

    Raises:
        TypeError: both, or something else than a `Step` where one goes.

    Example:
        >>> given_step(None, {"batch_size": 4}, where="estimate(model, step)").batch_size
        4
    """
    if step is None:
        return Step.of(**keywords)
    if not isinstance(step, Step):
        raise TypeError(
            f"{where}: the step must be a torchfit.Step; got {type(step).__name__} "
            f"{step!r}: pass the step's settings by name (batch_size=...) or as Step(...)"
        )
    if keywords:
        names = ", ".join(f"{k}=" for k in keywords)
        raise TypeError(
            f"{where}: a Step and step keywords ({names}) together; change the step "
            f"instead: step.replace({names.replace('=', '=...')})"
        )
    return step
