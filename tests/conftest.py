"""Shared fixtures: the checkout's policies, a CLI runner that runs topkgen in-process, the tiny
policy and its bundle, the C++ loader and scripts/gpu_check.py as a module. Shared helpers that
are not fixtures live in tests/support/."""

from __future__ import annotations

import fcntl
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_POLICY = ROOT / "policies" / "topk.yaml"
LEGACY_POLICY = ROOT / "policies" / "legacy" / "exact_n_grid.yaml"


@pytest.fixture(scope="session")
def default_policy():
    from topkgen import policy
    return policy.load(DEFAULT_POLICY)


@pytest.fixture(scope="session")
def legacy_policy():
    from topkgen import policy
    return policy.load(LEGACY_POLICY)


@pytest.fixture(scope="session")
def built_bundle(tmp_path_factory):
    """The default bundle, built once per test process with the real CLI (read-only: copy
    it before tampering)."""
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("built") / "out"
    proc = subprocess.run([sys.executable, "-m", "topkgen", "build", "--out", str(out), "-j", "2"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture
def cli():
    from topkgen.cli import main

    runner = CliRunner(mix_stderr=False)

    def run(*args: str):
        return runner.invoke(main, [str(a) for a in args], catch_exceptions=False)

    return run


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    """Tests never touch the user's cache; one cache serves the whole session."""
    import os
    os.environ.setdefault("TOPKGEN_CACHE_DIR", str(tmp_path_factory.mktemp("topkgen-cache")))


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("policy") / "tiny.yaml"
    from .support.tiny import TINY_POLICY

    path.write_text(TINY_POLICY)
    return path


@pytest.fixture(scope="module")
def tiny_bundle(tmp_path_factory, tiny_policy) -> Path:
    out = tmp_path_factory.mktemp("bundle") / "out"
    proc = subprocess.run([sys.executable, "-m", "topkgen", "build", "--policy", str(tiny_policy), "--out", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="session")
def one_launch_bundle(tmp_path_factory) -> Path:
    """A bundle of one kernel that merges a split in one launch (schema 7), built by the CLI
    beside its policy (policy.yaml)."""
    from .support.tiny import ONE_LAUNCH_POLICY

    base = tmp_path_factory.mktemp("one_launch")
    (base / "policy.yaml").write_text(ONE_LAUNCH_POLICY)
    proc = subprocess.run([sys.executable, "-m", "topkgen", "build", "--policy", str(base / "policy.yaml"),
                           "--out", str(base / "out")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return base / "out"


@pytest.fixture(scope="session")
def cpp():
    """`make cpp`, once per session; a lock keeps pytest-xdist workers from building twice."""
    from .support.cpp import CPP

    CPP.parent.mkdir(parents=True, exist_ok=True)
    with open(CPP.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc = subprocess.run(["make", "-s", "cpp"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return CPP


@pytest.fixture(scope="module")
def gc():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gpu_check(gc):
    """scripts/gpu_check.py, under the name some tests give it."""
    return gc
