"""The server the docs and example tests fork each script from (`torchfit.host.forking`).

A script (a guide page's Python blocks, an example) runs as ``python script.py [args]``
would run it, in a process of its own, but forked from a server that imported torch,
transformers and torchfit once: each script skips the 2-4 s of imports they all repeat.
"""

import os
import runpy
import sys
from pathlib import Path

from torchfit.host.forking import serve

#: What every script imports, or most of them (torch._dynamo: any script that uses a
#: DataLoader or an optimizer imports it, about 1 s).
PRELOAD = [
    "torch",
    "torch._dynamo",
    "transformers",
    "transformers.modeling_utils",
    "torchfit",
    "torchfit.memory",
    "torchfit.host",
    "torchfit.loaders",
    "torchfit.precision",
]


def run_script(request):
    """``python script [args]`` in ``cwd``, its standard output to the file ``stdout``."""
    out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(out, 1)
    os.chdir(request["cwd"])
    script = request["script"]
    sys.argv = [script, *request.get("args", [])]
    sys.path[0] = str(Path(script).parent)  # as python script.py puts it
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    serve(run_script, PRELOAD)
