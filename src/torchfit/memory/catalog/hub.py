"""Hugging Face Hub ids: the local cache first, then the Hub (config.json only, never weights).

`hub_config_file` finds the ``config.json`` of a Hub id: in the Hugging Face cache
(``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``, read at each
call), else from the Hub through ``huggingface_hub`` (one request that is never retried,
so a machine without network fails in seconds, then the download of a file of about
1 KB). ``HF_HUB_OFFLINE=1`` keeps it to the cache; ``HF_TOKEN`` (or ``hf auth login``)
opens gated and private repositories. Every failure is a `HubError`, one line that
names the id, the reason and the fix.

`load_config` and `load_dtype` are what ``from_pretrained`` reads before the weights,
for `torchfit.quantize`.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from torchfit._core.imports import require
from torchfit.memory.catalog.build import model_dtype
from torchfit.memory.catalog.entries import _transformers
from torchfit.memory.catalog.local import read_config, read_json, remote_code_error

if TYPE_CHECKING:
    from types import ModuleType

__all__ = [
    "HUB_KWARGS",
    "HubError",
    "HubOptions",
    "cached_config",
    "hub_cache_dir",
    "hub_config",
    "hub_config_file",
    "hub_error",
    "hub_offline",
    "is_hub_id",
    "load_config",
    "load_dtype",
    "looks_like_path",
]

#: from_pretrained options that also apply to reading the config.
HUB_KWARGS = (
    "cache_dir",
    "force_download",
    "local_files_only",
    "revision",
    "subfolder",
    "token",
    "trust_remote_code",
)

#: Seconds the one request to the Hub may take (connect and answer) before giving up.
TIMEOUT_S = 5.0
_CONFIG = "config.json"
_LOGIN = "log in with `hf auth login` or set HF_TOKEN"


class HubError(OSError, ValueError):
    """A Hub id whose config could not be read: offline, gated, private or unknown.

    Both an ``OSError`` (what ``from_pretrained`` raises) and a ``ValueError`` (a name
    torchfit cannot resolve), so either ``except`` catches it.
    """


@dataclasses.dataclass(frozen=True)
class HubOptions:
    """How to read a Hub id: ``from_pretrained``'s options that apply to config.json."""

    revision: str | None = None
    token: str | bool | None = None
    cache_dir: str | os.PathLike[str] | None = None
    local_files_only: bool = False
    trust_remote_code: bool = False

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any]) -> HubOptions:
        """The options among ``from_pretrained`` keyword arguments."""
        return cls(
            revision=kwargs.get("revision"),
            token=kwargs.get("token"),
            cache_dir=kwargs.get("cache_dir"),
            local_files_only=bool(kwargs.get("local_files_only", False)),
            trust_remote_code=bool(kwargs.get("trust_remote_code", False)),
        )


def looks_like_path(text: str) -> bool:
    """Whether a name can only be a file or folder (never a catalog name or Hub id).

    Example:
        >>> looks_like_path("./llama"), looks_like_path("a/b/c"), looks_like_path("org/model")
        (True, True, False)
    """
    return (
        text.startswith(("/", ".", "~"))
        or text.endswith(".json")
        or text.count("/") > 1
        or Path(text).is_absolute()
    )


def is_hub_id(text: str) -> bool:
    """Whether a name has the form of a Hub model id, ``"org/name"``.

    Example:
        >>> is_hub_id("meta-llama/Llama-3.1-8B"), is_hub_id("gpt2"), is_hub_id("./a/b")
        (True, False, False)
    """
    return text.count("/") == 1 and not looks_like_path(text) and all(text.split("/"))


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) is set, read now.

    Example:
        >>> from unittest import mock
        >>> with mock.patch.dict("os.environ", {"HF_HUB_OFFLINE": "1"}):
        ...     hub_offline()
        True
    """
    flags = (os.environ.get(name, "") for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return any(flag.strip().upper() in {"1", "ON", "YES", "TRUE"} for flag in flags)


def hub_cache_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The Hugging Face cache folder: ``cache_dir``, ``$HF_HUB_CACHE``, ``$HF_HOME/hub``...

    Read at each call, so a changed environment applies at once.

    Example:
        >>> hub_cache_dir("/tmp/hf").as_posix()
        '/tmp/hf'
    """
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    cache_home = os.environ.get("XDG_CACHE_HOME") or Path("~/.cache").expanduser()
    home = os.environ.get("HF_HOME") or Path(cache_home) / "huggingface"
    return Path(home).expanduser() / "hub"


def cached_config(repo_id: str, options: HubOptions | None = None) -> Path | None:
    """The cached ``config.json`` of a Hub id, or ``None``: no network, nothing written.

    The cache layout is huggingface_hub's: ``models--org--name/refs/<revision>`` holds a
    commit hash, ``models--org--name/snapshots/<hash>/config.json`` the file. Without a
    ref for the revision asked (``main`` by default), a snapshot named by it is taken,
    and with no revision given, the newest snapshot holding a config.json.

    Example:
        >>> cached_config("no-org/no-model", HubOptions(cache_dir="/nonexistent")) is None
        True
    """
    options = options or HubOptions()
    folder = hub_cache_dir(options.cache_dir) / ("models--" + repo_id.replace("/", "--"))
    snapshots = folder / "snapshots"
    if not snapshots.is_dir():
        return None
    revision = options.revision or "main"
    ref = folder / "refs" / revision
    commit = ref.read_text(encoding="utf-8").strip() if ref.is_file() else revision
    exact = snapshots / commit / _CONFIG
    if exact.is_file():
        return exact
    if options.revision is not None:
        return None
    found = sorted(snapshots.glob(f"*/{_CONFIG}"), key=lambda p: p.stat().st_mtime, reverse=True)
    return found[0] if found else None


def _huggingface_hub() -> ModuleType:
    return require("huggingface_hub", feature="reading a Hugging Face Hub id")


def hub_config_file(repo_id: str, options: HubOptions | None = None) -> Path:
    """The ``config.json`` of a Hub id: from the cache, else downloaded (that file only).

    Raises:
        HubError: offline (``HF_HUB_OFFLINE`` or ``local_files_only``) and not cached; no
            network; a gated or private repository (log in); no such repository,
            revision or config.json. The message is one line.
    """
    options = options or HubOptions()
    cached = cached_config(repo_id, options)
    if cached is not None:
        return cached
    if options.local_files_only or hub_offline():
        flag = "HF_HUB_OFFLINE" if os.environ.get("HF_HUB_OFFLINE") else "TRANSFORMERS_OFFLINE"
        why = "local_files_only=True" if options.local_files_only else f"{flag} is set"
        missing = FileNotFoundError(
            f"{why}, and it is not in the Hugging Face cache at {hub_cache_dir(options.cache_dir)}"
        )
        raise hub_error(repo_id, missing) from missing
    hub = _huggingface_hub()
    url = hub.hf_hub_url(repo_id, _CONFIG, revision=options.revision)
    try:
        # one HEAD request, never retried: hf_hub_download alone retries for ~25 s offline
        hub.get_hf_file_metadata(url, token=options.token, timeout=TIMEOUT_S)
        path = hub.hf_hub_download(
            repo_id,
            _CONFIG,
            revision=options.revision,
            token=options.token,
            cache_dir=str(hub_cache_dir(options.cache_dir)),
            etag_timeout=TIMEOUT_S,
        )
    except Exception as error:
        raise hub_error(repo_id, error) from error
    return Path(path)


def hub_config(repo_id: str, options: HubOptions | None = None) -> tuple[Any, str]:
    """The transformers config of a Hub id, and where it came from (``"cache"``, ``"hub"``).

    `hub_config_file` finds the file (the cache first), then it is read.

    A ``model_type`` this transformers does not know needs ``trust_remote_code=True``:
    then transformers fetches and runs the repository's configuration code.

    Raises:
        HubError: the config could not be read (see `hub_config_file`).
        ValueError: an unknown ``model_type`` without ``trust_remote_code``.
    """
    options = options or HubOptions()
    source = "cache" if cached_config(repo_id, options) is not None else "hub"
    file = hub_config_file(repo_id, options)
    model_type = read_json(file)["model_type"]
    if model_type in _transformers().CONFIG_MAPPING:
        return read_config(file), source
    if not options.trust_remote_code:
        raise remote_code_error(repr(repo_id), model_type)
    try:  # the repository's own configuration class: its code comes with it
        config = _transformers().AutoConfig.from_pretrained(
            repo_id,
            trust_remote_code=True,
            revision=options.revision,
            token=options.token,
            cache_dir=str(hub_cache_dir(options.cache_dir)),
            local_files_only=options.local_files_only or hub_offline(),
        )
    except (OSError, ValueError) as error:
        raise hub_error(repo_id, error) from error
    return config, source


def _reason(error: BaseException) -> tuple[str, str]:
    """Why a Hub read failed, and what to do about it."""
    _huggingface_hub()
    errors = importlib.import_module("huggingface_hub.errors")
    if isinstance(error, errors.GatedRepoError):
        return "the repository is gated", f"accept its licence on huggingface.co, then {_LOGIN}"
    if isinstance(error, errors.RepositoryNotFoundError):
        return "no such repository, or it is private", f"check the id, or {_LOGIN}"
    if isinstance(error, errors.RevisionNotFoundError):
        return "no such revision", "check the revision"
    if isinstance(error, errors.EntryNotFoundError) and not isinstance(error, FileNotFoundError):
        return "the repository has no config.json", "it is not a transformers model"
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if isinstance(error, FileNotFoundError):
        return first, "go online once to cache its config.json (about 1 KB)"
    return f"no answer from the Hub: {first}", "check the network and the id"


def hub_error(name: str, error: BaseException, *, close: str = "") -> HubError:
    """The one-line error for a Hub id that could not be read: why, and what to pass.

    Example:
        >>> print(hub_error("org/model", FileNotFoundError("HF_HUB_OFFLINE is set")))
        ... # doctest: +ELLIPSIS
        loading 'org/model' from the Hugging Face Hub failed (HF_HUB_OFFLINE is set): go ...
    """
    reason, fix = _reason(error)
    hint = f"; close ones: {close}" if close else ""
    return HubError(
        f"loading {name!r} from the Hugging Face Hub failed ({reason}): {fix}; or pass the "
        "path of a folder holding its config.json (save_pretrained() writes one), or a "
        f"catalog name (`torchfit models`{hint})"
    )


def load_config(name: str, kwargs: dict[str, Any]) -> Any:
    """The config of a local folder or Hub id, read with ``from_pretrained``'s options.

    ``kwargs`` are the ``from_pretrained`` keyword arguments: a ``config`` there is
    returned as is, and the `HUB_KWARGS` among them apply. A Hub id is read as
    `hub_config_file` reads it (cache first; one request, no retries).

    Raises:
        FileNotFoundError: ``name`` can only be a path, and there is no folder there.
        HubError: the Hub (or the cache) could not give the config (`hub_error`).
        ValueError: an unknown ``model_type`` without ``trust_remote_code=True``.
    """
    transformers = _transformers()
    if kwargs.get("config") is not None:
        return kwargs["config"]
    if not Path(name).is_dir() and looks_like_path(name):
        raise FileNotFoundError(
            f"no model folder at {name!r}; pass the folder where save_pretrained() wrote "
            "config.json and the weights"
        )
    if Path(name).is_dir() or kwargs.get("subfolder") or kwargs.get("force_download"):
        hub = {k: kwargs[k] for k in HUB_KWARGS if k in kwargs}
        try:
            return transformers.AutoConfig.from_pretrained(name, **hub)
        except (OSError, ValueError) as e:
            if Path(name).is_dir():
                raise
            raise hub_error(name, e) from e
    return hub_config(name, HubOptions.from_kwargs(kwargs))[0]


def load_dtype(config: Any, kwargs: dict[str, Any]) -> torch.dtype:
    """The dtype ``from_pretrained`` gives unquantized modules.

    ``dtype=`` (or 4.x's ``torch_dtype=``) if passed and not ``"auto"``, else the
    config's (transformers 5 defaults to ``dtype="auto"``), else torch's default (fp32):
    `torchfit.memory.catalog.build.model_dtype`.
    """
    return model_dtype(config, kwargs.get("dtype", kwargs.get("torch_dtype")))
