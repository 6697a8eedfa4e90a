"""`import torchfit` needs only torch and numpy, and touches no network and no GPU."""

import subprocess
import sys
import textwrap

OPTIONAL = ["transformers", "accelerate", "bitsandbytes", "matplotlib", "tqdm", "hypothesis"]


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_import_with_optional_packages_blocked():
    result = _run(
        f"""
        import sys

        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {OPTIONAL!r}:
                    raise ImportError("blocked: " + name)
                return None

        sys.meta_path.insert(0, Block())
        import socket

        def no_network(*args, **kwargs):
            raise AssertionError("network touched at import")

        socket.socket.connect = no_network
        import torch
        torch.cuda.init = lambda: (_ for _ in ()).throw(AssertionError("GPU touched"))
        import torchfit, torchfit.memory, torchfit.loaders, torchfit.precision, torchfit.quantize
        loaded = sorted(m for m in {OPTIONAL!r} if m in sys.modules)
        print("loaded:", loaded)
        print("version:", torchfit.__version__)
        """
    )
    assert result.returncode == 0, result.stderr
    assert "loaded: []" in result.stdout


def test_missing_extra_names_the_pip_command():
    result = _run(
        """
        import sys

        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "transformers":
                    raise ImportError("blocked")
                return None

        sys.meta_path.insert(0, Block())
        from torchfit._core.imports import require
        try:
            require("transformers", feature="estimating from a transformers config")
        except ImportError as e:
            print(e)
        """
    )
    assert "pip install 'torchfit[hf]'" in result.stdout, result.stderr
