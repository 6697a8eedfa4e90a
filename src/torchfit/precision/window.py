"""One accumulation window of `MixedPrecision`: its micro-batches, weights and losses.

A window is the micro-batches between two optimizer steps. It remembers how many have
finished, whether a backward ran since the last `MixedPrecision.step` (several backwards
in one micro-batch are allowed: several losses, a gradient penalty), whether weights
were given (for all micro-batches or none), and whether every loss was finite (read at
once on a CPU, batched into one sync at the boundary elsewhere).
"""

from __future__ import annotations

import math

import torch

__all__ = ["Window"]


class Window:
    """The bookkeeping of the current accumulation window.

    Example:
        >>> w = Window()
        >>> w.note_backward(weighted=False)
        >>> w.note_loss(torch.tensor(float("nan")))
        >>> w.pending, w.losses_finite()
        (True, False)
    """

    def __init__(self) -> None:
        """An empty window at a boundary."""
        self.micro = 0  # micro-batches finished in this window
        self.pending = False  # a backward ran since the last step()
        self.weighted: bool | None = None  # whether this window's backward() got weight=
        self._finite = True  # every CPU loss of this window was finite
        self._device_losses: list[torch.Tensor] = []  # this window's non-CPU losses, unread

    def note_backward(self, *, weighted: bool) -> None:
        """Record a backward; refuse weights given for only part of the window."""
        if self.weighted is None:
            self.weighted = weighted
        elif self.weighted != weighted:
            raise ValueError(
                "backward() got weight= for only some micro-batches of this accumulation "
                "window; pass it for every micro-batch of a window or for none"
            )
        self.pending = True

    def note_loss(self, loss: torch.Tensor) -> None:
        """Remember whether ``loss`` was finite: read now on a CPU, at the boundary elsewhere."""
        if loss.device.type == "cpu":
            # ``.item()`` of a CPU scalar costs well under a microsecond
            self._finite = self._finite and math.isfinite(loss.item())
        else:
            self._device_losses.append(loss.detach())

    def losses_finite(self) -> bool:
        """Whether every loss of the window was finite (one sync for non-CPU losses); reset."""
        finite = self._finite
        if finite and self._device_losses:
            finite = bool(torch.stack(self._device_losses).isfinite().all())
        self._finite, self._device_losses = True, []
        return finite

    def close(self) -> bool:
        """End the window at a boundary; return whether its backwards were weighted."""
        weighted = bool(self.weighted)
        self.micro, self.pending, self.weighted = 0, False, None
        return weighted
