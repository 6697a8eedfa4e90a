"""`import torchfit` needs only torch and numpy, and touches no network and no GPU."""

import subprocess
import sys
import textwrap

OPTIONAL = [
    "transformers",
    "accelerate",
    "bitsandbytes",
    "matplotlib",
    "tqdm",
    "hypothesis",
    "lightning",
    "pytorch_lightning",
    "lightning_fabric",
]


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
        import torchfit.integrations
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


def test_lightning_is_not_loaded_by_torchfit_but_by_its_integration():
    # Unblocked: importing torchfit (and the integrations package) must still not load
    # lightning; only torchfit.integrations.lightning does.
    result = _run(
        """
        import sys
        import torchfit, torchfit.integrations
        print("before:", sorted(m for m in ("lightning", "pytorch_lightning") if m in sys.modules))
        import torchfit.integrations.lightning
        print("after:", "lightning" in sys.modules)
        """
    )
    assert result.returncode == 0, result.stderr
    assert "before: []" in result.stdout
    assert "after: True" in result.stdout


def test_missing_lightning_names_the_extra():
    result = _run(
        """
        import sys

        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("lightning", "pytorch_lightning"):
                    raise ImportError("blocked")
                return None

        sys.meta_path.insert(0, Block())
        try:
            import torchfit.integrations.lightning
        except ImportError as e:
            print(e)
        """
    )
    assert "pip install 'torchfit[lightning]'" in result.stdout, result.stderr
