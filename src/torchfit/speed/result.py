"""`StepTime`: how long one step takes on one card, what it does per second, what it costs."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

__all__ = ["KindTime", "StepTime"]

_HOUR = 3600.0


@dataclasses.dataclass(frozen=True)
class KindTime:
    """The time of one class of kernels in one phase.

    Attributes:
        kind: ``"matmul"``, ``"conv"``, ``"attention"``, ``"memory"``, ``"dequant"``,
            ``"comm"`` (data-parallel communication not hidden by compute).
        phase: ``"forward"``, ``"backward"`` or ``"optimizer"``.
        seconds: Their predicted time.
        flops: Their floating-point operations.
        bytes: Bytes they read and write.
        kernels: How many kernels.
    """

    kind: str
    phase: str
    seconds: float
    flops: float
    bytes: float
    kernels: int


def _check_price(price_per_hour: float) -> float:
    if isinstance(price_per_hour, bool) or not isinstance(price_per_hour, int | float):
        raise TypeError(
            f"price_per_hour must be a number (currency per card-hour); got {price_per_hour!r}"
        )
    if not math.isfinite(price_per_hour) or price_per_hour < 0:
        raise ValueError(
            f"price_per_hour must be a finite number >= 0, e.g. 2.5 for $2.50 per card-hour; "
            f"got {price_per_hour!r}"
        )
    return float(price_per_hour)


#: The share of a step the GPU waits for the host from which the table says so.
HOST_BOUND = 0.1


@dataclasses.dataclass(frozen=True)
class StepTime:
    """The predicted time of one optimizer step (or one inference call) on one card.

    Attributes:
        model: The model's name.
        gpu: The card's name.
        seconds: One step, GPU-bound (see ``notes`` for what is not modelled).
        samples: Samples per step (all micro-batches).
        tokens: Tokens per step for language models (new tokens for generation), else None.
        model_flops: The model's FLOPs per step: forward and backward once each, without
            recomputation (what MFU counts).
        peak_flops: The card's dense peak for the step's compute dtype (MFU's denominator).
        breakdown: Time by kernel class and phase (`KindTime` rows).
        notes: How the numbers were made and what they leave out.
        gpus: Cards the step runs on (data parallel: samples, tokens and FLOPs are the
            job's, the peak is theirs together, and `cost` is per card-hour of each).
        parameters: The model's parameters (0 where not counted).
        trainable: Those that train (adapters only for LoRA).

    Example:
        >>> t = StepTime("m", "card", 0.5, 8, 8192, 1e15, 1e15, (), ())
        >>> t.samples_per_s, t.tokens_per_s, t.mfu
        (16.0, 16384.0, 2.0)
        >>> round(t.hours(tokens=1e9), 2), round(t.cost(2.0, tokens=1e9), 2)
        (16.95, 33.91)
    """

    model: str
    gpu: str
    seconds: float
    samples: int
    tokens: int | None
    model_flops: float
    peak_flops: float
    breakdown: tuple[KindTime, ...]
    notes: tuple[str, ...]
    gpus: int = 1
    parameters: int = 0
    trainable: int = 0

    @property
    def samples_per_s(self) -> float:
        """Samples per second."""
        return self.samples / self.seconds

    @property
    def tokens_per_s(self) -> float | None:
        """Tokens per second (None for models without tokens)."""
        return None if self.tokens is None else self.tokens / self.seconds

    @property
    def mfu(self) -> float:
        """Model FLOPs utilization: model FLOPs per second over the card's dense peak."""
        return self.model_flops / self.seconds / self.peak_flops

    @property
    def host_share(self) -> float:
        """Share of the step the GPU waits for the host: the ``host`` rows of the breakdown.

        The host's kernel launches, a library's own Python, an optimizer that synchronizes
        after each parameter (`torchfit.speed.dispatch`).
        """
        return sum(row.seconds for row in self.breakdown if row.kind == "host") / self.seconds

    def hours(
        self,
        *,
        tokens: float | None = None,
        samples: float | None = None,
        epochs: float | None = None,
        dataset_size: int | None = None,
    ) -> float:
        """Hours (wall clock) for ``tokens``, ``samples``, or ``epochs`` of ``dataset_size``.

        Raises:
            ValueError: none or more than one amount, ``tokens`` for a model without
                tokens, ``epochs`` without ``dataset_size``, or a negative amount.
        """
        given = {"tokens": tokens, "samples": samples, "epochs": epochs}
        named = [name for name, value in given.items() if value is not None]
        if len(named) != 1:
            raise ValueError(
                f"give exactly one of tokens=, samples=, epochs= (with dataset_size=); got "
                f"{named or 'none'}"
            )
        amount = float(given[named[0]])  # type: ignore[arg-type]
        if not math.isfinite(amount) or amount < 0:
            raise ValueError(f"{named[0]} must be a finite number >= 0; got {amount!r}")
        if tokens is not None:
            if self.tokens_per_s is None:
                raise ValueError(
                    f"{self.model} has no tokens; give samples= or epochs= with dataset_size="
                )
            return amount / self.tokens_per_s / _HOUR
        if epochs is not None:
            if dataset_size is None or dataset_size < 1:
                raise ValueError(
                    f"epochs={epochs} needs dataset_size= (samples per epoch, >= 1); got "
                    f"{dataset_size!r}"
                )
            amount *= dataset_size
        return amount / self.samples_per_s / _HOUR

    def cost(self, price_per_hour: float, **amount: Any) -> float:
        """What `hours` (same keywords) costs at ``price_per_hour`` per card-hour, all cards."""
        return _check_price(price_per_hour) * self.hours(**amount) * self.gpus

    def phase_seconds(self, phase: str) -> float:
        """Predicted seconds of one phase: ``"forward"``, ``"backward"``, ``"optimizer"``."""
        return sum(row.seconds for row in self.breakdown if row.phase == phase)

    def to_dict(self) -> dict[str, Any]:
        """Every field and the derived rates as JSON-ready values."""
        data = dataclasses.asdict(self)
        data["breakdown"] = [dataclasses.asdict(row) for row in self.breakdown]
        data["notes"] = list(self.notes)
        data.update(
            samples_per_s=self.samples_per_s,
            tokens_per_s=self.tokens_per_s,
            mfu=self.mfu,
            host_share=self.host_share,
        )
        return data

    def __repr__(self) -> str:
        """One line: the step's time and rate (``print`` for the table by kernel class).

        Example:
            >>> from torchfit import step_time
            >>> step_time("gpt2", "H100", batch_size=8, seq_len=1024)  # doctest: +ELLIPSIS
            <StepTime gpt2 on NVIDIA H100 SXM: ... ms per step, ... tokens/s, MFU ...%>
        """
        rate = f"{self.samples_per_s:,.1f} samples/s"
        if self.tokens_per_s is not None:
            rate = f"{self.tokens_per_s:,.0f} tokens/s"
        return (
            f"<StepTime {self.model} on {self.gpu}: {self.seconds * 1e3:,.1f} ms per step, "
            f"{rate}, MFU {self.mfu:.0%}>"
        )

    def __str__(self) -> str:
        """A table: the step, the rates, then the time by kernel class and phase."""
        rate = f"{self.samples_per_s:,.1f} samples/s"
        if self.tokens_per_s is not None:
            rate += f", {self.tokens_per_s:,.0f} tokens/s"
        lines = [
            f"{self.model} on {self.gpu}: {self.seconds * 1e3:,.1f} ms per step",
            f"  {rate}, MFU {self.mfu:.0%}",
        ]
        if self.host_share >= HOST_BOUND:
            lines.append(
                f"  host-bound: the GPU waits {self.host_share:.0%} of the step for the host "
                "(launches, Python); more work per launch (a larger batch) hides it, fewer "
                "launches (torch.compile, CUDA graphs) shorten it"
            )
        lines.append("  kernels    phase            ms  share    TFLOP       GB      n")
        lines.extend(
            f"  {row.kind:<10} {row.phase:<9} {row.seconds * 1e3:9.2f} "
            f"{row.seconds / self.seconds:6.1%} {row.flops / 1e12:8.2f} "
            f"{row.bytes / 1e9:8.2f} {row.kernels:6d}"
            for row in sorted(self.breakdown, key=lambda r: -r.seconds)
        )
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)
