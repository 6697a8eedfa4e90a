"""Data-parallel steps: what the GPUs of one machine send each other, and how long it takes.

**Collectives.** NCCL reports a collective's *bus bandwidth*, the rate that is the same
for any number of ranks on one link (nccl-tests, ``doc/PERFORMANCE.md``): a ring
all-reduce of ``S`` bytes over ``n`` ranks moves ``2 (n - 1) / n * S`` bytes through each
rank's link, an all-gather or reduce-scatter ``(n - 1) / n * S``. So the time of one is
those bytes over the link's bus bandwidth (`collective_seconds`).

**Links** (`LINKS`), as NCCL reaches them on large messages:

- NVLink 4 through NVSwitch (HGX/DGX H100 and H200): 450 GB/s per direction on the wire;
  NCCL's protocols leave about 370 GB/s of bus bandwidth for ring collectives, and
  all-reduce with NVLink SHARP peaks near 480 GB/s on 8 GPUs (NCCL maintainer S. Jeaugey,
  github.com/NVIDIA/nccl-tests issue 212, 2024; 475 GB/s measured on 8 H200,
  nccl-tests issue 272).
- NVLink 3 through NVSwitch (HGX/DGX A100): 300 GB/s per direction (NVIDIA A100
  datasheet: 600 GB/s NVLink, both directions); at the same share NCCL leaves on NVLink 4
  (370 / 450) that is about 247 GB/s; A100's switch has no SHARP, so all-reduce runs as a
  ring.
- PCIe 3.0, 4.0, 5.0 x16: 15.75, 31.5, 63 GB/s per direction (PCI-SIG), at the same share:
  about 13, 26 and 52 GB/s. GeForce cards from the RTX 40 series on do not allow
  peer-to-peer copies, and NCCL then stages through host memory: take this as an upper
  bound there.

A card's link is taken from its catalog entry (`link_of`): an SXM Hopper or Ampere part
sits on NVSwitch; everything else on PCIe of its generation (two PCIe H100s with an NVLink
bridge reach 116 GB/s instead, nccl-tests issue 194).

**What each strategy sends per optimizer step** (`comm_for`), and what hides it:

- DDP: one all-reduce of the gradients; buckets of 25 MiB (``bucket_cap_mb``) start
  during backward, so only what outlasts the last micro-batch's backward is exposed, and
  at least the last bucket's.
- ZeRO-1/2: a reduce-scatter of the gradients (hidden the same way) and, after the
  optimizer step, an all-gather of the updated parameters (exposed).
- FSDP (ZeRO-3): per micro-batch, the parameters gathered for the forward and again for
  the backward, and the gradients reduce-scattered; each overlaps the compute of its
  phase (FSDP prefetches the next unit), so a phase takes the longer of the two. The
  root unit (embeddings, final norm, head with the usual wrap) is gathered once: its
  ``reshard_after_forward`` is False (``fully_shard``'s docstring), so it stays gathered
  through backward (``resident_bytes``).

Not modelled: latency of small collectives, several nodes (HSDP, inter-node links),
tensor and pipeline parallelism, and compression.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torchfit._core import checks
from torchfit.memory.sharding.strategies import DEFAULT_BUCKET_BYTES
from torchfit.speed.result import KindTime, StepTime
from torchfit.speed.timing import NOT_MODELLED, not_modelled

__all__ = [
    "LINKS",
    "CommPlan",
    "Link",
    "collective_seconds",
    "comm_for",
    "data_parallel_time",
    "link_of",
]


@dataclasses.dataclass(frozen=True)
class Link:
    """A link between the GPUs of one machine, as NCCL's bus bandwidth on it.

    Attributes:
        name: What it is, in words.
        ring_gb_s: Bus bandwidth of ring collectives (all-gather, reduce-scatter, and
            all-reduce where the switch cannot reduce), GB/s.
        allreduce_gb_s: Bus bandwidth of all-reduce, GB/s.
        source: Where the figures come from.
    """

    name: str
    ring_gb_s: float
    allreduce_gb_s: float
    source: str


#: NCCL's share of an NVLink 4 line rate on ring collectives (370 of 450 GB/s, module notes).
_NCCL_SHARE = 370 / 450

#: The links (module notes), by name.
LINKS: dict[str, Link] = {
    "nvlink4": Link(
        "NVLink 4 + NVSwitch",
        370.0,
        480.0,
        "nccl-tests issues 212 (NCCL maintainer) and 272 (8 H200: 475 GB/s)",
    ),
    "nvlink3": Link(
        "NVLink 3 + NVSwitch",
        300.0 * _NCCL_SHARE,
        300.0 * _NCCL_SHARE,
        "300 GB/s per direction (A100 datasheet) at NCCL's NVLink 4 share",
    ),
    "pcie3": Link("PCIe 3.0 x16", 15.75 * _NCCL_SHARE, 15.75 * _NCCL_SHARE, "PCI-SIG rate"),
    "pcie4": Link("PCIe 4.0 x16", 31.5 * _NCCL_SHARE, 31.5 * _NCCL_SHARE, "PCI-SIG rate"),
    "pcie5": Link("PCIe 5.0 x16", 63.0 * _NCCL_SHARE, 63.0 * _NCCL_SHARE, "PCI-SIG rate"),
}

#: Cards whose machines put them on NVSwitch (the catalog's names; an A100 or H100 named
#: without its form factor is the SXM module).
_SWITCHED = {
    "NVIDIA H100 SXM": "nvlink4",
    "NVIDIA H200": "nvlink4",
    "NVIDIA B200": "nvlink4",  # NVLink 5 (900 GB/s per direction) counted as NVLink 4
    "NVIDIA A100 40GB": "nvlink3",
    "NVIDIA A100 80GB SXM": "nvlink3",
}
#: PCIe generation by architecture (the cards' datasheets: Hopper, Blackwell and CDNA 3
#: are PCIe 5.0, Ampere, Ada and RDNA 3 PCIe 4.0, older ones PCIe 3.0).
_PCIE = {
    "Hopper": "pcie5",
    "Blackwell": "pcie5",
    "CDNA 3": "pcie5",
    "Ampere": "pcie4",
    "Ada Lovelace": "pcie4",
    "RDNA 3": "pcie4",
}


def link_of(card: Any) -> Link:
    """The link a card's machine most likely has (module notes).

    An SXM Hopper or Ampere part (and the B200) sits on NVSwitch; every other card on
    PCIe of its generation, V100 SXM2's NVLink 2 mesh and AMD's Infinity Fabric included
    (their collectives are not modelled: PCIe is the lower bound).

    Example:
        >>> from torchfit.memory import gpu
        >>> link_of(gpu("H100")).name, link_of(gpu("RTX 4090")).name
        ('NVLink 4 + NVSwitch', 'PCIe 4.0 x16')
    """
    if card.name in _SWITCHED:
        return LINKS[_SWITCHED[card.name]]
    return LINKS[_PCIE.get(str(getattr(card, "architecture", "")), "pcie3")]


@checks.arguments(nbytes=checks.number(at_least=0), ranks=checks.whole(at_least=1))
def collective_seconds(kind: str, nbytes: float, ranks: int, link: Link) -> float:
    """Seconds of one collective of ``nbytes`` (the whole tensor) over ``ranks`` GPUs.

    ``kind``: ``"all_reduce"``, ``"all_gather"`` or ``"reduce_scatter"``.

    Example:
        >>> link = LINKS["nvlink4"]
        >>> round(collective_seconds("all_reduce", 1e9, 8, link) * 1e3, 2)  # ms
        3.65
        >>> collective_seconds("all_gather", 1e9, 1, link)
        0.0
    """
    if ranks <= 1:
        return 0.0
    share = (ranks - 1) / ranks
    if kind == "all_reduce":
        return 2 * share * nbytes / (link.allreduce_gb_s * 1e9)
    if kind in {"all_gather", "reduce_scatter"}:
        return share * nbytes / (link.ring_gb_s * 1e9)
    raise ValueError(f"kind must be 'all_reduce', 'all_gather' or 'reduce_scatter'; got {kind!r}")


@dataclasses.dataclass(frozen=True)
class CommPlan:
    """What one optimizer step sends, by phase, and what it can hide behind.

    Attributes:
        forward: Seconds of collectives overlapping each micro-batch's forward.
        backward: Seconds overlapping each micro-batch's backward (FSDP), or the last
            micro-batch's backward only (DDP and ZeRO's gradient reduction).
        exposed: Seconds that overlap nothing (ZeRO's parameter all-gather after the
            step, DDP's last bucket).
        bytes: Bytes the collectives carry per optimizer step (whole tensors).
        per_micro_batch: Whether ``forward`` and ``backward`` recur every micro-batch.
        what: The collectives, in words.
        sharded_optimizer: Each rank steps its shard of the optimizer state only (ZeRO,
            FSDP): the optimizer's kernels are ``1/ranks`` of one card's.
    """

    forward: float
    backward: float
    exposed: float
    bytes: float
    per_micro_batch: bool
    what: str
    sharded_optimizer: bool = False


@checks.arguments(
    ranks=checks.whole(at_least=1),
    grad_bytes=checks.number(at_least=0),
    param_bytes=checks.number(at_least=0),
    resident_bytes=checks.number(at_least=0),
    bucket_bytes=checks.number(above=0),
)
def comm_for(
    strategy: str,
    *,
    ranks: int,
    link: Link,
    grad_bytes: float,
    param_bytes: float,
    resident_bytes: float = 0.0,
    bucket_bytes: float = DEFAULT_BUCKET_BYTES,
) -> CommPlan:
    """The collectives of one optimizer step under ``strategy`` (module notes).

    ``grad_bytes``: the trainable parameters' gradients; ``param_bytes``: the parameters
    as they are gathered (FSDP: in ``param_dtype``; ZeRO: the trainable ones updated);
    ``resident_bytes``: FSDP, those of them gathered once and kept through backward (the
    root unit).

    Example:
        >>> plan = comm_for("ddp", ranks=8, link=LINKS["nvlink4"], grad_bytes=4e9,
        ...                 param_bytes=4e9)
        >>> round(plan.backward * 1e3, 1), plan.per_micro_batch
        (14.6, False)
    """

    def ring(kind: str, nbytes: float) -> float:
        return collective_seconds(kind, nbytes, ranks, link)

    if strategy == "ddp":
        bucket = ring("all_reduce", min(bucket_bytes, grad_bytes))  # the last, after backward
        return CommPlan(
            0.0, ring("all_reduce", grad_bytes), bucket, grad_bytes, per_micro_batch=False,
            what="DDP: the gradients all-reduced in 25 MiB buckets during backward",
        )  # fmt: skip
    if strategy in {"zero1", "zero2"}:
        return CommPlan(
            0.0, ring("reduce_scatter", grad_bytes), ring("all_gather", param_bytes),
            grad_bytes + param_bytes, per_micro_batch=False,
            what=f"{strategy}: gradients reduce-scattered during backward, updated "
            "parameters all-gathered after the step",
            sharded_optimizer=True,
        )  # fmt: skip
    if strategy == "fsdp":
        if resident_bytes > param_bytes:
            raise ValueError(
                f"resident_bytes={resident_bytes:g} is more than param_bytes={param_bytes:g}: "
                "the units kept gathered are part of those gathered; pass at most param_bytes"
            )
        again = param_bytes - resident_bytes  # the root stays gathered through backward
        return CommPlan(
            ring("all_gather", param_bytes),
            ring("all_gather", again) + ring("reduce_scatter", grad_bytes), 0.0,
            param_bytes + again + grad_bytes, per_micro_batch=True,
            what="FSDP: parameters all-gathered for forward and again for backward (the "
            "root unit once), gradients reduce-scattered, each micro-batch",
            sharded_optimizer=True,
        )  # fmt: skip
    raise ValueError(
        f"strategy {strategy!r}: the time of its communication is not modelled; expected "
        "'ddp', 'zero1', 'zero2' or 'fsdp' (HSDP spans nodes, whose links are not modelled)"
    )


@checks.arguments(ranks=checks.whole(at_least=1), accumulation=checks.whole(at_least=1))
def data_parallel_time(
    timed: StepTime, plan: CommPlan, *, ranks: int, accumulation: int, link: Link
) -> StepTime:
    """One rank's `StepTime` made the job's: the communication it cannot hide added.

    Each phase takes the longer of its compute and the collectives that overlap it (per
    micro-batch for FSDP, the last micro-batch's backward otherwise), plus what overlaps
    nothing; under ZeRO and FSDP each rank's optimizer step covers its shard only.
    Samples, tokens, FLOPs and the peak become the job's (``ranks`` cards), so rates and
    MFU stay comparable and `StepTime.cost` is priced per card-hour.
    """
    forward = timed.phase_seconds("forward") / accumulation
    backward = timed.phase_seconds("backward") / accumulation
    repeats = accumulation if plan.per_micro_batch else 1
    exposed = repeats * (max(0.0, plan.forward - forward) + max(0.0, plan.backward - backward))
    exposed += plan.exposed
    rows = timed.breakdown
    if plan.sharded_optimizer:  # each rank updates its shard
        rows = tuple(
            dataclasses.replace(r, seconds=r.seconds / ranks, bytes=r.bytes / ranks)
            if r.phase == "optimizer"
            else r
            for r in rows
        )
    row = KindTime("comm", "backward", exposed, 0.0, plan.bytes * repeats, 0)
    note = (
        f"{ranks} GPUs over {link.name} ({link.ring_gb_s:.0f} GB/s ring, "
        f"{link.allreduce_gb_s:.0f} GB/s all-reduce bus bandwidth; {link.source}): "
        f"{plan.what}; {exposed * 1e3:.1f} ms not hidden by compute"
    )
    unsaid = not_modelled(modelled=frozenset({"communication"}))
    said = tuple(unsaid if n == NOT_MODELLED else n for n in timed.notes)
    return dataclasses.replace(
        timed,
        gpu=f"{ranks} x {timed.gpu}",
        seconds=sum(r.seconds for r in rows) + exposed,
        samples=timed.samples * ranks,
        tokens=None if timed.tokens is None else timed.tokens * ranks,
        model_flops=timed.model_flops * ranks,
        peak_flops=timed.peak_flops * ranks,
        breakdown=(*rows, row),
        notes=(*said, note),
        gpus=ranks,
    )
