"""A `torchfit.host.forking.serve` target for the tests: a child that says what it sees."""

import json
import os
import time

from torchfit.host.forking import serve


def echo(request):
    """Print the variable named in the request, this child's and its server's process ids."""
    seen = os.environ.get(request["name"])
    answer = {"seen": seen, "pid": os.getpid(), "server": os.getppid()}
    print(json.dumps(answer), flush=True)  # noqa: T201 - the test reads the output
    time.sleep(request.get("sleep", 0))
    if request.get("fail"):
        raise RuntimeError("asked to fail")


if __name__ == "__main__":
    serve(echo, preload=["json"])
