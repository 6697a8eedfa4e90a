"""The kind of CPU the rules are keyed by, and the AVX2 rules under AVX2 dispatch."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchfit.memory.kernels.accuracy import ACCURACY, accuracy, rules_key
from torchfit.memory.kernels.machine import (
    CpuKind,
    CpuMachine,
    cpu_features,
    onednn_isa,
    this_cpu,
)

_AVX512 = dict.fromkeys(
    ["sse4_1", "avx", "avx2", "fma3", "avx512_f", "avx512_bw", "avx512_vl", "avx512_dq"], True
)
_AMX = {**_AVX512, "avx512_vnni": True, "avx512_bf16": True, "amx_tile": True, "amx_bf16": True}
_AMX["amx_int8"] = True
_AVX2_ENV = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}


@pytest.mark.parametrize(
    ("features", "environ", "expected"),
    [
        (_AVX512, {}, "AVX512_CORE"),
        (_AVX512, {"ONEDNN_MAX_CPU_ISA": "AVX2"}, "AVX2"),
        (_AVX512, {"DNNL_MAX_CPU_ISA": "avx2"}, "AVX2"),  # the older name, any case
        (_AVX512, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}, "AVX512_CORE"),  # caps only
        (_AMX, {}, "AVX512_CORE_AMX"),
        (_AMX, {"ONEDNN_MAX_CPU_ISA": "AVX10_1_512"}, "AVX512_CORE_BF16"),  # an alias
        (_AMX, {"ONEDNN_MAX_CPU_ISA": "DEFAULT"}, "AVX512_CORE_AMX"),
        ({"sse4_1": True, "avx": True}, {}, "AVX"),
        ({}, {}, ""),
    ],
)
def test_onednn_isa_is_the_cpus_best_capped_by_the_environment(features, environ, expected):
    assert onednn_isa(features, environ) == expected


@pytest.mark.parametrize(
    ("machine", "kind"),
    [
        (CpuMachine(threads=2, block=8), CpuKind.AVX2),
        (CpuMachine(threads=2, block=16), CpuKind.AVX512),
        (CpuMachine(threads=2, block=16, amx=True), CpuKind.AVX512_AMX),
        (CpuMachine(threads=2, block=1), CpuKind.OTHER),
    ],
)
def test_machines_are_keyed_by_kind(machine, kind):
    assert machine.kind is kind
    assert rules_key(machine)[1] is kind
    bound = accuracy(machine)
    assert bound.kind is kind
    assert bound.measured == (kind is not CpuKind.OTHER and ("2.13", kind) in ACCURACY)


def test_every_measured_kind_states_its_bounds():
    assert {kind for _, kind in ACCURACY} == {CpuKind.AVX2, CpuKind.AVX512, CpuKind.AVX512_AMX}
    for bound in ACCURACY.values():
        assert 0 < bound.trace <= bound.trace_grouped <= 0.6
        assert 0 < bound.trace <= bound.analytic <= 0.5
        assert 0 < bound.trace_autocast <= 0.05
        assert bound.worst


def test_this_cpu_follows_what_onednn_dispatches():
    machine = this_cpu()
    isa = onednn_isa()
    assert machine.block == (16 if isa.startswith("AVX512") else 8 if isa.startswith("AVX") else 1)
    assert machine.amx == (isa == "AVX512_CORE_AMX" and bool(cpu_features().get("amx_bf16")))


def _avx2_python(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **_AVX2_ENV}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )


def _needs_avx2():
    if not cpu_features().get("avx2"):
        # An AVX2 machine cannot emulate AVX-512 (nor a machine without AVX2, AVX2).
        pytest.skip("this CPU has no AVX2: oneDNN cannot be capped down to it")


def test_capping_onednn_to_avx2_changes_the_kind():
    _needs_avx2()
    done = _avx2_python("from torchfit.memory.kernels.machine import this_cpu; print(this_cpu())")
    assert done.returncode == 0, done.stderr
    assert "block=8" in done.stdout
    assert "amx=False" in done.stdout


def test_the_avx2_rules_hold_under_avx2_dispatch():
    """The AVX2 subset (`avx2_calls.py`) in a subprocess: under a minute."""
    _needs_avx2()
    here = Path(__file__).with_name("avx2_calls.py")
    env = {**os.environ, **_AVX2_ENV}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n0", "-p", "no:cacheprovider", str(here)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout
