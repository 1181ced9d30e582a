"""scripts/check_setup.sh, which `make` runs first (issue 32): each Debian package a fresh
machine lacks (python3-venv, g++, libssl-dev) is named, not left to a venv or compiler error.
A missing package is made missing for real: ensurepip that cannot be imported, a compiler
that is not there, a compiler that sees no system headers."""

from __future__ import annotations

import os
import subprocess
import sys

from ..conftest import ROOT

SCRIPT = ROOT / "scripts" / "check_setup.sh"


def _check(what: str, tmp_path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", str(SCRIPT), what], capture_output=True, text=True,
                          env={**os.environ, "PYTHON": sys.executable, **env}, cwd=tmp_path)


def _without_ensurepip(tmp_path) -> str:
    """A PYTHONPATH on which `import ensurepip` fails, as on Debian without python3-venv."""
    (tmp_path / "shadow" / "ensurepip").mkdir(parents=True)
    (tmp_path / "shadow" / "ensurepip" / "__init__.py").write_text("raise ImportError('python3-venv is missing')\n")
    return str(tmp_path / "shadow")


def test_a_complete_machine_passes_silently(tmp_path):
    for what in ("build", "cpp"):
        assert (_check(what, tmp_path).returncode, _check(what, tmp_path).stderr) == (0, "")


def test_no_venv_is_named_as_python3_venv(tmp_path):
    result = _check("build", tmp_path, PYTHONPATH=_without_ensurepip(tmp_path))
    assert result.returncode == 2
    assert "install python3-venv (Debian: apt-get install python3-venv)" in result.stderr
    assert result.stderr.splitlines()[-1] == "setup: missing: python3-venv; on Debian: sudo apt-get install python3-venv"


def test_no_compiler_is_named_as_g_plus_plus_a_warning_for_build(tmp_path):
    build = _check("build", tmp_path, CXX="no-such-g++")
    assert build.returncode == 0
    assert "install g++ (Debian: apt-get install g++)" in build.stderr
    assert "warning: make build goes on; make test and make cpp need: g++" in build.stderr
    cpp = _check("cpp", tmp_path, CXX="no-such-g++")
    assert cpp.returncode == 2 and cpp.stderr.splitlines()[-1] == "setup: missing: g++; on Debian: sudo apt-get install g++"


def test_no_openssl_header_is_named_as_libssl_dev(tmp_path):
    cpp = _check("cpp", tmp_path, CXX="g++ -nostdinc")  # a compiler that finds no system header
    assert cpp.returncode == 2
    assert "openssl/sha.h not found by g++ -nostdinc" in cpp.stderr and "install libssl-dev" in cpp.stderr


def test_make_build_stops_naming_the_package_before_making_the_venv(tmp_path):
    venv = tmp_path / "venv"
    proc = subprocess.run(["make", "-C", str(ROOT), "build", f"PYTHON={sys.executable}", f"VENV={venv}",
                           f"OUT={tmp_path / 'out'}"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": _without_ensurepip(tmp_path)})
    assert proc.returncode != 0
    assert "setup: missing: python3-venv; on Debian: sudo apt-get install python3-venv" in proc.stderr
    assert not venv.exists() and not (tmp_path / "out").exists()
