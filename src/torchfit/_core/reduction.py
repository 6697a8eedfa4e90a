"""The staging buffer of CUDA's reduction kernel, from the reduction's shape and the card.

ATen's generic reduction (``gpu_reduce_kernel`` in ``aten/src/ATen/native/cuda/
Reduce.cuh``; ``sum``, ``mean``) picks a launch from the shape (``setReduceConfig``).
When each output has many inputs and the outputs are few, it splits every output's
inputs over several thread blocks ("global reduce"): the blocks write partial results to
a staging buffer and count themselves done in a semaphore array, both allocated through
the caching allocator after the output and freed when the kernel has been queued. The
buffer holds one accumulator per (output, block along the inputs, lane):

    accumulator bytes x outputs x blocks per output [x block width x vector width]

where the bracket applies when the inputs are not along the fastest-moving dimension
(each lane of a warp owns its own outputs). The blocks per output depend on the card:
the launch aims at filling every SM (multiprocessors x resident threads per SM / threads
per block), capped so each thread still sums 16 values.

Checked against ``torch.cuda.memory`` snapshots of training steps on an H200 (torch 2.11,
CUDA 13.0): every staging buffer of GPT-2, Llama-3.2-1B and ViT-B/16 steps (77,463,552,
138,412,032, 139,198,464, 50,331,648 and 134,217,728 bytes) is what `Reduction` gives;
`torchfit.memory.kernels.cuda_reduce` reads a `Reduction` off an op's arguments.
"""

from __future__ import annotations

import dataclasses

__all__ = ["REFERENCE_SMS", "REFERENCE_THREADS", "Reduction", "output_vector", "threads_per_sm"]

#: The card a trace sizes its staging buffers for when no card is named: an H100/H200
#: (132 SMs of 2048 threads), the largest common one, so an unknown card is not
#: under-estimated.
REFERENCE_SMS = 132
REFERENCE_THREADS = 2048

#: Resident threads per SM by compute capability, where it is not 2048: the CUDA C++
#: Programming Guide, "Compute Capabilities", table "Technical Specifications per
#: Compute Capability" (Turing 1024; the GA10x/AD10x/GB20x consumer parts 1536).
_THREADS_PER_SM = {(7, 5): 1024, (8, 6): 1536, (8, 9): 1536, (12, 0): 1536, (12, 1): 1536}

_MAX_THREADS = 512  # ReduceConfig::MAX_NUM_THREADS
_WARP = 32
_MIN_VALUES, _MAX_VALUES = 16, 256  # min/max_values_per_thread of setReduceConfig


def threads_per_sm(compute_capability: tuple[int, int] | None) -> int:
    """Resident threads per SM of a card (2048 when its compute capability is unknown).

    Example:
        >>> threads_per_sm((9, 0)), threads_per_sm((8, 6)), threads_per_sm(None)
        (2048, 1536, 2048)
    """
    if compute_capability is None:
        return REFERENCE_THREADS
    major, minor = compute_capability
    return _THREADS_PER_SM.get((major, minor), REFERENCE_THREADS)


def output_vector(*extents: int) -> int:
    """Outputs each thread loads at once: the widest of 4, 2, 1 dividing every extent.

    ``get_output_vec_size`` in Reduce.cuh starts at 4 and halves it until it divides the
    kept dimension's size and the other dimensions' strides (in elements).

    Example:
        >>> output_vector(768, 768), output_vector(30522), output_vector(7)
        (4, 2, 1)
    """
    return next(v for v in (4, 2, 1) if all(n % v == 0 for n in extents))


def _floor_pow2(n: int) -> int:
    return max(1, 1 << (max(n, 1).bit_length() - 1))


def _div_up(a: int, b: int) -> int:
    return -(-a // b)


@dataclasses.dataclass(frozen=True)
class Reduction:
    """One reduction as the kernel sees it after TensorIterator's reordering.

    Attributes:
        outputs: Output elements.
        inputs_per_output: Input elements summed into each output.
        along_fastest: The summed dimension is the input's fastest-moving one (the
            lanes of a warp share an output), else the lanes own separate outputs.
        vector: Outputs each thread loads at once (1, 2 or 4) when ``along_fastest``
            is false.
        accumulator: Bytes of the accumulator type (4 for float, 8 for double).
    """

    outputs: int
    inputs_per_output: int
    along_fastest: bool
    vector: int
    accumulator: int

    def staging_bytes(self, sm_count: int, threads: int) -> int:
        """Bytes of the staging buffer on a card of ``sm_count`` SMs of ``threads`` each.

        0 when the launch reduces within one block per output.

        Example:
            >>> bias = Reduction(768, 12608, along_fastest=False, vector=4, accumulator=4)
            >>> bias.staging_bytes(132, 2048)  # H200: ViT-B/16's MLP bias gradient
            77463552
            >>> bias.staging_bytes(28, 1536) < bias.staging_bytes(132, 2048)  # RTX 3060
            True
        """
        vector = 1 if self.along_fastest else self.vector
        dim0, dim1 = (
            (self.inputs_per_output, self.outputs)
            if self.along_fastest
            else (self.outputs // vector, self.inputs_per_output)
        )
        limit = _MAX_THREADS // vector
        dim0_pow2 = _floor_pow2(dim0) if dim0 < limit else limit
        dim1_pow2 = _floor_pow2(dim1) if dim1 < limit else limit
        width = min(dim0_pow2, _WARP)
        height = min(dim1_pow2, limit // width)
        width = min(dim0_pow2, limit // height)
        step_input = step_output = 1
        if self.along_fastest:
            step_input *= width
        else:
            step_output *= width
        values = _div_up(self.inputs_per_output, step_input)
        if values < min(height * _MIN_VALUES, _MAX_VALUES):
            return 0  # each warp has outputs of its own: no split across warps or blocks
        step_input *= height
        values = _div_up(self.inputs_per_output, step_input)
        grid = _div_up(self.outputs // vector, step_output)
        target = sm_count * (threads // (width * height))
        if values < _MAX_VALUES or grid > target:
            return 0
        blocks = max(
            min(_div_up(target, grid), _div_up(values, _MIN_VALUES)), _div_up(values, _MAX_VALUES)
        )
        if blocks <= 1:
            return 0
        lanes = 1 if self.along_fastest else width * vector
        return self.accumulator * self.outputs * blocks * lanes
