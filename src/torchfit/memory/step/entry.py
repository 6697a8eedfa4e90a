"""The step an entry point (`estimate`, `fits`, `step_time`) was given: a `Step`, or keywords."""

from __future__ import annotations

from typing import Any

from torchfit._core.units import parse_dtype
from torchfit.memory.gpus import GPU
from torchfit.memory.step.built import with_built
from torchfit.memory.step.description import Step
from torchfit.memory.step.spellings import AUTO

__all__ = ["card_step", "given_step"]


def given_step(step: Any, keywords: dict[str, Any], *, where: str, model: Any = None) -> Step:
    """``step``, or the `Step` ``keywords`` make (`Step.of`); never both.

    A ``model`` already built (a ``PeftModel``, a model loaded in 4 bits) adds what it says
    (`torchfit.memory.step.built`): its adapters, quantization and base dtype.

    Raises:
        TypeError: both, or something else than a `Step` where one goes.

    Example:
        >>> given_step(None, {"batch_size": 4}, where="estimate(model, step)").batch_size
        4
    """
    if step is None:
        built = with_built(model, None, keywords)
        return Step.of(**(keywords if built is None else built))
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
    built = with_built(model, step, {})
    return step if built is None else Step.of(**built)


def card_step(
    step: Step | None, keywords: dict[str, Any], card: GPU, *, where: str, model: Any = None
) -> Step:
    """The step an entry point with a card runs (`fits`, `step_time`): its precision chosen.

    ``step``, or the one ``keywords`` make. Without ``precision`` (and with ``dtype`` left
    out, ``"auto"`` or a 4/8-bit format) the card picks, as ``precision="auto"`` does:
    bf16 where it has native bf16, else fp16, mixed in training.

    Raises:
        ValueError: a CPU step (``device="cpu"``): a card runs CUDA kernels.
        TypeError: both a `Step` and keywords, or something else than a `Step`.

    Example:
        >>> from torchfit.memory.gpus import gpu
        >>> card_step(None, {"batch_size": 2}, gpu("T4"), where="fits").precision
        '16-mixed'
    """
    if step is None:
        keywords = {k: v for k, v in keywords.items() if k != "precision" or v is not None}
        dtype = keywords.get("dtype", AUTO)
        if str(dtype).strip().lower() == AUTO:
            keywords.pop("dtype", None)
            keywords.setdefault("precision", AUTO)
        elif "precision" not in keywords and _is_quantized(dtype):
            keywords["precision"] = AUTO
    chosen = given_step(step, keywords, where=where, model=model)
    if chosen.device != "cuda":
        raise ValueError(
            f"{where} runs the step on a CUDA card; got Step(device={chosen.device!r}): "
            "leave device out (or pass 'cuda'), or estimate a CPU step with torchfit.estimate"
        )
    return chosen.for_card(card.bf16)


def _is_quantized(dtype: Any) -> bool:
    """``dtype`` names a 4/8-bit format (an unknown name is left for `Step` to refuse)."""
    try:
        return parse_dtype(dtype).is_quantized
    except (ValueError, TypeError):
        return False
