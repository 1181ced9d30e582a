"""`make test` reuses what `make build` compiled (issue 32): `make test-cache` imports the
bundles in OUT and OUT-legacy into the tests' compile cache, so the tests' default bundle is
all cache hits; without a bundle (a fresh clone) nothing is seeded. `make test-quick` names a
test file per stage, each of which exists."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from ..conftest import ROOT


def _make(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "TOPKGEN_CACHE_URL")}
    return subprocess.run(["make", "-s", "-C", str(ROOT), *args], capture_output=True, text=True, env=env)


def test_test_cache_seeds_the_tests_cache_from_make_builds_bundle(built_bundle, tmp_path):
    cache = tmp_path / "cache"
    seeded = _make("test-cache", f"OUT={built_bundle}", f"TEST_CACHE={cache}")
    assert seeded.returncode == 0, seeded.stderr
    assert f"imported {built_bundle}: 58 entries added, 0 already present, 0 skipped" in seeded.stdout
    rebuilt = subprocess.run([sys.executable, "-m", "topkgen", "build", "--out", str(tmp_path / "again")],
                             capture_output=True, text=True, env={**os.environ, "TOPKGEN_CACHE_DIR": str(cache),
                                                                  "PYTHONPATH": str(ROOT)})
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "cache: 58 local hits, 0 remote hits, 0 compiled" in rebuilt.stdout


def test_without_a_bundle_nothing_is_seeded(tmp_path):
    cache = tmp_path / "cache"
    seeded = _make("test-cache", f"OUT={tmp_path / 'none'}", f"TEST_CACHE={cache}")
    assert (seeded.returncode, seeded.stdout, seeded.stderr) == (0, "", "")
    assert not cache.exists()


def test_test_quick_names_a_file_per_stage():
    makefile = (ROOT / "Makefile").read_text()
    listed = re.search(r"^QUICK_TESTS = ((?:.*\\\n)*.*)$", makefile, re.M)[1].replace("\\\n", " ").split()
    assert all((ROOT / path).is_file() for path in listed), listed
    assert {path.split("/")[1] for path in listed} >= {"policy", "runtime", "diff", "cli", "loaders", "tools", "system"}
