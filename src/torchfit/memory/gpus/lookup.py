"""GPU catalog: memory, bandwidth and tensor-core peaks of common cards, and a forgiving lookup.

The figures live in ``gpus.json`` beside this module, each with the vendor document it
comes from. `gpu` finds a card from what people type ("rtx3060", "A100 80GB", "h100");
`list_gpus` lists them; `current_gpu` describes the card torch sees; `GPU.custom`
describes a card the catalog lacks.

What `GPU.memory` means: for catalog cards, the datasheet's capacity read in binary
units, "N GB" = N GiB = N * 2**30 bytes. That is what ``nvidia-smi`` shows as Total on
most cards (12288MiB for a 12GB RTX 3060). Programs get less:
``torch.cuda.get_device_properties().total_memory`` is typically 1-8% lower (driver and
ECC reservations; a T4 reports about 14.75 GiB of its 16), and the CUDA context takes a
few hundred MB more. `current_gpu` returns the real ``total_memory`` of the card at hand.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from importlib import resources

import torch

from torchfit._core import checks
from torchfit._core.hardware import native_bf16, native_fp8, parse_device
from torchfit.memory.gpus.card import GPU
from torchfit.memory.gpus.names import NameIndex, name_key

__all__ = ["current_gpu", "gpu", "list_gpus"]

# torch's total_memory sits below the nominal size by driver, ECC and firmware
# reservations: about 8% on a T4 (torch's OOM messages say "14.75 GiB total capacity"),
# 1-4% on most cards. A card whose reported memory is further off than this is a
# different variant (an 8 GB RTX 3060 reports the same name as the 12 GB one).
_MEMORY_TOLERANCE = (0.85, 1.05)


@functools.cache
def _catalog() -> tuple[GPU, ...]:
    """The cards of ``gpus.json``, read once, on first use (never at import)."""
    text = resources.files("torchfit.memory.gpus").joinpath("gpus.json").read_text(encoding="utf-8")
    entries = json.loads(text)["gpus"]
    cards = tuple(GPU.from_dict(entry) for entry in entries)
    return tuple(
        sorted(cards, key=lambda c: (c.vendor, c.memory, c.memory_bandwidth_gb_s or 0.0, c.name))
    )


@functools.cache
def _by_name() -> dict[str, GPU]:
    return {card.name: card for card in _catalog()}


@functools.cache
def _index() -> NameIndex:
    return NameIndex(
        (spelling, card.name) for card in _catalog() for spelling in (card.name, *card.aliases)
    )


@checks.arguments()
def list_gpus(*, vendor: str | None = None) -> list[GPU]:
    """Every catalog card, sorted by vendor, then memory, then bandwidth.

    Args:
        vendor: Keep only this vendor's cards (``"NVIDIA"`` or ``"AMD"``, any case).

    Raises:
        ValueError: ``vendor`` has no cards in the catalog.

    Example:
        >>> len(list_gpus()) >= 30
        True
        >>> [card.name for card in list_gpus(vendor="amd")][-1]
        'AMD Instinct MI325X'
    """
    cards = list(_catalog())
    if vendor is None:
        return cards
    vendors = sorted({card.vendor for card in cards})
    kept = [card for card in cards if card.vendor.lower() == vendor.strip().lower()]
    if not kept:
        raise ValueError(
            f"no GPUs from vendor {vendor!r} in the catalog; vendors: {', '.join(vendors)}"
        )
    return kept


@checks.arguments()
def gpu(name: str | GPU) -> GPU:
    """Find a card by name, forgivingly where it is safe and strictly where it is not.

    Case, spaces, dashes, underscores and vendor words ("NVIDIA", "GeForce", "Tesla",
    "AMD", "Instinct") do not matter: "rtx3060", "RTX 3060", "nvidia-geforce-rtx-3060"
    and "3060" are the same card. A name may leave out a memory size, a form factor or
    a family word ("rtx") when only one card fits. A name that leaves out the form
    factor means the SXM module ("A100 80GB", "V100 16GB", "H100"). A name that fits
    several cards of different memory ("A100", "V100") is refused with the candidates.

    Args:
        name: A card name, or a `GPU`, which is returned unchanged.

    Returns:
        The catalog card.

    Raises:
        TypeError: ``name`` is neither a string nor a `GPU`.
        ValueError: the name is ambiguous (the message lists the candidates) or unknown
            (the message lists close matches and how to describe a card with `GPU.custom`).

    Example:
        >>> gpu("rtx3060").name
        'NVIDIA GeForce RTX 3060 12GB'
        >>> gpu("a100-80gb").memory // 2**30
        80
        >>> gpu("h100").name
        'NVIDIA H100 SXM'
        >>> gpu("A100")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ValueError: GPU name 'A100' is ambiguous; it matches NVIDIA A100 40GB, ...
    """
    if isinstance(name, GPU):
        return name
    if not isinstance(name, str):
        raise TypeError(
            f"gpu() takes a card name such as 'RTX 3060' or a GPU; got {name!r} "
            f"of type {type(name).__name__}"
        )
    if not name.strip():
        raise ValueError("gpu() got an empty name; pass a card name such as 'RTX 3060'")
    if not name_key(name):
        raise ValueError(
            f"GPU name {name!r} names only a vendor or brand; add the model, e.g. 'RTX 3060'"
        )
    names = _index().candidates(name)
    cards = sorted((_by_name()[n] for n in names), key=lambda c: (c.memory, c.name))
    if len(cards) == 1:
        return cards[0]
    if cards:
        listed = ", ".join(card.name for card in cards)
        raise ValueError(
            f"GPU name {name!r} is ambiguous; it matches {listed}. "
            f"Name one of them, e.g. gpu({cards[0].name!r})"
        )
    close = _index().close_matches(name)
    hint = f" Close matches: {', '.join(close)}." if close else ""
    raise ValueError(
        f"unknown GPU {name!r}.{hint} list_gpus() shows all {len(_catalog())} catalog cards; "
        f"for another card, describe it: GPU.custom({name.strip()!r}, memory='24GiB')"
    )


def _architecture(cc: tuple[int, int]) -> str | None:
    """NVIDIA architecture of a compute capability (CUDA C++ Programming Guide)."""
    special = {(7, 5): "Turing", (8, 9): "Ada Lovelace"}
    by_major = {3: "Kepler", 5: "Maxwell", 6: "Pascal", 7: "Volta", 8: "Ampere", 9: "Hopper"}
    if cc in special:
        return special[cc]
    if cc[0] in {10, 11, 12}:
        return "Blackwell"
    return by_major.get(cc[0])


def _from_properties(
    name: str, total_memory: int, capability: tuple[int, int], *, rocm: bool
) -> GPU:
    """The card torch describes: the catalog card of that name and size, else a custom one."""
    low, high = _MEMORY_TOLERANCE
    names = _index().candidates(name) if name.strip() else ()
    fitting = [
        card
        for card in (_by_name()[n] for n in names)
        if low * card.memory <= total_memory <= high * card.memory
    ]
    reported = f"memory as reported by torch.cuda.get_device_properties() for {name!r}"
    if len(fitting) == 1:
        card = fitting[0]
        return dataclasses.replace(card, memory=total_memory, source=f"{card.source}; {reported}")
    cc = None if rocm else capability
    return GPU(
        name=name.strip() or "unnamed device",
        memory=total_memory,
        vendor="AMD" if rocm else "NVIDIA",
        architecture=None if cc is None else _architecture(cc),
        compute_capability=cc,
        bf16=native_bf16(cc),
        fp8=native_fp8(cc),
        source=f"not in the torchfit catalog; {reported}",
    )


@checks.arguments()
def current_gpu(device: int | str | torch.device | None = None) -> GPU:
    """The card torch sees, with the memory it really reports.

    The device name is looked up in the catalog (bandwidth, peaks, precision support
    come from there) and ``memory`` is the real ``total_memory``. A card the catalog
    lacks, or whose memory does not fit the catalog's variant (an 8 GB RTX 3060), comes
    back with what torch knows: name, memory, compute capability and the bf16/fp8 flags
    it implies (False for an AMD card the catalog lacks: ROCm reports no capability).

    Args:
        device: A CUDA device index, ``"cuda:1"``, or a ``torch.device``; the current
            device when None.

    Raises:
        RuntimeError: CUDA (or ROCm) is not available.
        ValueError: ``device`` is not a CUDA device.

    Example:
        >>> card = current_gpu() if torch.cuda.is_available() else None
        >>> card is None or card.memory == torch.cuda.get_device_properties(0).total_memory
        True
    """
    resolved = None if device is None or isinstance(device, int) else parse_device(device)
    if resolved is not None and resolved.type != "cuda":
        raise ValueError(f"device must be a CUDA device for current_gpu(); got {device!r}")
    if not torch.cuda.is_available():
        raise RuntimeError(
            "current_gpu() describes the GPU torch can use, but torch.cuda.is_available() is "
            "False here (no CUDA/ROCm device, or a CPU-only torch build); name the target "
            "card instead, e.g. torchfit.memory.gpu('RTX 3060'), or describe it with "
            "GPU.custom('my card', memory='12GiB')"
        )
    if resolved is None:
        index = torch.cuda.current_device() if device is None else device
    else:
        index = torch.cuda.current_device() if resolved.index is None else resolved.index
    props = torch.cuda.get_device_properties(index)
    return _from_properties(
        props.name,
        props.total_memory,
        (props.major, props.minor),
        rocm=torch.version.hip is not None,
    )
