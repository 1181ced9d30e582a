"""Running topkgen as a user does, in a subprocess or on a pseudo-terminal, and reading back
what it wrote: the helpers every folder of tests uses."""

from __future__ import annotations

import hashlib
import os
import pty
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOPKGEN = [sys.executable, "-m", "topkgen"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
ENV.pop("NO_COLOR", None)


def topkgen(*args, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess:
    """topkgen with `env` over this process's environment; asserts success unless check=False."""
    proc = subprocess.run([*TOPKGEN, *map(str, args)], capture_output=True, text=True, env={**os.environ, **env})
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def run_topkgen(*args, env: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
    """topkgen in a subprocess with ENV (or `env`), its output captured, not checked."""
    return subprocess.run([*TOPKGEN, *map(str, args)], capture_output=True, text=True,
                          env=env or ENV, **kwargs)


def tree(root: Path) -> dict[str, str]:
    """Every file under root, by relative path, with the sha256 of its bytes: two trees compare
    as their bytes do, and a failed comparison names the files that differ in a few lines
    (the bytes themselves filled megabytes of CI log with no test name in its tail)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def one_line_error(result, *fragments: str) -> None:
    """An input error as README promises it: exit 2, one line, naming each fragment; of a
    CliRunner result or a finished subprocess."""
    code = result.exit_code if hasattr(result, "exit_code") else result.returncode
    assert code == 2, (code, result.stderr)
    assert result.stderr.startswith("topkgen: error: ") and result.stderr.count("\n") == 1, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


def on_terminal(*args, env: dict | None = None, cwd=None) -> tuple[int, str]:
    """Run topkgen with stdout and stderr on a pseudo-terminal: (exit status, what it showed)."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "topkgen", *map(str, args)], stdout=follower, stderr=follower,
                            env=env or ENV, cwd=cwd)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    return proc.wait(), b"".join(chunks).decode()
