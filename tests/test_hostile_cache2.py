"""Issue 33: what a hostile compile cache or bundle holds can neither run code, lie, leak
nor hang. Symlinked cache folders, ELF bombs, records that lie about their cubin, planted
emulator shared objects. Every subprocess runs under a timeout and an address-space limit."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from topkgen.build import cache

from .test_hostile_cache import one_line_error, topkgen
from .test_user_files import TINY_POLICY

ROOT = Path(__file__).resolve().parent.parent
CPP = ROOT / "build" / "cpp" / "topkgen-cpp"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    """The tiny policy's bundle (2 sm_90 kernels), built through the session's shared cache,
    and a private cache it was imported into (copy it before tampering)."""
    base = tmp_path_factory.mktemp("tiny")
    (base / "tiny.yaml").write_text(TINY_POLICY)
    shared = Path(os.environ["TOPKGEN_CACHE_DIR"])
    proc = topkgen("build", "--policy", base / "tiny.yaml", "--out", base / "out", cache_dir=shared)
    assert proc.returncode == 0, proc.stderr
    proc = topkgen("cache", "import", base / "out", cache_dir=base / "cache")
    assert proc.returncode == 0, proc.stderr
    return {"policy": base / "tiny.yaml", "bundle": base / "out", "cache": base / "cache"}


@pytest.fixture
def private(tiny, tmp_path) -> Path:
    shutil.copytree(tiny["cache"], tmp_path / "cache", symlinks=True)
    return tmp_path / "cache"


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


# ----------------------------------------------------------------------------- 4: symlinked cache folders

@pytest.mark.parametrize("folder", ["nvrtc-store", "nvrtc-store/ac", "nvrtc-store/cas"])
def test_a_cache_folder_that_is_a_symlink_is_refused_naming_it(tiny, tmp_path, folder):
    """`nvrtc-store/cas` linked elsewhere had every build write its cubins into the link's
    target, outside the cache: now exit 2 naming the folder, nothing written there."""
    cache_dir, outside = tmp_path / "cache", tmp_path / "outside"
    outside.mkdir()
    (cache_dir / folder).parent.mkdir(parents=True, exist_ok=True)
    for sub in ("nvrtc-store", "nvrtc-store/ac", "nvrtc-store/cas"):
        if sub != folder and not sub.startswith(folder + "/") and not folder.startswith(sub + "/"):
            (cache_dir / sub).mkdir(parents=True, exist_ok=True)
    (cache_dir / folder).symlink_to(outside)
    for command in (("build", "--policy", tiny["policy"], "--out", tmp_path / "out"),
                    ("cache", "import", tiny["bundle"])):
        proc = topkgen(*command, cache_dir=cache_dir)
        one_line_error(proc, f"{cache_dir / folder} is a symbolic link")
    assert _files(outside) == [] and not (tmp_path / "out").exists()


def test_a_file_url_store_whose_cas_is_a_symlink_is_refused(tiny, tmp_path):
    remote, outside = tmp_path / "remote", tmp_path / "outside"
    remote.mkdir()
    outside.mkdir()
    (remote / "cas").symlink_to(outside)
    proc = topkgen("cache", "import", tiny["bundle"], cache_dir=tmp_path / "cache",
                   env={"TOPKGEN_CACHE_URL": f"file://{remote}"})
    one_line_error(proc, f"TOPKGEN_CACHE_URL=file://{remote}: {remote / 'cas'} is a symbolic link")
    assert _files(outside) == []


def test_an_emulator_cache_folder_that_is_a_symlink_is_refused(tiny, tmp_path):
    """The emulator's shared objects were written into, and loaded from, the link's target."""
    import numpy as np

    cache_dir, outside = tmp_path / "cache", tmp_path / "outside"
    outside.mkdir()
    cache_dir.mkdir()
    (cache_dir / "emulator").symlink_to(outside)
    np.save(tmp_path / "x.npy", np.arange(200, dtype=np.float32).reshape(2, 100))
    proc = topkgen("run", "--bundle", tiny["bundle"], "--backend", "emulator", "--arch", "sm_90", "--k", "8",
                   tmp_path / "x.npy", cache_dir=cache_dir, timeout=120)
    one_line_error(proc, f"cannot use the emulator cache: {cache_dir / 'emulator'} is a symbolic link")
    assert _files(outside) == []
