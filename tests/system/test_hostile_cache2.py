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
from pathlib import Path

import pytest

from topkgen.build import cache

from ..support.cpp import CPP
from ..support.commands import one_line_error
from ..support.hostile import bounded_topkgen as topkgen
from ..support.tiny import TINY_POLICY



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


# ----------------------------------------------------------------------------- 5: ELF bombs

def _bomb(cubin: bytes, how: str) -> bytes:
    """A cubin grown to just under 64 MiB (the bundle and cache bound on a file) whose
    sections make a naive walk endless: `headers`, 65535 section headers that each name one
    60 MiB symbol table (10^11 symbol visits); `symbols`, one table of 2.6 million symbols."""
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", cubin, 0x3A)
    headers = [cubin[shoff + i * shentsize:shoff + (i + 1) * shentsize] for i in range(shnum)]
    symtab = next(h for h in headers if struct.unpack_from("<I", h, 4)[0] == 2)
    link, = struct.unpack_from("<I", symtab, 40)
    table_at = (len(cubin) + 63) // 64 * 64
    table_size = (59 << 20) // 24 * 24
    body = cubin.ljust(table_at, b"\0") + bytes(table_size)
    forged = struct.pack("<IIQQQQIIQQ", 0, 2, 0, 0, table_at, table_size, link, 0, 8, 24)
    if how == "headers":
        headers = [h for h in headers if h is not symtab] + [forged] * (65535 - shnum + 1)
    else:
        headers = [forged if h is symtab else h for h in headers]
    new_shoff = len(body)
    out = bytearray(body + b"".join(headers))
    struct.pack_into("<Q", out, 0x28, new_shoff)
    struct.pack_into("<H", out, 0x3C, len(headers))
    assert len(out) < 64 << 20
    return bytes(out)


def _bombed_bundle(tiny, tmp_path: Path, how: str) -> tuple[Path, dict]:
    import hashlib

    bundle = tmp_path / "bundle"
    shutil.copytree(tiny["bundle"], bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    kernel = manifest["kernels"][0]
    data = _bomb((bundle / kernel["cubin"]).read_bytes(), how)
    (bundle / kernel["cubin"]).write_bytes(data)
    kernel["sha256"], kernel["size_bytes"] = hashlib.sha256(data).hexdigest(), len(data)
    (bundle / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return bundle, kernel


BOMBS = {"headers": "it has 65535 section headers (a loader reads at most 1024)",
         "symbols": f"its symbol table holds {(59 << 20) // 24} symbols (a loader reads at most 65536)"}


@pytest.mark.parametrize("how", list(BOMBS))
def test_an_elf_bomb_in_a_bundle_is_refused_by_show_import_and_the_cpp_loader(tiny, tmp_path, how):
    """Before: `show`, `cache import` and `topkgen-cpp verify` walked 65535 x 2.6 million
    symbols (or 2.6 million, in Python) without end; each now refuses at once, in the same words."""
    bundle, kernel = _bombed_bundle(tiny, tmp_path, how)
    why = f"kernels[0].cubin: {kernel['cubin']} is not a CUDA ELF file a loader reads: {BOMBS[how]}"
    for command in (("show", bundle), ("cache", "import", bundle)):
        proc = topkgen(*command, cache_dir=tmp_path / "cache", timeout=30)
        one_line_error(proc, why)
    proc = subprocess.run([str(CPP), "verify", str(bundle)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and why in proc.stderr, (proc.returncode, proc.stderr)


@pytest.mark.parametrize("how", list(BOMBS))
def test_a_cache_entry_that_is_an_elf_bomb_is_compiled_again_not_walked(tiny, private, tmp_path, how):
    """A build served from a cache entry whose cubin is an ELF bomb ran without end: the
    entry fails verification, so the kernel is compiled again and the entry repaired."""
    import hashlib

    manifest = json.loads((tiny["bundle"] / "manifest.json").read_text())
    kernel = manifest["kernels"][0]
    store = private / cache.LOCAL_DIR
    record_path = store / cache.ac_path(kernel["cache_key"])
    record = json.loads(record_path.read_text())
    data = _bomb((tiny["bundle"] / kernel["cubin"]).read_bytes(), how)
    digest = hashlib.sha256(data).hexdigest()
    (store / cache.cas_path(digest)).write_bytes(data)
    record.update(cubin_sha256=digest, cubin_size=len(data))
    record_path.write_text(json.dumps(record))
    proc = topkgen("build", "--policy", tiny["policy"], "--out", tmp_path / "out", cache_dir=private, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "1 local hits, 0 remote hits, 1 compiled" in proc.stdout, proc.stdout
    assert (tmp_path / "out" / kernel["cubin"]).read_bytes() == (tiny["bundle"] / kernel["cubin"]).read_bytes()
    assert json.loads(record_path.read_text())["cubin_sha256"] == kernel["sha256"]  # repaired


# ----------------------------------------------------------------------------- 2: records that lie

def _lie(store: Path, key: str, **resources: int) -> Path:
    record_path = store / cache.ac_path(key)
    record = json.loads(record_path.read_text())
    record["resources"].update(resources)
    record_path.write_text(json.dumps(record))
    return record_path


@pytest.mark.parametrize("lie", [{"registers": 1}, {"stack_bytes": 4096}])
@pytest.mark.parametrize("tier", ["local", "remote"])
def test_a_record_that_lies_about_its_cubin_is_a_loud_error_naming_it(tiny, private, tmp_path, lie, tier):
    """A record claiming 1 register for a cubin of 51 was built into the manifest (budgets
    checked against the lie), and show and the C++ loader took that bundle: the record is
    checked against its cubin's ELF, and a build stops, exit 2, naming the entry."""
    kernel = json.loads((tiny["bundle"] / "manifest.json").read_text())["kernels"][0]
    env = {}
    if tier == "local":
        record_path = _lie(private / cache.LOCAL_DIR, kernel["cache_key"], **lie)
        label, cache_dir = str(private / cache.LOCAL_DIR), private
    else:
        shutil.copytree(private / cache.LOCAL_DIR, tmp_path / "remote")
        record_path = _lie(tmp_path / "remote", kernel["cache_key"], **lie)
        env = {"TOPKGEN_CACHE_URL": f"file://{tmp_path / 'remote'}"}
        label, cache_dir = f"file://{tmp_path / 'remote'}", tmp_path / "empty-cache"
    (field, value), = lie.items()
    proc = topkgen("build", "--policy", tiny["policy"], "--out", tmp_path / "out", cache_dir=cache_dir, env=env)
    one_line_error(proc, f"{label}/{cache.ac_path(kernel['cache_key'])}: kernel {kernel['name']} (sm_90): its record "
                         f"says resources.{field} {value}, but its cubin {cache.cas_path(kernel['sha256'])} records "
                         f"{kernel['resources'][field]}; no compile wrote this record")
    assert not (tmp_path / "out").exists()
    assert json.loads(record_path.read_text())["resources"][field] == value  # left for the user to see, not replaced
    if tier == "remote":  # and never copied into the local tier
        assert not (cache_dir / cache.LOCAL_DIR / cache.ac_path(kernel["cache_key"])).exists()


def test_a_merge_part_that_lies_about_its_cubin_is_not_written(tiny, tmp_path):
    """No source of cubins reaches a bundle with resources its cubin contradicts: a part of a
    sharded build whose manifest claims 1 register was merged as it said."""
    shared = Path(os.environ["TOPKGEN_CACHE_DIR"])
    parts = [tmp_path / f"part{i}" for i in (1, 2)]
    for i, part in enumerate(parts, 1):
        proc = topkgen("build", "--policy", tiny["policy"], "--shard", f"{i}/2", "--out", part, cache_dir=shared)
        assert proc.returncode == 0, proc.stderr
    manifest = json.loads((parts[0] / "manifest.json").read_text())
    kernel = manifest["kernels"][0]
    kernel["resources"]["registers"] = 1
    (parts[0] / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    proc = topkgen("merge", *parts, "--out", tmp_path / "merged", cache_dir=shared)
    one_line_error(proc, f"kernels[0] ({kernel['name']}): its record says resources.registers 1, but its cubin "
                         f"{kernel['cubin']} records")
    assert not (tmp_path / "merged").exists()


# ----------------------------------------------------------------------------- 1: planted emulator objects

EMULATED = 'extern "C" __global__ void twice(int* out) { out[threadIdx.x] = 2 * threadIdx.x; }\n'
EMULATE = """
import sys
import numpy as np
from topkgen.emulator import compile_source
out = np.zeros(4, dtype=np.int32)
compile_source(sys.argv[1], name="twice").launch("twice", 1, 4, [out])
print(out.tolist())
"""
PLANTED = r"""
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
  FILE* f = fopen(MARKER, "w");
  if (f) { fputs("ran", f); fclose(f); }
}
"""


def _emulate(cache_dir: Path, state: Path) -> subprocess.CompletedProcess:
    from ..support.hostile import bounded

    env = {**os.environ, "TOPKGEN_CACHE_DIR": str(cache_dir), "XDG_STATE_HOME": str(state)}
    return subprocess.run([sys.executable, "-c", EMULATE, EMULATED], capture_output=True, text=True, env=env,
                          timeout=120, preexec_fn=bounded)


@pytest.mark.parametrize("record", ["own-sha256", "another-machines"])
def test_a_planted_emulator_object_is_never_loaded_but_built_again(tmp_path, record):
    """A shared object planted in the emulator cache with a `.sha256` that matches it was
    loaded (its constructor ran), then `internal error: AttributeError`, exit 70. The cache
    now knows what it expects: an HMAC under a key of this machine, outside the cache, of
    the rebuild key and the object; anything else is built again and never loaded."""
    import hashlib

    cache_dir, state = tmp_path / "cache", tmp_path / "state"
    first = _emulate(cache_dir, state)
    assert first.returncode == 0 and first.stdout == "[0, 2, 4, 6]\n", first.stderr
    so = next((cache_dir / "emulator").glob("*.so"))
    good = so.read_bytes()
    marker = tmp_path / "constructor-ran"
    planted = tmp_path / "planted.so"
    subprocess.run(["g++", "-shared", "-fPIC", f'-DMARKER="{marker}"', "-x", "c++", "-", "-o", str(planted)],
                   input=PLANTED, text=True, check=True, timeout=120)
    so.write_bytes(planted.read_bytes())
    if record == "own-sha256":
        so.with_suffix(".sha256").write_text(hashlib.sha256(planted.read_bytes()).hexdigest())
        again = _emulate(cache_dir, state)
    else:  # a record another machine's key verifies (a cache restored from elsewhere): as good as planted here
        sign = "import sys; from topkgen.emulator.object_cache import record; print(record(sys.argv[1], open(sys.argv[2], 'rb').read()))"
        signed = subprocess.run([sys.executable, "-c", sign, so.stem, str(planted)], capture_output=True, text=True,
                                env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "other-state")}, timeout=60)
        assert signed.returncode == 0 and signed.stdout.startswith("hmac-sha256:"), signed.stderr
        so.with_suffix(".sha256").write_text(signed.stdout)
        again = _emulate(cache_dir, state)
    assert again.returncode == 0 and again.stdout == "[0, 2, 4, 6]\n", again.stderr
    assert not marker.exists()
    assert so.read_bytes() == good  # built again in its place
