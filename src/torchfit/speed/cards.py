"""What a card can do at best: peak FLOP/s per kind of math, bandwidth, best matmul share.

The 16-bit tensor-core peaks and the bandwidth come from the GPU catalog
(`torchfit.memory.gpu`). What the catalog does not hold is here, each with its source:

- **fp32 without tensor cores** (``torch.backends.cuda.matmul.allow_tf32`` is False by
  default since PyTorch 1.12, so an fp32 matmul runs on the CUDA cores): the vendors'
  datasheet "FP32" figures in `FP32_TFLOPS`. A card not listed takes a quarter of its
  fp16 tensor peak, and the estimate says so.
- **TF32 tensor cores** (cuDNN convolutions in fp32: ``torch.backends.cudnn.allow_tf32``
  is True by default): half the dense fp16 peak on every card with TF32 (compute
  capability 8.0 and later). The datasheets agree: A100 156 / 312, H100 SXM 494.7 / 989.4,
  L40S 183 / 362, L4 60 / 121, RTX 4090 82.6 / 165.2, RTX 3090 35.6 / 71.
- **The best share of the tensor-core peak a matmul reaches** (Maximum Achievable Matmul
  FLOPS, the best of a search over shapes; S. Bekman, *Machine Learning Engineering*,
  compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison table"):
  `MAMF`. Cards not measured there take 0.80, the median of the NVIDIA rows.
- **The share of the fp32 peak cuBLAS SGEMM reaches** (`sgemm_share`), by the SM's
  design. Data-center SMs (compute capability 7.0, 8.0, 9.0: V100, A100, H100/H200) issue
  one FP32 FMA per lane per clock from a large register file: cublasSgemm ran at 50.5
  TFLOP/s of the H100 SXM's 67 at 8192³ (75%; 45.7 at 4096³), in the published
  measurements of github.com/waynehacking8/blackwell-tensorcore-kernels,
  ``results/bench_sm90a.csv``. The GeForce/RTX SMs since GA102 (8.6, 8.9, 12.x) count
  twice the FP32 lanes, half of them shared with INT32 (NVIDIA Ampere GA102 whitepaper,
  "2x FP32 throughput"), and reach less of that doubled figure: cuBLAS SGEMM at 23.3 of
  38.7 TFLOP/s on an RTX A6000 (60%; S. Boehm, "How to Optimize a CUDA Matmul Kernel for
  cuBLAS-like Performance", siboehm.com, 2022).
- **fp32 attention on TF32 tensor cores, three passes**: SDPA's memory-efficient kernel
  (PyTorch's ``mem_eff_attention/gemm_kernel_utils.h``, ``DefaultGemmType`` for float on
  compute capability 8.0 and later) multiplies fp32 with CUTLASS's
  ``OpMultiplyAddFastF32``: each product as three TF32 tensor-core products (CUTLASS
  example 27, "3xTF32"), so its peak is a third of the TF32 peak (`THREE_TF32`).
"""

from __future__ import annotations

import dataclasses

from torchfit.memory.gpus import GPU

__all__ = ["FP32_TFLOPS", "MAMF", "SGEMM_SHARE", "THREE_TF32", "Peaks", "peaks", "sgemm_share"]

#: Dense fp32 (CUDA-core) TFLOPS from each vendor's datasheet or architecture whitepaper.
FP32_TFLOPS: dict[str, float] = {
    # NVIDIA data-center datasheets (nvidia.com/en-us/data-center/<card>)
    "NVIDIA P100 PCIe 16GB": 9.3,
    "NVIDIA V100 SXM2 16GB": 15.7,
    "NVIDIA V100 SXM2 32GB": 15.7,
    "NVIDIA V100 PCIe 16GB": 14.0,
    "NVIDIA V100 PCIe 32GB": 14.0,
    "NVIDIA V100S PCIe 32GB": 16.4,
    "NVIDIA T4": 8.1,
    "NVIDIA A10": 31.2,
    "NVIDIA A30": 10.3,
    "NVIDIA A40": 37.4,
    "NVIDIA A100 40GB": 19.5,
    "NVIDIA A100 80GB SXM": 19.5,
    "NVIDIA A100 80GB PCIe": 19.5,
    "NVIDIA L4": 30.3,
    "NVIDIA L40": 90.5,
    "NVIDIA L40S": 91.6,
    "NVIDIA H100 SXM": 67.0,
    "NVIDIA H100 PCIe": 51.0,
    "NVIDIA H200": 67.0,
    # NVIDIA RTX professional datasheets
    "NVIDIA RTX A4000": 19.2,
    "NVIDIA RTX A5000": 27.8,
    "NVIDIA RTX A6000": 38.7,
    "NVIDIA RTX 6000 Ada": 91.1,
    "NVIDIA Quadro RTX 6000": 16.3,
    # GeForce: the Ampere GA102 and Ada AD102 whitepapers' appendices, and spec pages
    "NVIDIA GeForce RTX 3060 12GB": 12.7,
    "NVIDIA GeForce RTX 3070": 20.3,
    "NVIDIA GeForce RTX 3080 10GB": 29.8,
    "NVIDIA GeForce RTX 3090": 35.6,
    "NVIDIA GeForce RTX 4060": 15.1,
    "NVIDIA GeForce RTX 4060 Ti 8GB": 22.1,
    "NVIDIA GeForce RTX 4060 Ti 16GB": 22.1,
    "NVIDIA GeForce RTX 4070": 29.1,
    "NVIDIA GeForce RTX 4080": 48.7,
    "NVIDIA GeForce RTX 4090": 82.6,
    "NVIDIA GeForce RTX 2080 Ti": 13.4,
    "NVIDIA GeForce GTX 1080 Ti": 11.3,
    # AMD Instinct datasheets (peak FP32 vector)
    "AMD Instinct MI300X": 163.4,
    "AMD Instinct MI325X": 163.4,
}

#: Maximum achievable share of the dense bf16 peak (Bekman's MAMF table, BF16 rows;
#: "H200 is the same" as the H100 SXM there).
MAMF: dict[str, float] = {
    "NVIDIA A100 40GB": 0.869,
    "NVIDIA A100 80GB SXM": 0.869,
    "NVIDIA A100 80GB PCIe": 0.811,
    "NVIDIA H100 SXM": 0.803,
    "NVIDIA H200": 0.803,
    "NVIDIA B200": 0.776,
    "AMD Instinct MI300X": 0.514,
    "AMD Instinct MI325X": 0.604,
}
_DEFAULT_MAMF = 0.80
#: cuBLAS SGEMM's share of the datasheet fp32 peak, by SM design (module notes).
SGEMM_SHARE = {"data-center": 0.75, "doubled-fp32": 0.60}
#: The math name of fp32 run as three TF32 tensor-core products (module notes).
THREE_TF32 = "3xtf32"
_FP32_FROM_FP16 = 0.25  # an unlisted card's fp32 peak, as a share of its fp16 tensor peak


@dataclasses.dataclass(frozen=True)
class Peaks:
    """A card's ceilings.

    Attributes:
        name: The card.
        tensor_tflops: Dense tensor-core TFLOPS by compute dtype (``"bf16"``, ``"fp16"``,
            ``"tf32"``); a dtype the card cannot run on tensor cores is absent.
        fp32_tflops: Dense fp32 CUDA-core TFLOPS.
        bandwidth_gb_s: Peak memory bandwidth, GB/s.
        mamf: Best share of the 16-bit tensor peak a matmul reaches.
        sgemm: Best share of ``fp32_tflops`` cuBLAS SGEMM reaches (`sgemm_share`).
        sm_count: Streaming multiprocessors (None when unknown).
        notes: Which figures were derived rather than read from a datasheet.
    """

    name: str
    tensor_tflops: dict[str, float]
    fp32_tflops: float
    bandwidth_gb_s: float
    mamf: float
    sgemm: float
    sm_count: int | None
    notes: tuple[str, ...]

    def dense_peak(self, dtype: str) -> float:
        """The peak FLOP/s the card's fastest unit has for ``dtype`` math.

        Example:
            >>> from torchfit.memory import gpu
            >>> peaks(gpu("H200")).dense_peak("bf16") / 1e12
            989.5
        """
        if dtype in self.tensor_tflops:
            return self.tensor_tflops[dtype] * 1e12
        if dtype == THREE_TF32 and "tf32" in self.tensor_tflops:
            return self.tensor_tflops["tf32"] * 1e12 / 3
        if dtype in {"bf16", "fp16"} and "fp16" in self.tensor_tflops:
            return self.tensor_tflops["fp16"] * 1e12
        return self.fp32_tflops * 1e12


def sgemm_share(capability: tuple[int, int] | None) -> float:
    """The best share cuBLAS SGEMM reaches of the fp32 peak for an SM of this compute capability.

    Example:
        >>> sgemm_share((9, 0)), sgemm_share((8, 6)), sgemm_share(None)
        (0.75, 0.6, 0.6)
    """
    if capability is not None and capability[1] == 0 and capability[0] in {6, 7, 8, 9, 10}:
        return SGEMM_SHARE["data-center"]
    return SGEMM_SHARE["doubled-fp32"]


def peaks(card: GPU) -> Peaks:
    """The ceilings of ``card`` (module notes: what comes from where).

    Raises:
        ValueError: the card has no bandwidth or 16-bit peak in the catalog (give them
            with `torchfit.memory.GPU.custom`).

    Example:
        >>> from torchfit.memory import gpu
        >>> p = peaks(gpu("A100 80GB"))
        >>> p.fp32_tflops, p.tensor_tflops["tf32"], p.mamf
        (19.5, 156.0, 0.869)
    """
    if card.memory_bandwidth_gb_s is None:
        raise ValueError(
            f"GPU {card.name!r} has no memory bandwidth in the catalog; time on a card made "
            "with GPU.custom(name, memory=..., memory_bandwidth_gb_s=..., fp16_tflops=...)"
        )
    notes = []
    tensor: dict[str, float] = {}
    if card.fp16_tflops is not None:
        tensor["fp16"] = card.fp16_tflops
    if card.bf16_tflops is not None and card.bf16:
        tensor["bf16"] = card.bf16_tflops
    cc = card.compute_capability
    if "fp16" in tensor and cc is not None and cc >= (8, 0):
        tensor["tf32"] = tensor["fp16"] / 2
    fp32 = FP32_TFLOPS.get(card.name)
    if fp32 is None:
        if not tensor:
            raise ValueError(
                f"GPU {card.name!r} has no fp16 peak in the catalog and no fp32 figure in "
                "torchfit.speed.cards.FP32_TFLOPS; give fp16_tflops= with GPU.custom"
            )
        fp32 = tensor["fp16"] * _FP32_FROM_FP16
        notes.append(f"{card.name}: fp32 peak not in torchfit's table, taken as fp16/4")
    mamf = MAMF.get(card.name)
    if mamf is None:
        mamf = _DEFAULT_MAMF
        notes.append(f"{card.name}: no published maximum achievable matmul share; 0.80 used")
    return Peaks(
        name=card.name,
        tensor_tflops=tensor,
        fp32_tflops=fp32,
        bandwidth_gb_s=card.memory_bandwidth_gb_s,
        mamf=mamf,
        sgemm=sgemm_share(cc),
        sm_count=card.sm_count,
        notes=tuple(notes),
    )
