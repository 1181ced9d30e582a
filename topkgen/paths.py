"""Where topkgen finds CUDA headers (pip wheels, never a system toolkit) and its caches."""

from __future__ import annotations

import contextlib
import os
from functools import lru_cache
from pathlib import Path
from typing import Iterator


@lru_cache(maxsize=1)
def cuda_include_dir() -> Path:
    """The include folder of the nvidia-cuda-* wheels (cuda_fp16.h, cuda_bf16.h, nv/target).
    TOPKGEN_CUDA_INCLUDE overrides it (a machine whose Python lacks the header wheels)."""
    import importlib.util

    override = os.environ.get("TOPKGEN_CUDA_INCLUDE")
    if override:
        return Path(override)
    spec = importlib.util.find_spec("nvidia")
    for base in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(base) / "cu13" / "include"
        if (candidate / "cuda_bf16.h").is_file() and (candidate / "crt" / "host_defines.h").is_file():
            return candidate
    raise RuntimeError("CUDA headers not found: install the nvidia-cuda-runtime, nvidia-cuda-crt and "
                       "nvidia-cuda-cccl wheels (pip install topkgen pulls them in)")


def cache_root() -> Path:
    """TOPKGEN_CACHE_DIR, else the user cache directory."""
    explicit = os.environ.get("TOPKGEN_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "topkgen"


@contextlib.contextmanager
def temporary_beside(path: Path, data: bytes) -> Iterator[Path]:
    """`data` in a synced temporary file beside `path` (the same file system, so it can be
    renamed or linked into place); removed on exit if it is still there."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        yield tmp
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write(path: Path, data: bytes) -> None:
    """Write to a temporary file beside `path`, then rename it into place."""
    with temporary_beside(path, data) as tmp:
        os.replace(tmp, path)
