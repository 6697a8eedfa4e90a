"""docs/porting.md runs as written: its Python blocks, one script, in a fresh interpreter.

tests/test_docs.py runs the guides it lists the same way (`page_script`); this page's
examples also compare with accelerate, so they are checked here, with what they print.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from test_docs import DOCS, page_script


@pytest.mark.slow
def test_the_porting_page_runs_and_torchfit_hits_fewer_ooms(tmp_path):
    script = tmp_path / "porting.py"
    script.write_text(page_script(DOCS / "porting.md"), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found = dict(
        re.findall(r"^(accelerate|torchfit): batch \d+ after (\d+) out", done.stdout, re.MULTILINE)
    )
    assert int(found["torchfit"]) < int(found["accelerate"]), done.stdout
    assert "the loop returned a loss of" in done.stdout
    assert "binsearch, ported: batch" in done.stdout
