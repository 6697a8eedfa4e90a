"""Mixed precision: the dtype choice, autocast, and the scaled optimizer step, done right.

`torch.amp` does the work; `MixedPrecision` only puts its calls in the one correct order
and keeps the bookkeeping that training loops often get partly wrong: scale -> backward ->
unscale once per optimizer -> clip -> step -> one update (PyTorch's "Automatic Mixed
Precision examples" page); gradient accumulation that steps only at window boundaries; a
skipped (inf/nan) step that does not advance the scheduler and is counted (Lightning issue
#16228: the scheduler advances anyway); a state dict that resumes exactly (transformers
issue #34053: a wrongly restored scale); and checks that catch a halved or quantized model
before the first backward.

How a skipped step is detected. With a GradScaler (fp16), `step` calls
``GradScaler.unscale_`` for every optimizer itself, then reads the inf/nan flags that
unscaling recorded (``GradScaler._found_inf_per_device``, private but the same flags
``GradScaler.step`` reads; if a future torch drops it, the gradients are checked
directly). One ``.item()`` decides for all optimizers, before any of them steps. The
public signals are weaker: comparing the scale before and after ``update()`` costs a
second sync after the step has been queued, and watching whether ``optimizer.step`` was
called (accelerate 1.15's ``AcceleratedOptimizer``) misses fused optimizers, whose step
is always called and skips inside the kernel (run here: fused AdamW, GradScaler("cpu"),
an inf loss: ``step_was_skipped`` False and the scheduler advanced).
"""

from torchfit.precision.choice import Precision, PrecisionChoice, choose_precision, parse_precision
from torchfit.precision.mixed import MixedPrecision
from torchfit.precision.nonfinite import NonFinite, NonFiniteCause, NonFiniteProbe, find_nonfinite
from torchfit.precision.step import NonFiniteCheck, StepOutcome

__all__ = [
    # the training step
    "MixedPrecision",
    "NonFiniteCheck",
    "StepOutcome",
    # which precision
    "Precision",
    "PrecisionChoice",
    "choose_precision",
    "parse_precision",
    # where inf/nan came from
    "NonFinite",
    "NonFiniteCause",
    "NonFiniteProbe",
    "find_nonfinite",
]
