"""`measure_load`: the real peak RSS of one load path, in a fresh process.

``VmHWM`` (and ``getrusage``'s ``ru_maxrss``) is a high-water mark over the process's whole
life, and memory freed earlier may be kept by the C allocator and reused, so each load is
measured in a new interpreter: it imports what the path needs (torch, transformers, the
model's module, bitsandbytes for a quantized load; CUDA and cuBLAS when weights go to a
GPU), collects garbage, resets ``VmHWM``
(`torchfit.host.rss.reset_peak`) and reads the RSS: that is the *baseline*, the
interpreter and its libraries. Then it loads, and reports the peak and the end above that
baseline, then reads every weight once (a sum over each tensor) and reports the RSS again
(`LoadMeasurement.in_use`).

Importing torch and transformers takes seconds, more than a small load, so each load runs
in a child forked from one server (``python -m torchfit.host.measure --serve``,
`torchfit.host.forking`) that imported them once and never loads anything: the child starts
where a new interpreter stands after the same imports. The server lives as long as the
process that started it. Extra environment variables (``MALLOC_MMAP_THRESHOLD_``, read by
glibc when a program starts) get a new interpreter instead.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from torchfit._core.units import format_bytes
from torchfit.host import rss
from torchfit.host.forking import run_forked, serve, with_sys_path
from torchfit.host.spec import LoadMethod, LoadSpec

__all__ = ["LoadMeasurement", "measure_load"]


@dataclasses.dataclass(frozen=True)
class LoadMeasurement:
    """What a load really took, above the baseline of a process that imported its libraries.

    Attributes:
        peak: Peak RSS of the load (``VmHWM`` after, less the RSS before).
        after: RSS the loaded model holds when the call returns.
        anon_after: Anonymous part of `after`.
        file_after: File-backed part of `after`.
        in_use: RSS after every weight was read once.
        baseline: RSS of the process before the load (interpreter, torch, transformers...).
        seconds: Wall time of the load.
        spec: The load path measured.
    """

    peak: int
    after: int
    anon_after: int
    file_after: int
    in_use: int
    baseline: int
    seconds: float
    spec: str

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain Python values."""
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        """One line: the peak, what stays, the baseline."""
        return (
            f"{self.spec}: peak +{format_bytes(self.peak)}, after +{format_bytes(self.after)}, "
            f"in use +{format_bytes(self.in_use)} above a baseline of "
            f"{format_bytes(self.baseline)} ({self.seconds:.1f} s)"
        )


def measure_load(
    path: str | Path,
    spec: LoadSpec | None = None,
    *,
    timeout: float = 600.0,
    env: dict[str, str] | None = None,
) -> LoadMeasurement:
    """Load the checkpoint at ``path`` by ``spec`` in a fresh process and measure its RSS.

    Args:
        path: A checkpoint folder with ``config.json`` (``from_pretrained``,
            ``load_state_dict`` and ``assign`` build the model from it), or for
            ``torch.load`` a folder or a single file.
        spec: The load path (default: ``from_pretrained`` with its defaults).
        timeout: Seconds before the child is killed.
        env: Extra environment variables for the child (``MALLOC_ARENA_MAX``, say).

    Returns:
        A `LoadMeasurement`.

    Raises:
        RuntimeError: the child failed; the message holds its last lines of output.
        OSError: not Linux (``/proc`` is needed).

    Example:
        >>> import tempfile, torch
        >>> folder = Path(tempfile.mkdtemp())
        >>> torch.save({"w": torch.ones(2**20)}, folder / "sd.pt")  # 4 MiB
        >>> m = measure_load(folder / "sd.pt", LoadSpec(method="torch.load", mmap=False))
        >>> 4 * 2**20 <= m.peak < 8 * 2**20
        True
    """
    if not rss.CLEAR_REFS.exists():  # before a server starts that could not measure anything
        raise OSError(
            f"measure_load resets and reads a process's peak RSS through Linux's /proc "
            f"({rss.CLEAR_REFS} and VmHWM), which this system does not have; "
            "torchfit.host.load_memory predicts the same load without measuring it"
        )
    spec = spec or LoadSpec()
    args = {"path": str(path), "spec": spec.to_dict()}
    child_env = {**os.environ, **(env or {})}
    if env:
        returncode, output = _run_fresh(args, child_env, timeout)
    else:
        returncode, output = run_forked("torchfit.host.measure", args, child_env, timeout)
    lines = [line for line in output.splitlines() if line.startswith("{")]
    if returncode != 0 or not lines:
        tail = "\n".join(output.strip().splitlines()[-15:])
        raise RuntimeError(f"measuring {spec.describe()} on {path} failed:\n{tail}")
    return LoadMeasurement(**json.loads(lines[-1]))


def _run_fresh(args: dict[str, Any], env: dict[str, str], timeout: float) -> tuple[int, str]:
    """The child in a new interpreter: its exit status and output."""
    done = subprocess.run(  # noqa: S603 - our own interpreter running our own module
        [sys.executable, "-m", "torchfit.host.measure", json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=with_sys_path(env),
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


#: What the server each child forks from imports first: torch (about 1.5 s) and
#: transformers with its model base class (about 1 s more), the bulk of a child's start.
_PRELOAD = ("torch", "transformers", "transformers.modeling_utils")


# -- the child --------------------------------------------------------------------------


def _files(path: Path, spec: LoadSpec) -> list[Path]:
    if path.is_file():
        return [path]
    from torchfit.host.checkpoint import _files as checkpoint_files  # noqa: PLC0415

    if spec.kind is LoadMethod.FROM_PRETRAINED:
        return []
    return checkpoint_files(path)[1]


def _state_dict(files: list[Path], spec: LoadSpec) -> dict[str, Any]:
    import torch  # noqa: PLC0415

    state: dict[str, Any] = {}
    for file in files:
        if file.suffix == ".safetensors":
            import safetensors.torch  # noqa: PLC0415

            if spec.mmap:
                state.update(safetensors.torch.load_file(file))
            else:
                state.update(safetensors.torch.load(file.read_bytes()))
        else:
            state.update(
                torch.load(file, map_location="cpu", mmap=spec.mmap, weights_only=spec.weights_only)
            )
    return state


def _prepare(path: Path, spec: LoadSpec) -> Any:
    """Import and build everything the load needs, before the baseline is read."""
    import torch  # noqa: PLC0415

    if spec.kind is LoadMethod.TORCH_LOAD:
        return None
    if spec.device_map not in (None, "cpu"):
        # CUDA's own host memory (driver, runtime, cuBLAS) belongs to the baseline
        x = torch.ones(256, 256, device="cuda")
        (x @ x).sum().item()
    import transformers  # noqa: PLC0415

    config = transformers.AutoConfig.from_pretrained(path)
    cls = getattr(transformers, (config.architectures or ["AutoModelForCausalLM"])[0])
    if spec.bits is not None:
        import bitsandbytes  # noqa: F401, PLC0415
        import transformers.integrations.bitsandbytes  # noqa: PLC0415
    if spec.kind is LoadMethod.FROM_PRETRAINED:
        return cls
    with torch.device("meta"):
        cls._from_config(config)  # import the modeling code and build once, unmeasured
    return cls, config


def _load(path: Path, spec: LoadSpec, prepared: Any) -> Any:
    import torch  # noqa: PLC0415

    if spec.kind is LoadMethod.TORCH_LOAD:
        return _state_dict(_files(path, spec), spec)
    if spec.kind is LoadMethod.FROM_PRETRAINED:
        kwargs: dict[str, Any] = {"disable_mmap": not spec.mmap}
        if spec.torch_dtype is not None:
            kwargs["dtype"] = spec.torch_dtype
        if spec.device_map is not None:
            kwargs["device_map"] = spec.device_map
        if spec.bits is not None:
            import transformers  # noqa: PLC0415

            kwargs["quantization_config"] = transformers.BitsAndBytesConfig(  # type: ignore[no-untyped-call]
                load_in_4bit=spec.bits == 4,
                load_in_8bit=spec.bits == 8,
                bnb_4bit_use_double_quant=spec.double_quant,
                llm_int8_skip_modules=list(spec.skip_modules) or None,
            )
        return prepared.from_pretrained(path, **kwargs)
    cls, config = prepared
    dtype = spec.torch_dtype if spec.kind is LoadMethod.LOAD_STATE_DICT else None
    device = "cpu" if spec.kind is LoadMethod.LOAD_STATE_DICT else "meta"
    with torch.device(device):
        model = cls._from_config(config, dtype=dtype)
    state = _state_dict(_files(path, spec), spec)
    model.load_state_dict(state, strict=False, assign=spec.kind is LoadMethod.ASSIGN)
    return model, state


def _read_all(loaded: Any) -> None:
    import torch  # noqa: PLC0415

    tensors = loaded.values() if isinstance(loaded, dict) else loaded[0].state_dict().values() if (
        isinstance(loaded, tuple)) else loaded.state_dict().values()  # fmt: skip
    with torch.no_grad():
        for tensor in tensors:
            if isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu":
                tensor.view(-1)[:: max(1, 4096 // max(tensor.element_size(), 1))].sum()


def _child(args: dict[str, Any]) -> None:
    import gc  # noqa: PLC0415
    import time  # noqa: PLC0415

    from torchfit.host.rss import read_rss, reset_peak  # noqa: PLC0415

    raw = args["spec"]
    spec = LoadSpec(**{**raw, "skip_modules": tuple(raw["skip_modules"])})
    path = Path(args["path"])
    prepared = _prepare(path, spec)
    gc.collect()
    if not reset_peak():
        raise OSError("cannot reset VmHWM (/proc/self/clear_refs); the peak would be wrong")
    start = read_rss()
    began = time.perf_counter()
    loaded = _load(path, spec, prepared)
    seconds = time.perf_counter() - began
    end = read_rss()
    _read_all(loaded)
    used = read_rss()
    print(json.dumps({  # noqa: T201 - the parent reads this line
        "peak": end.peak - start.rss,
        "after": end.rss - start.rss,
        "anon_after": end.anon - start.anon,
        "file_after": end.file - start.file,
        "in_use": used.rss - start.rss,
        "baseline": start.rss,
        "seconds": seconds,
        "spec": spec.describe(),
    }))  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        serve(_child, _PRELOAD)
    else:
        _child(json.loads(sys.argv[1]))
