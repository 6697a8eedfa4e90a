"""How a model gets loaded: the path and its options, validated at the door."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

import torch

from torchfit._core.units import DType, parse_dtype

__all__ = ["LoadMethod", "LoadSpec"]


class LoadMethod(enum.StrEnum):
    """The ways a model's weights get into a process.

    * ``from_pretrained``: transformers' ``from_pretrained`` (a model on the meta device,
      filled from the checkpoint).
    * ``torch.load``: ``torch.load`` of a ``torch.save`` file (``safetensors.torch.load_file``
      for a safetensors one): the state dict alone.
    * ``load_state_dict``: the model built in memory, then ``torch.load`` and
      ``model.load_state_dict(state_dict)``, which copies: a full state dict materialised
      next to the model.
    * ``assign``: the model built on the meta device, then ``torch.load`` and
      ``load_state_dict(state_dict, assign=True)``: the module keeps the loaded tensors.
    """

    FROM_PRETRAINED = "from_pretrained"
    TORCH_LOAD = "torch.load"
    LOAD_STATE_DICT = "load_state_dict"
    ASSIGN = "assign"


@dataclasses.dataclass(frozen=True)
class LoadSpec:
    """One load path with its options; the same object drives a prediction and a measurement.

    Attributes:
        method: A `LoadMethod` (or its value).
        dtype: ``from_pretrained(dtype=...)``: the dtype floating weights are cast to
            (``None``: the checkpoint's, transformers 5's ``"auto"``); ``load_state_dict``:
            the dtype the model is built in (``None``: torch's default, fp32).
        mmap: ``from_pretrained``: memory-map the files (``disable_mmap=False``, the
            default); ``torch.load(mmap=...)`` otherwise.
        bits: bitsandbytes quantization on load, 4 or 8 (``from_pretrained`` only).
        double_quant: 4-bit double quantization.
        skip_modules: Modules left unquantized beyond the default skip list.
        device_map: ``from_pretrained(device_map=...)``: ``"cpu"``, ``"cuda"`` (every
            weight on the GPU, also what ``"auto"`` does when the model fits), or a
            ``{module prefix: device}`` mapping. ``None`` is the CPU.
        weights_only: ``torch.load(weights_only=...)``; it changes no memory.

    Example:
        >>> LoadSpec(dtype="bf16", bits=4).describe()
        'from_pretrained(dtype=bf16, 4-bit)'
        >>> LoadSpec(method="torch.load", bits=4)
        Traceback (most recent call last):
        ...
        ValueError: bits=4 needs method='from_pretrained' (got 'torch.load'); drop bits
    """

    method: LoadMethod | str = LoadMethod.FROM_PRETRAINED
    dtype: torch.dtype | DType | str | None = None
    mmap: bool = True
    bits: int | None = None
    double_quant: bool = True
    skip_modules: tuple[str, ...] = ()
    device_map: str | Mapping[str, str | int] | None = None
    weights_only: bool = True

    def __post_init__(self) -> None:
        """Refuse unknown methods and options that do not belong to the method."""
        try:
            method = LoadMethod(self.method)
        except ValueError:
            choices = ", ".join(repr(m.value) for m in LoadMethod)
            raise ValueError(
                f"unknown load method {self.method!r}; expected one of {choices}"
            ) from None
        object.__setattr__(self, "method", method)
        if self.dtype is not None and not isinstance(self.dtype, torch.dtype):
            object.__setattr__(self, "dtype", parse_dtype(self.dtype).torch_dtype)
        for name in ("mmap", "double_quant", "weights_only"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False; got {getattr(self, name)!r}")
        if self.bits is not None and (isinstance(self.bits, bool) or self.bits not in (4, 8)):
            raise ValueError(f"bits must be 4, 8 or None; got {self.bits!r}")
        if self.bits is not None and method is not LoadMethod.FROM_PRETRAINED:
            raise ValueError(
                f"bits={self.bits} needs method='from_pretrained' (got {method.value!r}); drop bits"
            )
        if self.device_map is not None and method is not LoadMethod.FROM_PRETRAINED:
            raise ValueError(
                f"device_map belongs to from_pretrained; got method={method.value!r}; drop it"
            )
        if self.dtype is not None and method in (LoadMethod.TORCH_LOAD, LoadMethod.ASSIGN):
            raise ValueError(
                f"method={method.value!r} keeps the stored dtypes (torch.load casts nothing); "
                "drop dtype, or use 'load_state_dict' (a model built in that dtype)"
            )
        object.__setattr__(self, "skip_modules", tuple(self.skip_modules))
        self._check_device_map()

    def _check_device_map(self) -> None:
        where = self.device_map
        if where is None:
            return
        values = [where] if isinstance(where, str) else list(dict(where).values())
        for value in values:
            text = str(value)
            if text == "disk":
                raise ValueError(
                    "device_map with 'disk' offloads weights to files, which torchfit.host does "
                    "not model yet; use 'cpu' or a GPU for those modules"
                )
            if (
                text not in ("cpu", "cuda", "auto")
                and not text.startswith("cuda:")
                and not (isinstance(value, int) and not isinstance(value, bool) and value >= 0)
            ):
                raise ValueError(
                    f"unknown device {value!r} in device_map; expected 'cpu', 'cuda', 'auto', "
                    "'cuda:N' or a GPU index"
                )
        if not isinstance(where, str):
            object.__setattr__(self, "device_map", dict(where))

    @property
    def kind(self) -> LoadMethod:
        """`method` as the `LoadMethod` it was normalized to."""
        return LoadMethod(self.method)

    @property
    def torch_dtype(self) -> torch.dtype | None:
        """`dtype` as the ``torch.dtype`` it was normalized to."""
        return self.dtype if isinstance(self.dtype, torch.dtype) else None

    def describe(self) -> str:
        """The call in words: ``"from_pretrained(dtype=bf16, 4-bit)"``."""
        parts: list[str] = []
        if self.torch_dtype is not None:
            parts.append(f"dtype={parse_dtype(self.torch_dtype).value}")
        if self.bits is not None:
            parts.append(f"{self.bits}-bit")
        if isinstance(self.device_map, str):
            parts.append(f"device_map={self.device_map!r}")
        elif self.device_map is not None:
            cpu = sum(str(where) == "cpu" for where in self.device_map.values())
            gpu = len(self.device_map) - cpu
            parts.append(f"device_map={{{gpu} modules on GPUs, {cpu} on the CPU}}")
        if not self.mmap:
            parts.append("disable_mmap=True" if self.kind is LoadMethod.FROM_PRETRAINED
                         else "mmap=False")  # fmt: skip
        elif self.kind is not LoadMethod.FROM_PRETRAINED:
            parts.append("mmap=True")
        return f"{self.kind}({', '.join(parts)})"

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain Python values (dtypes as names)."""
        data = dataclasses.asdict(self)
        data["method"] = str(self.method)
        data["dtype"] = None if self.dtype is None else str(self.dtype).removeprefix("torch.")
        data["skip_modules"] = list(self.skip_modules)
        return data
