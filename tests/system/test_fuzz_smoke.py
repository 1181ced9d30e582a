"""`make fuzz` keeps working: each target runs a few seconds and reports its cases and the
hypothesis seeds it ran (--seed moves them off CI's 1, 2, ...)."""

from __future__ import annotations

import re
import subprocess
import sys

from ..conftest import ROOT


def test_make_fuzz_runs_every_target_briefly():
    proc = subprocess.run([sys.executable, "-m", "tests.support.fuzz", "--seconds", "9", "--seed", "1000"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    for target in ("policy", "manifest", "run"):
        found = re.search(rf"fuzz {target}: (\d+) cases in 3 s \([^)]*\), 0 failures, seeds 1001\.\.\d+$",
                          proc.stdout, re.MULTILINE)
        assert found and int(found.group(1)) > 0, proc.stdout
    assert proc.stdout.rstrip().endswith("fuzz: no failures")
