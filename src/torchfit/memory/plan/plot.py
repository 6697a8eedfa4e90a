"""Memory against batch size, with the card's line (needs the ``plot`` extra)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torchfit._core.imports import require

if TYPE_CHECKING:
    from torchfit.memory.plan import Plan

__all__ = ["plot_plan"]


def plot_plan(model: Any, plan: Plan, path: str) -> None:
    """Save a PNG of device memory against batch size, the card's memory as a line."""
    require("matplotlib", feature="--plot")
    import matplotlib as mpl  # noqa: PLC0415

    mpl.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    from torchfit.memory.allocator import to_device  # noqa: PLC0415
    from torchfit.memory.estimator import estimate  # noqa: PLC0415

    top = max(2 * max(plan.max_batch_size, 1), 8)
    sizes = sorted({max(1, round(top * k / 16)) for k in range(17)})
    gib = 2**30
    totals = []
    for size in sizes:
        kwargs = {**plan.settings.kwargs(), "batch_size": size}
        totals.append(
            to_device(estimate(model, device="cuda", **kwargs), gpu=plan.gpu).device_total
        )
    figure, axes = plt.subplots(figsize=(7, 4))
    axes.plot(sizes, [t / gib for t in totals], marker="o", label="device total (estimate)")
    axes.axhline(plan.budget / gib, color="red", linestyle="--", label=plan.gpu.name)
    if plan.max_batch_size:
        axes.axvline(plan.max_batch_size, color="gray", linestyle=":", label="largest batch")
    s = plan.settings
    axes.set_title(f"{s.model}: {s.mode}, {s.dtype}" + (f", seq {s.seq_len}" if s.seq_len else ""))
    axes.set_xlabel("batch size")
    axes.set_ylabel("GiB")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
