"""The server `measure_load` forks each load from: the same numbers as a new interpreter."""

import json
import os
import subprocess

import pytest

from torchfit.host import LoadSpec, measure_load
from torchfit.host.forking import fault_in, resident_file_pages, run_forked
from torchfit.host.rss import read_rss

MiB = 2**20
PAGE = os.sysconf("SC_PAGE_SIZE")


def test_the_resident_runs_are_the_file_backed_resident_set():
    runs = resident_file_pages()
    mapped = sum(pages for _, pages in runs) * PAGE
    assert runs == sorted(runs)
    assert all(pages > 0 for _, pages in runs)
    # file pages only (bit 61): a library's private, written pages are RssAnon (measured
    # equal to the KiB on torch and transformers; 8% over when they were counted too)
    assert 0.98 * read_rss().file <= mapped <= 1.02 * read_rss().file


def _forked_file_rss(runs):
    """RssFile of a fork of this process before and after `fault_in` (``/proc`` of the child)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: two readings, then out without any teardown
        try:
            before = read_rss().file
            fault_in(runs)
            os.write(write, json.dumps([before, read_rss().file]).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as answer:
        readings = json.loads(answer.read())
    os.waitpid(pid, 0)
    return readings


def test_a_fork_starts_without_the_parents_library_pages_until_it_touches_them():
    # why `fault_in` exists: Linux leaves file-backed page table entries out at fork
    runs = resident_file_pages()
    parent = read_rss().file
    before, after = _forked_file_rss(runs)
    assert before < 0.8 * parent, (before / MiB, parent / MiB)
    assert abs(after - parent) <= 0.05 * parent, (after / MiB, parent / MiB)


@pytest.mark.slow
def test_a_forked_load_measures_what_a_new_interpreter_measures(checkpoints):
    # an extra environment variable gets a new interpreter (see `measure_load`)
    spec = LoadSpec(dtype="bf16")
    forked = measure_load(checkpoints["fp32"], spec)
    fresh = measure_load(checkpoints["fp32"], spec, env={"TORCHFIT_TEST_FRESH": "1"})
    # without `fault_in` a fork counts the library pages it touches again: about 10 MiB
    for field in ("peak", "after", "in_use", "baseline"):
        difference = getattr(forked, field) - getattr(fresh, field)
        assert abs(difference) <= 2 * MiB, (field, forked, fresh)


ECHO = "tests.host.fork_echo"


def _echo(env, **request):
    status, output = run_forked(ECHO, {"name": "TORCHFIT_TEST_MARK", **request}, env, 60)
    return status, json.loads(output.splitlines()[0]), output


def test_each_request_is_a_new_child_of_one_server_and_sees_the_callers_environment():
    env = {**os.environ, "TORCHFIT_TEST_MARK": "a"}
    status, first, _ = _echo(env)
    assert status == 0
    assert first["seen"] == "a"
    # a variable nobody reads at a process's start: the same server, a new child
    status, second, _ = _echo({**env, "TORCHFIT_TEST_MARK": "b"})
    assert (status, second["seen"], second["server"]) == (0, "b", first["server"])
    assert second["pid"] != first["pid"]
    # one read when a process starts (OpenMP's): a new server
    _, third, _ = _echo({**env, "OMP_NUM_THREADS": "3"})
    assert third["server"] != first["server"]


def test_a_failing_child_returns_its_traceback_and_the_server_goes_on():
    env = dict(os.environ)
    status, _, output = _echo(env, fail=True)
    assert status == 1
    assert "RuntimeError: asked to fail" in output
    assert _echo(env)[0] == 0


def test_a_child_past_its_timeout_is_killed_with_its_server_and_the_next_one_runs():
    env = dict(os.environ)
    _, before, _ = _echo(env)
    with pytest.raises(subprocess.TimeoutExpired):
        run_forked(ECHO, {"name": "X", "sleep": 30}, env, 0.5)
    with pytest.raises(ProcessLookupError):
        os.kill(before["server"], 0)  # gone (its session killed), not left behind
    status, after, _ = _echo(env)
    assert status == 0
    assert after["server"] != before["server"]


def test_a_fork_of_the_caller_starts_its_own_server_and_leaves_its_parents_alone():
    env = dict(os.environ)
    _, parents, _ = _echo(env)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a DataLoader worker, say: its pipes to the server are its parent's
        try:
            _, seen, _ = _echo(env)
            os.write(write, json.dumps(seen).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as answer:
        childs = json.loads(answer.read() or "{}")
    os.waitpid(pid, 0)
    assert childs.get("server") not in (None, parents["server"]), childs
    _, again, _ = _echo(env)
    assert again["server"] == parents["server"]


@pytest.mark.slow
def test_a_failing_load_says_why(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "no-such-model"}')
    with pytest.raises(RuntimeError, match="no-such-model"):
        measure_load(tmp_path)


def test_without_linuxs_proc_measure_load_says_so_before_starting_anything(monkeypatch):
    from torchfit.host import rss

    monkeypatch.setattr(rss, "CLEAR_REFS", rss.Path("/nonexistent/clear_refs"))
    with pytest.raises(OSError, match=r"Linux's /proc .*load_memory predicts"):
        measure_load("/nonexistent/checkpoint")
