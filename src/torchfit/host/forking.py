"""A server process that imports slow libraries once and forks a fresh child per request.

A measurement of a process's memory wants a new process each time (a high-water mark and a
C allocator that no earlier work has touched), but a new interpreter spends seconds
importing torch and transformers. A server imports them once, loads nothing, and forks: the
child starts as a copy of the server, its own heap untouched by any earlier request.

One difference from a new interpreter that imported the same: Linux does not copy the page
table entries of file-backed mappings nobody wrote to at ``fork`` (``mm/memory.c``,
``copy_page_range``: "a page fault will fill them correctly"), so the libraries' code pages
the server had mapped are not in the child's resident set until it touches them again, and
a child would count them as its own growth. `resident_file_pages` reads which of them the
server holds (``/proc/self/pagemap``: bit 63 "page present" and bit 61 "file-page or
shared-anon", readable without privileges since Linux 4.2;
``Documentation/admin-guide/mm/pagemap.rst``) and each child reads one byte of each before
it starts (`fault_in`), so that it starts where the server stood.
"""

from __future__ import annotations

import array
import atexit
import contextlib
import ctypes
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, NoReturn, cast

__all__ = ["fault_in", "resident_file_pages", "run_forked", "serve", "with_sys_path"]

_PAGE = os.sysconf("SC_PAGE_SIZE")
#: A page mapped from its file: present (bit 63) and a file page (bit 61). The private copy
#: of a written file page (a library's relocated data) is anonymous, and fork copies it.
_FILE_PAGE = (1 << 63) | (1 << 61)


def resident_file_pages() -> list[tuple[int, int]]:
    """This process's mapped pages of readable files, as ``(address, pages)`` runs."""
    runs: list[tuple[int, int]] = []
    proc = Path("/proc/self")
    with (proc / "maps").open() as maps, (proc / "pagemap").open("rb") as pagemap:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) < 6 or not fields[5].startswith("/") or fields[1][0] != "r":
                continue
            start, end = (int(bound, 16) for bound in fields[0].split("-"))
            pagemap.seek(start // _PAGE * 8)
            entries = array.array("Q", pagemap.read((end - start) // _PAGE * 8))
            first = None
            for index, entry in enumerate([*entries, 0]):
                mapped = entry & _FILE_PAGE == _FILE_PAGE
                if mapped and first is None:
                    first = index
                elif not mapped and first is not None:
                    runs.append((start + first * _PAGE, index - first))
                    first = None
    return runs


def fault_in(runs: Sequence[tuple[int, int]]) -> None:
    """Read one byte of every page of ``runs`` (from `resident_file_pages`) in this process."""
    for address, pages in runs:
        for page in range(pages):
            ctypes.string_at(address + page * _PAGE, 1)


# -- the server ---------------------------------------------------------------------------


def serve(target: Callable[[dict[str, Any]], None], preload: Sequence[str]) -> None:
    """Import ``preload``, then fork ``target(request)`` for each JSON line on stdin.

    Each child's output goes to the file named by the request's ``"log"``; the server
    answers each request with one line, ``{"exit": status}``, once the child is done.
    """
    for name in preload:
        importlib.import_module(name)
    resident = resident_file_pages()
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(target, request, resident)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"exit": os.waitstatus_to_exitcode(status)}), flush=True)  # noqa: T201


def _child(
    target: Callable[[dict[str, Any]], None],
    request: dict[str, Any],
    resident: list[tuple[int, int]],
) -> NoReturn:
    code = 1
    try:
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.environ.clear()
        os.environ.update(request["env"])
        fault_in(resident)
        target(request)
        code = 0
    except BaseException:  # noqa: BLE001 - reported through the log and the exit status
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class _Server:
    """The parent's end of one server: a request line in, an exit-status line out."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.env = _read_at_start(env)
        self.owner = os.getpid()
        self.process = subprocess.Popen(  # noqa: S603 - the caller's own interpreter
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,  # a timeout kills the server and its child together
        )
        self.requests = cast("IO[str]", self.process.stdin)  # both pipes, as asked above
        self.answers = cast("IO[str]", self.process.stdout)

    def run(self, request: dict[str, Any], timeout: float) -> tuple[int, str]:
        """Fork a child for ``request``: its exit status and everything it printed."""
        with tempfile.TemporaryDirectory(prefix="torchfit-fork-") as folder:
            log = Path(folder) / "child.log"
            self.requests.write(json.dumps({**request, "log": str(log)}) + "\n")
            self.requests.flush()
            if not select.select([self.answers], [], [], timeout)[0]:
                self.kill()
                raise subprocess.TimeoutExpired(self.process.args, timeout)
            answer = self.answers.readline()
            output = log.read_text(errors="replace") if log.exists() else ""
        if not answer:  # the server itself died (killed, or an import failed)
            return self.process.wait(), output
        return json.loads(answer)["exit"], output

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        if self.alive():
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self._close_pipes()

    def close(self) -> None:
        """End of input: the server returns once its child, if any, is done."""
        if os.getpid() != self.owner:  # a fork of the process that started it: not ours
            return
        with contextlib.suppress(BrokenPipeError):  # a dead server reads nothing
            self.requests.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()
        self._close_pipes()

    def _close_pipes(self) -> None:
        for pipe in (self.requests, self.answers):
            with contextlib.suppress(BrokenPipeError):
                pipe.close()


_servers: dict[tuple[int | str, ...], _Server] = {}
_lock = threading.Lock()

#: Environment variables read when a process starts or imports torch and transformers
#: (glibc's malloc tunables, the loader, Python, OpenMP, torch, the Hugging Face hub's
#: offline switch): a server whose start saw other values is started again. A child sets
#: the rest itself, before it runs (``CUDA_VISIBLE_DEVICES`` is read at CUDA's start).
_READ_AT_START = ("LD_", "MALLOC_", "GLIBC_", "PYTHON", "OMP_", "MKL_", "KMP_", "TORCH_",
                  "PYTORCH_", "HF_", "TRANSFORMERS_")  # fmt: skip


def _read_at_start(env: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if name.startswith(_READ_AT_START)}


def with_sys_path(env: dict[str, str]) -> dict[str, str]:
    """``env`` with this process's ``sys.path`` as ``PYTHONPATH``.

    A new interpreter then imports every module from where this process imports it (an
    uninstalled checkout, a test folder).
    """
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


def run_forked(
    module: str, request: dict[str, Any], env: dict[str, str], timeout: float
) -> tuple[int, str]:
    """Run ``request`` in a child of ``module``'s server, under ``env``: status and output.

    ``python -m module --serve`` must call `serve`; the server imports from this process's
    ``sys.path`` (`with_sys_path`). It is started on the first request, and again when it
    died or when ``env`` differs in a variable read at a process's start
    (`_READ_AT_START`); it ends with this process.

    Raises:
        subprocess.TimeoutExpired: the child ran past ``timeout`` (server and child killed).
    """
    env = with_sys_path(env)
    argv = [sys.executable, "-m", module, "--serve"]
    key: tuple[int | str, ...] = (os.getpid(), *argv)  # a fork of the caller starts its own
    with _lock:
        server = _servers.get(key)
        if server is not None and (server.env != _read_at_start(env) or not server.alive()):
            server.close()
            server = None
        if server is None:
            server = _servers[key] = _Server(argv, env)
            atexit.register(server.close)
        try:
            return server.run({**request, "env": env}, timeout)
        except subprocess.TimeoutExpired:
            del _servers[key]
            raise
