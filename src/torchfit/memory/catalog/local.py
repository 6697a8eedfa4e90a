"""A config.json on disk (a model folder, a single file, a cached Hub snapshot) as a config.

The file is checked before transformers reads it, so a bad file gets a message that
says what is wrong with it: not JSON, no ``model_type``, or a ``model_type`` this
transformers does not know. The last is what models with their own code have; their
code runs only when asked (``trust_remote_code=True``, ``--trust-remote-code``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from torchfit.memory.catalog.entries import _transformers

if TYPE_CHECKING:
    from transformers import PretrainedConfig

__all__ = ["config_file", "read_config", "read_json", "remote_code_error"]


def config_file(path: Path) -> Path:
    """The config.json of a folder, or the file itself.

    Raises:
        FileNotFoundError: there is no such file.
    """
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(
            f"no config.json at {str(path)!r}; pass a config.json file or a folder holding one "
            "(config.save_pretrained(folder) writes it), or a catalog name such as 'gpt2'"
        )
    return file


def read_json(file: Path) -> dict[str, Any]:
    """The JSON object of a config file, with its ``model_type`` checked.

    Raises:
        ValueError: not JSON, or no ``model_type``.
    """
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{str(file)!r} is not a JSON config file: {error}") from error
    if not isinstance(data, dict) or not data.get("model_type"):
        raise ValueError(
            f"{str(file)!r} has no 'model_type'; transformers needs it to pick the config "
            'class: add e.g. "model_type": "llama"'
        )
    return cast("dict[str, Any]", data)


def remote_code_error(where: str, model_type: str) -> ValueError:
    """The error for a ``model_type`` transformers does not know.

    Example:
        >>> print(remote_code_error("'org/model'", "newarch"))  # doctest: +ELLIPSIS
        'org/model': model_type 'newarch' is unknown to transformers ...; pass ...
    """
    version = _transformers().__version__
    return ValueError(
        f"{where}: model_type {model_type!r} is unknown to transformers {version}; pass "
        "--trust-remote-code (trust_remote_code=True), which runs the repository's own "
        "Python code on this machine, or upgrade transformers"
    )


def read_config(path: Path, *, trust_remote_code: bool = False) -> PretrainedConfig:
    """The transformers config of a config.json file or of a folder holding one.

    Offline (``local_files_only=True``). A ``model_type`` transformers does not know is
    read with the folder's own code only when ``trust_remote_code`` is true.

    Raises:
        FileNotFoundError: no config.json there.
        ValueError: not JSON, no ``model_type``, an unknown ``model_type`` (without
            ``trust_remote_code``), or a file transformers cannot read.
    """
    transformers = _transformers()
    file = config_file(path)
    data = read_json(file)
    known = data["model_type"] in transformers.CONFIG_MAPPING
    if not known and not trust_remote_code:
        raise remote_code_error(repr(str(file)), data["model_type"])
    target = file.parent if file.name == "config.json" else file
    try:
        config = transformers.AutoConfig.from_pretrained(
            str(target), local_files_only=True, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError, TypeError) as error:
        raise ValueError(f"transformers could not read {str(file)!r}: {error}") from error
    return cast("PretrainedConfig", config)
