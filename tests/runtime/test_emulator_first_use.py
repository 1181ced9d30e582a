"""The emulator's first use of a kernel compiles it with g++ for about 2-6 s, silently until
issue 32: it says so on stderr, once per kernel; a cached kernel says nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

from ..conftest import ROOT


def _run(bundle, x, cache) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOPKGEN_CACHE_DIR": str(cache)}
    return subprocess.run([sys.executable, "-m", "topkgen", "run", "--bundle", str(bundle), "--backend", "emulator",
                           "--arch", "sm_90", "--k", "3", str(x)], capture_output=True, text=True, env=env)


def test_the_first_use_of_a_kernel_says_it_compiles_once(tiny_bundle, tmp_path):  # noqa: F811
    np.save(tmp_path / "x.npy", np.arange(200, dtype=np.float32).reshape(2, 100))
    first = _run(tiny_bundle, tmp_path / "x.npy", tmp_path / "cache")  # an empty emulator cache
    assert first.returncode == 0, first.stderr
    (line,) = first.stderr.splitlines()
    assert line.startswith("topkgen: compiling topk_") and line.endswith(" for the emulator (first use; cached)")
    again = _run(tiny_bundle, tmp_path / "x.npy", tmp_path / "cache")
    assert (again.returncode, again.stderr, again.stdout) == (0, "", first.stdout)
