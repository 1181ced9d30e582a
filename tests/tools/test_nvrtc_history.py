"""benchmarks/nvrtc_history.py: the same kernel compiled N times in one process and N times
each in a process of its own, each way's distinct cubins counted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "nvrtc_history.py"
KERNEL = "topk_register_ladder_k16_det_f32_sm_90"  # the plan's quickest compile


def test_it_counts_both_ways_compiles_of_the_kernel():
    proc = subprocess.run([sys.executable, str(SCRIPT), KERNEL, "--times", "2"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    ways = re.findall(r"^  (in one process|each in a process of its own): *\{(.*)\}$", proc.stdout, re.M)
    assert [way for way, _ in ways] == ["in one process", "each in a process of its own"]
    for _, counts in ways:
        found = dict(re.findall(r"'([0-9a-f]{12})': (\d+)", counts))
        assert sum(map(int, found.values())) == 2, counts


def test_a_kernel_the_plan_lacks_is_refused_with_its_name():
    proc = subprocess.run([sys.executable, str(SCRIPT), "topk_nothing_sm_90"], capture_output=True, text=True)
    assert proc.returncode == 2 and "topk_nothing_sm_90: not a kernel of the policy's plan" in proc.stderr
