"""Running topkgen against hostile input, bounded: every subprocess with a timeout and an
address-space limit (before their fixes, a symlink to /dev/zero took 24 GB and a FIFO hung)."""

from __future__ import annotations

import os
import resource
import subprocess
from pathlib import Path

from .commands import TOPKGEN

ADDRESS_SPACE = 4 << 30  # NVRTC needs well under this; reading /dev/zero to the end needs all there is


def bounded() -> None:
    """A subprocess's address-space limit (preexec_fn): a runaway read fails instead of taking the machine."""
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def bounded_topkgen(*args, cache_dir: Path, prefix: tuple[str, ...] = (), timeout: float = 120,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """topkgen with `cache_dir` as its cache and no remote, unless `env` names one."""
    full = {**os.environ, "TOPKGEN_CACHE_DIR": str(cache_dir)}
    full.pop("TOPKGEN_CACHE_URL", None)
    full.pop("XDG_RUNTIME_DIR", None)  # the private lock directory then goes to TMPDIR
    return subprocess.run([*prefix, *TOPKGEN, *map(str, args)], capture_output=True, text=True,
                          env={**full, **(env or {})}, timeout=timeout, preexec_fn=bounded)
