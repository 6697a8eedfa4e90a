"""Efficiency by op kind and size, from published measurements (each cited where used).

**Matmuls** take ``t = t0 + (tc^p + tm^p)^(1/p)``: ``tc`` the FLOPs at the card's
best matmul rate (peak x `Peaks.mamf`), ``tm`` the operand bytes (A, B and C once) at
``e_bw`` of the bandwidth, ``t0`` a fixed cost per kernel. ``t0``, ``p`` and ``e_bw``
are fitted (least squares on log time) to the H100 SXM matmul timings OpenXLA
publishes for its cost model (``xla/service/gpu/model/matmul_interpolator_data.h``,
``sm_90`` entries: batch 1-4, m, n, k from 256 to 4096; 67 bf16 and 24 f32 shapes
read), with the efficiency ceiling fixed to Bekman's MAMF for that card (80.3%):
bf16 fits with a median error of 4.5% (worst 24%). XLA's "f32" dots run on TF32 tensor
cores (above 67 TFLOP/s); those fit ``TF32`` with their own ceiling, 87%. PyTorch's
fp32 matmuls run on CUDA cores at the card's SGEMM share of its fp32 peak
(`torchfit.speed.cards.sgemm_share`: 75% on data-center SMs, 60% on GeForce-class
ones), taken with the bf16 fit's shape.

**Fused attention** (SDPA's FlashAttention-2 kernel) follows the FA2 columns of the
FlashAttention-3 paper's H100 SXM5 benchmarks (Shah et al. 2024, arXiv:2407.08608,
Figures 5 and 6: forward causal and not, backward, head dimension 64 and 128, sequence
512 to 16k), interpolated in log sequence length. Other architectures scale it by
FlashAttention-2's share of peak on an A100 against an H100 (73% forward on A100,
Dao 2023, arXiv:2307.08691; 35% on H100, FA3 paper): x1.95. The memory-efficient
kernel (fp32, or a mask) runs at 0.6 of that: FA2 is 1.3-2x xformers' kernel in Dao
2023's Figure 4-5 comparisons, taken at its low end.

**Dropout inside fused attention** draws a Philox random number for every score
element, forward and again in backward (the mask is regenerated, not stored), on the
integer units beside the tensor cores. Measured on the FlashAttention kernels that
draw the same mask as FA2 (bit-identical Philox stream): "dropout costs ~20-40% over
no-drop ... fwd ≈ 75-85%, bwd ≈ 60-70% of no-drop TFLOPS", roughly constant across
sequence lengths (Dao-AILab/flash-attention pull 2597, 2026, head sizes 64 and 128,
p = 0.125). `ATTENTION_DROPOUT` takes the middle of each range, for 16-bit attention on
tensor cores: an fp32 kernel's math runs on CUDA cores many times slower and hides the
random numbers (`torchfit.speed.roofline`).

**FlashAttention-2's tiles**: the kernel computes whole tiles of query rows by key
columns, so a sequence that is not a multiple of the tile pays for the padded one. The
tiles are FA2's launch templates (``csrc/flash_attn/src/flash_fwd_launch_template.h`` and
``flash_bwd_launch_template.h`` of Dao-AILab/flash-attention, vendored by PyTorch under
``aten/src/ATen/native/transformers/cuda/flash_attn/``): forward 128 x 128 for head
size 64 and below, 128 x 64 above; backward 128 x 128 for 64 and below, 64 x 128 above.
The FA3 paper's points are multiples of 128, so the curve gives the full-tile rate at
the padded length (`flash_padded`) and `flash_tile_fill` the share of it a ragged
sequence keeps: ViT-B/16's 197 tokens fill 197/256 of each tile dimension (41% of the
work is padding), so they take as long as 256 would. Sequences shorter than a
tile (decoding, one query) are memory-bound and left alone.

**Memory-bound kernels** stream at 83% of the datasheet bandwidth, what microbenchmarks
reach on HBM (750 of 900 GB/s on a V100: Jia et al. 2018, "Dissecting the NVIDIA Volta
GPU Architecture via Microbenchmarking", arXiv:1804.06826), plus 2 µs per kernel
(an assumption: the launch-to-finish time of an empty kernel, not a published figure).
On a V100 that rule stays within 10% of PyTorch's own measured size sweep (a contiguous
comparison kernel at 5 to 100 MB: 518 to 799 GB/s, github.com/pytorch/pytorch pull
69010), which a line through it puts at 3.6 µs plus 91% of the bandwidth.

**On Hopper** PyTorch's elementwise kernels pay a larger fixed part: ``torch.maximum``
in fp16 on an H200 (PyTorch 2.9.1, CUDA 12.8; 1,000 iterations timed with CUDA events)
moved 25.2, 62.9 and 125.8 MB at 1.83, 2.79 and 3.37 TB/s (github.com/tile-ai/TileOPs
issue 512 and pull 539), that is 13.8, 22.5 and 37.3 µs: a line through them is
7.8 µs plus 89% of the 4.8 TB/s (`HOPPER_MEMORY`). The same line meets that project's
other PyTorch figures on the H200 at 42 and 73 MB (``leaky_relu`` 2.57 TB/s, ``where``
2.99 TB/s, pull 500) within 10%, and an H100 sweep of ``gelu`` in fp32 from 134 MB to
1.07 GB (github.com/pytorch/pytorch pull 141959: 50.5 to 356.6 µs, 6.8 µs plus 92% of
3.35 TB/s). Below the smallest measured size the fixed part falls linearly to the 2 µs
of a near-empty kernel (an interpolation: no smaller size was measured), so a step of
tiny kernels stays bound by the host.
"""

from __future__ import annotations

import bisect
import dataclasses
import math

__all__ = [
    "ATTENTION_DROPOUT",
    "ATTENTION_OTHER_ARCH",
    "EFFICIENT_ATTENTION",
    "HOPPER_MEMORY",
    "MEMORY_EFFICIENCY",
    "MEMORY_KERNEL_S",
    "MatmulFit",
    "MemoryCurve",
    "attention_efficiency",
    "flash_padded",
    "flash_tile_fill",
    "matmul_fit",
    "memory_curve",
]

MEMORY_EFFICIENCY = 0.83
MEMORY_KERNEL_S = 2e-6


@dataclasses.dataclass(frozen=True)
class MemoryCurve:
    """A memory-bound kernel's time: a fixed part plus its bytes at a share of the bandwidth.

    Attributes:
        efficiency: Share of the datasheet bandwidth the bytes stream at.
        fixed_s: Fixed seconds of a kernel at least ``measured_from`` bytes large.
        measured_from: The smallest measured size; below it the fixed part falls
            linearly to `MEMORY_KERNEL_S` (0: no such size, ``fixed_s`` throughout).
    """

    efficiency: float
    fixed_s: float
    measured_from: float = 0.0

    def seconds(self, moved: float, bandwidth: float) -> float:
        """Seconds of one kernel reading and writing ``moved`` bytes.

        Example:
            >>> round(HOPPER_MEMORY.seconds(125.8e6, 4.8e12) * 1e6)  # measured: 37.3 µs
            37
        """
        fixed = self.fixed_s
        if self.measured_from and moved < self.measured_from:
            fixed = MEMORY_KERNEL_S + (fixed - MEMORY_KERNEL_S) * moved / self.measured_from
        return moved / (bandwidth * self.efficiency) + fixed


#: PyTorch's elementwise kernels on Hopper (module notes: a line through the H200 points).
HOPPER_MEMORY = MemoryCurve(efficiency=0.89, fixed_s=7.8e-6, measured_from=25.2e6)
_DEFAULT_MEMORY = MemoryCurve(efficiency=MEMORY_EFFICIENCY, fixed_s=MEMORY_KERNEL_S)


def memory_curve(*, hopper: bool) -> MemoryCurve:
    """The memory-bound curve of a card: Hopper's measured one, else the V100-era rule.

    Example:
        >>> memory_curve(hopper=True).fixed_s, memory_curve(hopper=False).efficiency
        (7.8e-06, 0.83)
    """
    return HOPPER_MEMORY if hopper else _DEFAULT_MEMORY


ATTENTION_OTHER_ARCH = 0.73 / 0.374
EFFICIENT_ATTENTION = 0.6
#: Share of its no-dropout rate fused attention keeps with dropout, forward and
#: backward (module notes: the middle of 75-85% and 60-70%).
ATTENTION_DROPOUT = {"forward": 0.80, "backward": 0.65}


class MatmulFit:
    """The fitted matmul curve: ceiling share, bandwidth share, exponent, fixed time."""

    def __init__(
        self, ceiling: float | None, bandwidth: float, power: float, fixed_s: float
    ) -> None:
        """``ceiling`` None means the card's own MAMF."""
        self.ceiling = ceiling
        self.bandwidth = bandwidth
        self.power = power
        self.fixed_s = fixed_s

    def seconds(
        self, flops: float, moved: float, *, peak: float, bandwidth: float, mamf: float
    ) -> float:
        """Time of one matmul of ``flops`` FLOPs and ``moved`` operand bytes.

        Example:
            >>> fit = matmul_fit("bf16")
            >>> h100 = {"peak": 989.5e12, "bandwidth": 3350e9, "mamf": 0.803}
            >>> t = fit.seconds(2 * 4096**3, 3 * 2 * 4096**2, **h100)
            >>> round(2 * 4096**3 / t / 1e12)  # XLA measured 783 TFLOP/s for this shape
            767
        """
        compute = flops / (peak * (self.ceiling or mamf))
        memory = moved / (bandwidth * self.bandwidth)
        combined: float = (compute**self.power + memory**self.power) ** (1 / self.power)
        return self.fixed_s + combined


_FITS = {
    "tensor": MatmulFit(None, 1.0, 3.0, 6.0e-6),  # bf16/fp16 on sm_90 (module notes)
    "tf32": MatmulFit(0.87, 0.7, 1.5, 7.75e-6),  # XLA's f32 dots (TF32) on sm_90
    "fp32": MatmulFit(None, 1.0, 3.0, 6.0e-6),  # the card's SGEMM share, bf16's shape
}


def matmul_fit(math_kind: str) -> MatmulFit:
    """The curve for ``"bf16"``/``"fp16"`` (tensor cores), ``"tf32"`` or ``"fp32"``.

    A ceiling of None is the card's own: `Peaks.mamf` on tensor cores, `Peaks.sgemm` for
    fp32 on CUDA cores (the caller passes it as ``mamf``).

    Example:
        >>> matmul_fit("tf32").ceiling
        0.87
    """
    if math_kind in {"bf16", "fp16"}:
        return _FITS["tensor"]
    return _FITS[math_kind]


_SEQ = (512, 1024, 2048, 4096, 8192, 16384)
# TFLOP/s of FlashAttention-2 on an H100 SXM5 (FA3 paper, Figures 5-6), per sequence length.
_FA2_H100: dict[tuple[str, bool, int], tuple[float, ...]] = {
    ("forward", False, 64): (282, 306, 318, 321, 322, 324),
    ("forward", False, 128): (309, 350, 362, 368, 370, 370),
    ("forward", True, 64): (180, 229, 262, 284, 295, 299),
    ("forward", True, 128): (191, 260, 298, 319, 333, 335),
    ("backward", False, 64): (198, 238, 264, 279, 287, 291),
    ("backward", False, 128): (214, 260, 291, 310, 318, 322),
}
_H100_BF16 = 989.5


def _interpolate(values: tuple[float, ...], seq: int) -> float:
    """Linear in log2(sequence) between the points, the end slopes carried beyond them."""
    x = math.log2(max(seq, 16))
    xs = [math.log2(s) for s in _SEQ]
    i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    lo, hi = xs[i - 1], xs[i]
    y = values[i - 1] + (values[i] - values[i - 1]) * (x - lo) / (hi - lo)
    return max(y, 0.05 * values[0]) if x < xs[0] else min(y, values[-1]) if x > xs[-1] else y


def _fa2(phase: str, *, causal: bool, head_dim: int, seq: int) -> float:
    """FA2's H100 TFLOP/s for these settings (backward causal scaled as forward's)."""

    def at(dim: int) -> float:
        if phase == "backward" and causal:
            base = _interpolate(_FA2_H100[("backward", False, dim)], seq)
            ratio = _interpolate(_FA2_H100[("forward", True, dim)], seq) / _interpolate(
                _FA2_H100[("forward", False, dim)], seq
            )
            return base * ratio
        return _interpolate(_FA2_H100[(phase, causal, dim)], seq)

    if head_dim <= 64:
        return at(64) * float(min(1.0, head_dim / 64) ** 0.5)
    if head_dim >= 128:
        return at(128)
    share = (head_dim - 64) / 64
    return at(64) * (1 - share) + at(128) * share


def attention_efficiency(
    *,
    backward: bool,
    causal: bool,
    head_dim: int,
    seq: int,
    hopper: bool,
    backend: str,
    dropout: bool = False,
) -> float:
    """Share of the dense 16-bit peak fused attention reaches (module notes).

    Example:
        >>> round(attention_efficiency(backward=False, causal=False, head_dim=128,
        ...       seq=4096, hopper=True, backend="flash"), 3)  # 368 of 989.5 TFLOP/s
        0.372
    """
    share = _fa2("backward" if backward else "forward", causal=causal, head_dim=head_dim, seq=seq)
    share /= _H100_BF16
    if not hopper:
        share = min(share * ATTENTION_OTHER_ARCH, 0.75)
    if backend != "flash":
        share *= EFFICIENT_ATTENTION
    if dropout:
        share *= ATTENTION_DROPOUT["backward" if backward else "forward"]
    return share


def _flash_tile(head_dim: int, *, backward: bool) -> tuple[int, int]:
    """FA2's (query rows, key columns) per tile on sm80/sm90 (module notes)."""
    if backward:
        return (128, 128) if head_dim <= 64 else (64, 128)
    return (128, 128) if head_dim <= 64 else (128, 64)


def flash_padded(seq_q: int, seq_k: int, head_dim: int, *, backward: bool) -> tuple[int, int]:
    """The query and key lengths FlashAttention-2 computes: each rounded up to whole tiles.

    A dimension shorter than one tile (decoding's single query) is left as it is.

    Example:
        >>> flash_padded(197, 197, 64, backward=False), flash_padded(1, 4096, 128, backward=False)
        ((256, 256), (1, 4096))
    """
    rows, columns = _flash_tile(head_dim, backward=backward)

    def pad(size: int, tile: int) -> int:
        return size if size < tile else math.ceil(size / tile) * tile

    return pad(seq_q, rows), pad(seq_k, columns)


def flash_tile_fill(seq_q: int, seq_k: int, head_dim: int, *, backward: bool) -> float:
    """Share of FlashAttention-2's padded tiles that holds real rows and columns.

    Example:
        >>> round(flash_tile_fill(197, 197, 64, backward=False), 3)  # ViT-B/16: 197 of 256
        0.592
        >>> flash_tile_fill(2048, 2048, 128, backward=True)
        1.0
    """
    padded_q, padded_k = flash_padded(seq_q, seq_k, head_dim, backward=backward)
    return seq_q * seq_k / (padded_q * padded_k)
