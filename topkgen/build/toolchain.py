"""The exact identity of the toolchain that turns CUDA source into a cubin.

NVRTC's `major.minor` does not pin what a compile reads: the header wheels (CRT, CCCL,
runtime) move independently, and a machine may load a system libnvrtc or point
TOPKGEN_CUDA_INCLUDE at another header tree. A cache shared between machines must not hand
out a cubin made by a different toolchain (the bug class of sccache #2299), so the identity
covers the exact wheel versions, the files those wheels installed (their RECORD hashes), the
libnvrtc actually loaded, and the header tree actually passed with -I. Every part is
independent of where things are installed, so two installs with the same pins agree.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

# The wheels whose files NVRTC reads: the compiler itself and the headers kernels include.
CUDA_WHEELS = ("nvidia-cuda-nvrtc", "nvidia-cuda-runtime", "nvidia-cuda-crt", "nvidia-cuda-cccl")


def identify(nvrtc_version: str, nvrtc_library: Path, include_dir: Path) -> dict[str, Any]:
    """The toolchain record that the manifest and every action record carry."""
    dists = _installed(CUDA_WHEELS)
    return {
        "nvrtc": nvrtc_version,
        "wheels": {name: (dists[name].version if name in dists else None) for name in CUDA_WHEELS},
        "wheel_files_sha256": wheel_files_digest(list(dists.values())),
        "nvrtc_library_sha256": library_sha256(nvrtc_library, list(dists.values())),
        "headers_sha256": tree_digest(include_dir),
    }


def digest(record: dict[str, Any]) -> str:
    """One sha256 for a toolchain record: what cache keys include."""
    return hashlib.sha256(json.dumps(record, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _installed(names: tuple[str, ...]) -> dict[str, metadata.Distribution]:
    found = {}
    for name in names:
        try:
            found[name] = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def _recorded_files(dist: metadata.Distribution) -> list[metadata.PackagePath]:
    """Files a wheel installed, without its own metadata: INSTALLER, REQUESTED and
    direct_url.json differ between pip and uv or between installs of the same wheel."""
    return [f for f in dist.files or () if f.hash is not None and ".dist-info/" not in f.as_posix()
            and "__pycache__" not in f.parts]


def wheel_files_digest(dists: list[metadata.Distribution]) -> str:
    """sha256 over (wheel, version, relative path, recorded hash) of every installed file.
    RECORD paths are relative to site-packages, so the digest does not depend on where the
    environment lives."""
    lines = []
    for dist in dists:
        wheel = f"{dist.metadata['Name'].lower()}=={dist.version}"  # parsed once: METADATA is not cheap to read
        lines += [f"{wheel} {f.as_posix()} {f.hash.mode}={f.hash.value}" for f in _recorded_files(dist)]
    lines.sort()
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def library_sha256(library: Path, dists: list[metadata.Distribution]) -> str:
    """sha256 of a shared library: from its wheel's RECORD when a wheel installed it (reading
    110 MiB on every start would cost more than a warm build), else from its bytes."""
    real = library.resolve()
    for dist in dists:
        for f in _recorded_files(dist):
            if f.hash.mode == "sha256" and Path(dist.locate_file(f)).resolve() == real:
                raw = base64.urlsafe_b64decode(f.hash.value + "=" * (-len(f.hash.value) % 4))
                return raw.hex()
    return _file_sha256(real)


@lru_cache(maxsize=8)
def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tree_digest(root: Path) -> str:
    """sha256 over every file below `root`: relative path and content, so a one-byte edit to
    any header (or a different tree) changes it, and the tree's location does not."""
    entries = []
    for folder, _dirs, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        for name in files:
            with open(os.path.join(folder, name), "rb") as f:
                entries.append(f"{os.path.normpath(os.path.join(rel, name))} {hashlib.sha256(f.read()).hexdigest()}")
    return hashlib.sha256("\n".join(sorted(entries)).encode()).hexdigest()
