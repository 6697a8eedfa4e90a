"""The rules: which bytes each load path puts in RSS, and when.

Read from the code that loads (transformers 5.25, torch 2.13, safetensors 0.8):

* ``from_pretrained`` builds the model on the meta device, whatever the arguments
  (``modeling_utils.PreTrainedModel.get_init_context`` adds ``torch.device("meta")``;
  ``low_cpu_mem_usage`` is popped and ignored), so no random weights are ever allocated.
* With memory maps (the default), every file is opened with ``safe_open(...,
  backend="mmap")`` before any tensor is read, and all stay open until every tensor is
  placed (``_load_pretrained_model``: ``all_pointer``, closed after
  ``convert_and_load_state_dict_in_model``). A ``.bin`` file goes through
  ``torch.load(mmap=True)`` (``load_state_dict``). Each tensor is ``tensor[...]`` (a view
  of the map, no copy) then ``.to(device, dtype)`` (``core_model_loading._materialize_copy``):
  a tensor whose dtype and device do not change stays a view, and its pages are read only
  when the weight is first used; a cast reads the stored bytes (file-backed pages) and
  allocates the result (anonymous pages). The dtype is the meta model's own, so integer
  buffers and ``_keep_in_fp32_modules`` keep theirs.
* ``disable_mmap=True`` reads each file whole (``open(file).read()``) and copies its
  tensors out of those bytes (``safetensors.torch.load``), file after file, into one state
  dict that lives until every tensor is placed.
* ``torch.load`` without ``mmap`` reads every storage of the zip archive into memory
  (``torch/serialization.py``, ``_load``: ``zip_file.get_storage_from_record``); with
  ``mmap=True`` the storages are slices of one ``UntypedStorage.from_file`` map.
  ``weights_only`` restricts the unpickler (``_weights_only_unpickler.py``); it changes
  no memory.
* ``load_state_dict`` copies into the model's own parameters (``param.copy_(input)`` in
  ``Module._load_from_state_dict``): the model and the state dict both live. With
  ``assign=True`` the module keeps the state dict's tensors (no copy).
* A blocking host-to-GPU copy that changes dtype converts on the CPU first
  (``aten/src/ATen/native/cuda/Copy.cu``, ``copy_kernel_cuda``: "For blocking transfers
  conversions are performed on CPU"): one cast tensor of host scratch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch
from torch import nn

from torchfit.host.checkpoint import Checkpoint, CheckpointFormat, StoredTensor
from torchfit.host.quantized import QuantizedWeight, quantized_weights, scratch_per_element
from torchfit.host.result import LoadMemory
from torchfit.host.spec import LoadMethod, LoadSpec

__all__ = ["FIRST_LOAD_BYTES", "PER_TENSOR_BYTES", "predict_load"]

#: RSS a first load adds whatever the model: library code paged in, modules imported
#: lazily, the loader's own objects; then `PER_TENSOR_BYTES` per stored tensor (its
#: ``Parameter``, key, slice object and header pages). Fitted to loads whose weights all
#: stay mapped, transformers 5.25 / torch 2.13 (CPU), above a process that has imported
#: both: ``from_pretrained`` of 75 tensors 13.4-13.6 MiB, of 201 tensors 21.2 MiB;
#: ``torch.load(mmap=True)`` of 75 tensors 1.4 MiB.
FIRST_LOAD_BYTES: dict[LoadMethod, int] = {
    LoadMethod.FROM_PRETRAINED: 9 * 2**20,
    LoadMethod.TORCH_LOAD: 1 * 2**20,
    LoadMethod.LOAD_STATE_DICT: 1 * 2**20,
    LoadMethod.ASSIGN: 1 * 2**20,
}
#: Python objects and header pages per stored tensor (see `FIRST_LOAD_BYTES`).
PER_TENSOR_BYTES: dict[LoadMethod, int] = {
    LoadMethod.FROM_PRETRAINED: 60 * 2**10,
    LoadMethod.TORCH_LOAD: 4 * 2**10,
    LoadMethod.LOAD_STATE_DICT: 4 * 2**10,
    LoadMethod.ASSIGN: 4 * 2**10,
}


@dataclasses.dataclass(frozen=True)
class _Target:
    """Where one stored tensor ends up."""

    dtype: torch.dtype
    gpu: bool
    quantized: QuantizedWeight | None


def _natural_key(name: str) -> list[tuple[int, int | str]]:
    # transformers sorts keys before loading (core_model_loading.dot_natural_key):
    # split on ".", numbers numerically.
    return [(0, int(part)) if part.isdigit() else (1, part) for part in name.split(".")]


def _device_of(name: str, device_map: str | Mapping[str, str | int] | None) -> bool:
    """True when ``name`` goes to a GPU (longest matching module prefix wins)."""
    if device_map is None:
        return False
    if isinstance(device_map, str):
        return device_map != "cpu"
    best, device = -1, "cpu"
    for prefix, where in device_map.items():
        hit = prefix in ("", name) or name.startswith(prefix + ".")
        if hit and len(prefix) > best:
            best, device = len(prefix), str(where)
    return device != "cpu"


def _targets(model: nn.Module, spec: LoadSpec) -> dict[str, _Target]:
    quantized: dict[str, QuantizedWeight] = {}
    if spec.bits is not None:
        quantized = quantized_weights(
            model, bits=spec.bits, double_quant=spec.double_quant, skip_modules=spec.skip_modules
        )
    override = spec.torch_dtype if spec.kind is LoadMethod.FROM_PRETRAINED else None
    targets = {}
    for key, tensor in model.state_dict(keep_vars=True).items():
        dtype = override if override is not None and tensor.is_floating_point() else tensor.dtype
        targets[key] = _Target(dtype, _device_of(key, spec.device_map), quantized.get(key))
    return targets


@dataclasses.dataclass
class _Tally:
    """Running sums of one load, in bytes."""

    anon: int = 0
    file: int = 0
    peak: int = 0
    anon_at_peak: int = 0
    file_at_peak: int = 0
    transient: int = 0
    mapped: int = 0
    on_device: int = 0
    touched: dict[int, int] = dataclasses.field(default_factory=dict)  # file -> bytes read

    def mark(self, scratch: int = 0) -> None:
        if self.anon + self.file + scratch > self.peak:
            self.peak = self.anon + self.file + scratch
            self.anon_at_peak, self.file_at_peak, self.transient = self.anon, self.file, scratch


def _place(
    tally: _Tally, stored: StoredTensor, target: _Target, *, mapped: bool, bits: int | None
) -> int:
    """Add one tensor's placement; return its scratch. ``mapped``: the source is a view."""
    size = stored.numel * target.dtype.itemsize
    scratch = 0
    if target.quantized is not None and bits is not None:
        if target.gpu:  # moved first, quantized on the GPU
            tally.on_device += target.quantized.kept
        else:
            tally.anon += target.quantized.kept
            scratch = target.quantized.numel * scratch_per_element(bits, stored.dtype)
    elif target.gpu:
        tally.on_device += size
        scratch = size if target.dtype != stored.dtype else 0
    elif target.dtype != stored.dtype:
        tally.anon += size
    elif mapped:
        tally.mapped += stored.nbytes
        return 0
    else:
        return 0  # already in memory (a state dict read whole) and used as it is
    if mapped:
        tally.file += stored.nbytes
        tally.touched[stored.file] = tally.touched.get(stored.file, 0) + stored.nbytes
    return scratch


def _from_pretrained(
    tally: _Tally, ckpt: Checkpoint, targets: dict[str, _Target], spec: LoadSpec
) -> set[int]:
    """Walk a ``from_pretrained``; return the files whose map outlives the call."""
    stored = sorted(
        (t for t in ckpt.tensors if t.name in targets), key=lambda t: _natural_key(t.name)
    )
    kept_files: set[int] = set()
    if not spec.mmap:  # each file read whole, its tensors copied out, in file order
        per_file = ckpt.file_tensor_bytes()
        for index, size in enumerate(ckpt.file_bytes):
            tally.mark(size + per_file[index])
            tally.anon += per_file[index]
        held = tally.anon
        for tensor in stored:
            tally.mark(_place(tally, tensor, targets[tensor.name], mapped=False, bits=spec.bits))
        used_as_is = sum(
            t.nbytes for t in stored
            if targets[t.name].quantized is None and not targets[t.name].gpu
            and targets[t.name].dtype == t.dtype
        )  # fmt: skip
        tally.anon -= held - used_as_is  # the state dict goes; tensors used as they are stay
        return kept_files
    for tensor in stored:
        scratch = _place(tally, tensor, targets[tensor.name], mapped=True, bits=spec.bits)
        target = targets[tensor.name]
        if target.quantized is None and not target.gpu and target.dtype == tensor.dtype:
            kept_files.add(tensor.file)
        tally.mark(scratch)
    return kept_files


def _model_bytes(model: nn.Module, dtype: torch.dtype | None) -> int:
    seen: set[int] = set()
    total = 0
    for tensor in [*model.parameters(), *model.buffers()]:
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        cast = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
        total += tensor.numel() * cast.itemsize
    return total


def predict_load(model: nn.Module, ckpt: Checkpoint, spec: LoadSpec) -> LoadMemory:
    """Predict the RSS of loading ``ckpt`` into ``model`` (meta device is enough) by ``spec``."""
    tally = _Tally()
    notes: list[str] = []
    method = spec.kind
    files_kept: set[int] = set()
    if method is LoadMethod.FROM_PRETRAINED:
        files_kept = _from_pretrained(tally, ckpt, _targets(model, spec), spec)
        how = (
            "memory-mapped, each shard open until all are loaded"
            if spec.mmap
            else ("each file read whole (disable_mmap=True), one state dict until the end")
        )
        notes.append(f"from_pretrained: model on the meta device; {how}")
    else:
        if method is LoadMethod.LOAD_STATE_DICT:
            tally.anon += _model_bytes(model, spec.torch_dtype or torch.get_default_dtype())
            notes.append("the model's own parameters are allocated first, then copied into")
        total = ckpt.tensor_bytes
        if spec.mmap:
            if method is LoadMethod.LOAD_STATE_DICT:
                tally.file += total  # copy_ reads every mapped page
            else:
                tally.mapped += total
                files_kept = set(range(len(ckpt.file_bytes)))
        elif ckpt.format is CheckpointFormat.SAFETENSORS:
            tally.mark(max(ckpt.file_bytes))  # safetensors.torch.load(bytes): the bytes too
            tally.anon += total
        else:
            tally.anon += total
        tally.mark()
        notes.append(
            "the state dict's storages are views of the mapped file" if spec.mmap
            else "every storage is read into memory"
        )  # fmt: skip
    overhead = FIRST_LOAD_BYTES[method] + PER_TENSOR_BYTES[method] * len(ckpt.tensors)
    # a file's map lives on while a weight is a view of it, and the pages read stay in it
    if method is LoadMethod.FROM_PRETRAINED:
        stale = sum(size for index, size in tally.touched.items() if index in files_kept)
    else:
        stale = tally.file  # copied from the map; the state dict (and its map) is kept
    if tally.on_device:
        notes.append("weights on the GPU read their bytes through the map; host keeps none")
    return LoadMemory(
        peak=tally.peak + overhead,
        anon_at_peak=tally.anon_at_peak,
        file_at_peak=tally.file_at_peak,
        transient=tally.transient,
        overhead=overhead,
        kept=tally.anon + overhead,
        stale=stale,
        mapped=tally.mapped,
        on_device=tally.on_device,
        method=spec.describe(),
        notes=tuple(notes),
    )
