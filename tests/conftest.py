"""Shared fixtures: the checkout's policies and a CLI runner that runs topkgen in-process."""

from __future__ import annotations

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
