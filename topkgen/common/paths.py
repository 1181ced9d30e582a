"""Where topkgen finds CUDA headers (pip wheels, never a system toolkit) and its caches.
How it reads and writes files there is topkgen.common.files."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from topkgen.common.errors import InputError


class HeadersNotFound(InputError, RuntimeError):
    """The machine lacks the CUDA headers NVRTC needs: a set-up to fix, said in one line
    (exit 2), not an internal error of topkgen."""


class CacheDirUnusable(InputError, RuntimeError):
    """TOPKGEN_CACHE_DIR that names no directory at all (`~nobody/cache`: no such user):
    a setting to fix, said in one line naming the variable (exit 2)."""


# What a kernel's compile includes from the CUDA include folder (nv/target is NVRTC's own).
CUDA_HEADERS = ("cuda_bf16.h", "cuda_fp16.h", "crt/host_defines.h")


def has_cuda_headers(folder: Path) -> bool:
    return all((folder / name).is_file() for name in CUDA_HEADERS)


@lru_cache(maxsize=1)
def cuda_include_dir() -> Path:
    """The include folder of the nvidia-cuda-* wheels (cuda_fp16.h, cuda_bf16.h, nv/target).
    TOPKGEN_CUDA_INCLUDE overrides it (a machine whose Python lacks the header wheels); a
    folder without the headers is refused here, naming the variable, rather than by NVRTC's
    log for the first kernel."""
    import importlib.util

    override = os.environ.get("TOPKGEN_CUDA_INCLUDE")
    if override:
        if not has_cuda_headers(Path(override)):
            raise HeadersNotFound(f"TOPKGEN_CUDA_INCLUDE={override}: not a CUDA include folder (it needs "
                                  f"{', '.join(CUDA_HEADERS)})")
        return Path(override)
    spec = importlib.util.find_spec("nvidia")
    for base in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(base) / "cu13" / "include"
        if has_cuda_headers(candidate):
            return candidate
    raise HeadersNotFound("CUDA headers not found: install the nvidia-cuda-runtime, nvidia-cuda-crt and "
                          "nvidia-cuda-cccl wheels (pip install topkgen pulls them in), or set "
                          "TOPKGEN_CUDA_INCLUDE to a CUDA include folder")


def _explicit_cache_dir() -> str:
    """TOPKGEN_CACHE_DIR without surrounding blanks ('' when unset): `=' '` made a folder named
    ' ' in whatever directory a command ran in, `=' /x'` one named ' ' holding x."""
    return os.environ.get("TOPKGEN_CACHE_DIR", "").strip()


def cache_root() -> Path:
    """TOPKGEN_CACHE_DIR, else the user cache directory. A leading `~` is the home directory,
    as in the default: quoted (`TOPKGEN_CACHE_DIR="~/cache"`, a Dockerfile's ENV) the shell
    leaves it, and a folder named `~` appeared in whatever directory a command ran in."""
    explicit = _explicit_cache_dir()
    if explicit:
        try:
            return Path(explicit).expanduser()
        except RuntimeError:  # ~name of no user here: Python's "Could not determine home directory." (exit 70)
            tilde = explicit.split("/", 1)[0]
            raise CacheDirUnusable(unusable_message(explicit, f"{tilde} is no user's home directory here")) from None
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "topkgen"


def unusable_message(path: Path | str, problem: str, what: str = "the compile cache") -> str:
    """One line for a cache directory or file that cannot be used: the setting, the path, the remedy."""
    explicit = _explicit_cache_dir()
    where = f"TOPKGEN_CACHE_DIR={explicit}: " if explicit else ""
    sep = " " if problem.startswith(("is ", "cannot ")) else ": "
    return f"{where}cannot use {what}: {path}{sep}{problem}; set TOPKGEN_CACHE_DIR to a writable directory"


def cache_url() -> str:
    """TOPKGEN_CACHE_URL without surrounding blanks ('' when unset), read here alone so that
    the remote store and the directories a build protects are the same one."""
    return os.environ.get("TOPKGEN_CACHE_URL", "").strip()


def shared_cache_directory() -> Path | None:
    """The folder a file:// (or local://) TOPKGEN_CACHE_URL names: the shared cache on a
    mounted file system. None for an object store or when unset."""
    url = cache_url()
    if url.startswith(("file://", "local://")):
        return Path(url.split("://", 1)[1])
    return None


def cpp_include_dir() -> Path:
    """The folder holding topkgen/loader.hpp, the C++ loader's header (-I this): the
    checkout's loaders/cpp/include, or an installed wheel's topkgen/include."""
    here = Path(__file__).resolve()
    checkout = here.parents[2] / "loaders" / "cpp" / "include"
    if (checkout / "topkgen" / "loader.hpp").is_file():
        return checkout
    return here.parents[1] / "include"
