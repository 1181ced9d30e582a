"""A damaged or hostile cache directory: entries that are symlinks to /dev/zero, FIFOs,
directories or forged records; TOPKGEN_CACHE_DIR naming a file or a directory this user
cannot write; a disk that fills up. Each is one clear message (exit 2) or a recompile that
repairs the entry, never a traceback, a hang, unbounded memory, or a bad entry in a bundle.

Every subprocess runs with a timeout and an address-space limit: before the fix, a symlink
to /dev/zero took 24 GB and a FIFO hung the build."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from topkgen.build import cache
from topkgen.common import files

from ..support.commands import one_line_error, tree
from ..support.hostile import bounded, bounded_topkgen as topkgen
from ..support.tiny import TINY_POLICY

SHARD = ["--arch", "sm_90", "--shard", "1/15"]  # 2 kernels
@pytest.fixture(scope="module")
def warm(tmp_path_factory) -> tuple[Path, Path]:
    """A cache holding the 2 kernels of SHARD, and the bundle built with it (read-only)."""
    base = tmp_path_factory.mktemp("warm")
    proc = topkgen("build", *SHARD, "--out", base / "out", cache_dir=base / "cache")
    assert proc.returncode == 0, proc.stderr
    return base / "cache", base / "out"


@pytest.fixture
def cache_copy(warm, tmp_path) -> Path:
    shutil.copytree(warm[0], tmp_path / "cache", symlinks=True)
    return tmp_path / "cache"


def _entries(bundle: Path) -> tuple[str, str]:
    """The cas path of the bundle's first cubin and the ac path of its record."""
    kernel = json.loads((bundle / "manifest.json").read_text())["kernels"][0]
    return cache.cas_path(kernel["sha256"]), cache.ac_path(kernel["cache_key"])


# ----------------------------------------------------------------------------- entries

def test_read_regular_refuses_what_is_not_a_small_regular_file(tmp_path):
    (tmp_path / "ok").write_bytes(b"12345")
    assert files.read_regular(tmp_path / "ok", 5) == b"12345"
    with pytest.raises(OSError) as big:
        files.read_regular(tmp_path / "ok", 4)
    assert big.value.errno == errno.EFBIG
    (tmp_path / "zero").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    for name, kind in (("zero", "symbolic link"), ("fifo", "FIFO"), ("dir", "directory")):
        with pytest.raises(OSError, match=kind):
            files.read_regular(tmp_path / name, 1 << 20)
    with pytest.raises(FileNotFoundError):
        files.read_regular(tmp_path / "absent", 1)
    os.mkfifo(tmp_path / "lock")
    with pytest.raises(OSError, match="FIFO"):  # a lock opened without blocking: no reader needed, no hang
        files.open_lock(tmp_path / "lock")
    os.close(files.open_lock(tmp_path / "new.lock"))


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "directory", "oversized"])
@pytest.mark.parametrize("which", ["cubin", "record"])
def test_an_entry_that_is_not_a_regular_file_is_compiled_again_and_repaired(warm, cache_copy, tmp_path, kind, which):
    bundle = warm[1]
    cas_rel, ac_rel = _entries(bundle)
    entry = cache_copy / cache.LOCAL_DIR / (cas_rel if which == "cubin" else ac_rel)
    good = entry.read_bytes()
    entry.unlink()
    if kind == "dev-zero":
        entry.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(entry)
    elif kind == "directory":
        entry.mkdir()
    else:  # a sparse file far larger than any entry: refused by its size, never read
        with open(entry, "wb") as f:
            f.truncate(cache.ENTRY_LIMITS[entry.parent.name] + 1)
    proc = topkgen("build", *SHARD, "--out", tmp_path / "out", cache_dir=cache_copy, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "cache: 1 local hits, 0 remote hits, 1 compiled;" in proc.stdout
    assert tree(tmp_path / "out") == tree(bundle)
    assert not entry.is_symlink() and entry.is_file() and entry.read_bytes() == good  # repaired


def test_verify_and_import_report_an_entry_that_is_not_a_regular_file(warm, cache_copy, tmp_path):
    cas_rel, _ = _entries(warm[1])
    entry = cache_copy / cache.LOCAL_DIR / cas_rel
    entry.unlink()
    entry.symlink_to("/dev/zero")
    proc = topkgen("cache", "verify", "--sample", "100", cache_dir=cache_copy, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "1 identical, 1 wrong" in proc.stdout and "its cubin is missing or fails its sha256" in proc.stdout
    entry.unlink()
    os.mkfifo(entry)
    proc = topkgen("cache", "verify", "--sample", "100", cache_dir=cache_copy, timeout=60)
    assert proc.returncode == 1 and "1 identical, 1 wrong" in proc.stdout, proc.stderr


FORGED = {
    "symbol": lambda r: r.update(symbol="evil"),                        # would be the bundle's symbol
    "string count": lambda r: r["resources"].update(registers="87"),    # crashed the budget check
    "negative count": lambda r: r["resources"].update(registers=-5),    # crashed the manifest's schema
    "digest path": lambda r: r.update(cubin_sha256="../" * 12 + "dev/zero"),
}


@pytest.mark.parametrize("forge", FORGED, ids=list(FORGED))
def test_a_forged_action_record_never_reaches_the_bundle(warm, cache_copy, tmp_path, forge):
    bundle = warm[1]
    _, ac_rel = _entries(bundle)
    entry = cache_copy / cache.LOCAL_DIR / ac_rel
    good = entry.read_bytes()
    record = json.loads(good)
    FORGED[forge](record)
    entry.write_bytes(cache.record_bytes(record))
    proc = topkgen("build", *SHARD, "--out", tmp_path / "out", cache_dir=cache_copy, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "cache: 1 local hits, 0 remote hits, 1 compiled;" in proc.stdout
    assert tree(tmp_path / "out") == tree(bundle)
    assert entry.read_bytes() == good  # repaired


def _misdirect(store: Path, bundle: Path, how: str) -> tuple[Path, bytes]:
    """Forge the record of the bundle's first kernel in the ac/cas directory `store` so that
    only a loader's checks of its cubin can tell: `other-kernel` names the second kernel's
    cubin (present and intact, sha256 and size fixed up), `other-arch` claims sm_100.
    Returns the record's path and its good bytes."""
    first, second = json.loads((bundle / "manifest.json").read_text())["kernels"][:2]
    entry = store / cache.ac_path(first["cache_key"])
    good = entry.read_bytes()
    record = json.loads(good)
    if how == "other-kernel":
        record.update(cubin_sha256=second["sha256"], cubin_size=second["size_bytes"])
    else:
        record.update(arch="sm_100")
    entry.write_bytes(cache.record_bytes(record))
    return entry, good


MISDIRECTED = ["other-kernel", "other-arch"]


@pytest.mark.parametrize("how", MISDIRECTED)
def test_a_record_naming_another_kernels_cubin_or_arch_is_compiled_again_and_repaired(warm, cache_copy, tmp_path,
                                                                                       how):
    """Served, it made a bundle the loaders refuse ("defines no function"); a wrong arch was
    compiled again on every build and never repaired."""
    entry, good = _misdirect(cache_copy / cache.LOCAL_DIR, warm[1], how)
    proc = topkgen("build", *SHARD, "--out", tmp_path / "out", cache_dir=cache_copy, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "cache: 1 local hits, 0 remote hits, 1 compiled;" in proc.stdout
    assert tree(tmp_path / "out") == tree(warm[1])
    assert entry.read_bytes() == good  # repaired
    again = topkgen("build", *SHARD, "--out", tmp_path / "out", cache_dir=cache_copy, timeout=60)
    assert "cache: 2 local hits, 0 remote hits, 0 compiled;" in again.stdout


@pytest.mark.parametrize("how", MISDIRECTED)
def test_a_remote_record_naming_another_kernels_cubin_or_arch_is_rejected_and_never_copied(warm, tmp_path, how):
    """The shared tier is not repaired (another job may be reading it): its entry is counted
    as rejected, the kernel compiled here, and only the good entry reaches the local tier."""
    remote = tmp_path / "remote"
    shutil.copytree(warm[0] / cache.LOCAL_DIR, remote)
    entry, good = _misdirect(remote, warm[1], how)
    forged = entry.read_bytes()
    env = {"TOPKGEN_CACHE_URL": f"file://{remote}"}
    proc = topkgen("build", *SHARD, "--out", tmp_path / "out", cache_dir=tmp_path / "job", env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "cache: 0 local hits, 1 remote hits, 1 compiled;" in proc.stdout
    assert "1 of the remote's entries failed verification" in proc.stderr
    assert tree(tmp_path / "out") == tree(warm[1])
    assert (tmp_path / "job" / cache.LOCAL_DIR / entry.relative_to(remote)).read_bytes() == good
    assert entry.read_bytes() == forged  # left as it was
    again = topkgen("build", *SHARD, "--out", tmp_path / "out", cache_dir=tmp_path / "job", env=env, timeout=60)
    assert "cache: 2 local hits, 0 remote hits, 0 compiled;" in again.stdout


def test_the_bundle_writer_refuses_a_cubin_a_loader_would_refuse(warm, tmp_path):
    """Defence in depth behind the cache's checks: whatever served the cubins, a bundle the
    loaders refuse is never written."""
    from topkgen.build import bundle

    manifest = json.loads((warm[1] / "manifest.json").read_text())
    files = {e["cubin"]: (warm[1] / e["cubin"]).read_bytes() for e in manifest["kernels"]}
    first, second = manifest["kernels"][:2]
    files[first["cubin"]] = files[second["cubin"]]  # another kernel's cubin, its sha256 fixed up
    first["sha256"], first["size_bytes"] = second["sha256"], second["size_bytes"]
    with pytest.raises(bundle.BuildError, match=rf"kernels\[0\]\.symbol: {first['cubin']} defines no function "
                                                rf"'{first['symbol']}'"):
        bundle.write_bundle(tmp_path / "out", manifest, files)
    assert not (tmp_path / "out").exists()


def test_a_record_of_nested_brackets_is_corrupt_not_a_crash():
    assert cache.parse_record(b"[" * 200_000, "k") is None


# ----------------------------------------------------------------------------- the directory

def test_a_cache_dir_that_is_a_file_is_one_message_for_build_verify_and_import(warm, tmp_path):
    (tmp_path / "file").write_text("not a directory")
    message = (f"TOPKGEN_CACHE_DIR={tmp_path / 'file'}: cannot use the compile cache: {tmp_path / 'file'} "
               f"is not a directory; set TOPKGEN_CACHE_DIR to a writable directory")
    for args in (["build", *SHARD, "--out", tmp_path / "out"], ["cache", "verify", "--sample", "50"],
                 ["cache", "import", warm[1]]):
        one_line_error(topkgen(*args, cache_dir=tmp_path / "file", timeout=60), message)
    assert not (tmp_path / "out").exists()


def _without_dac_override() -> tuple[str, ...]:
    """A command prefix that makes permission bits count (root ignores them)."""
    if os.geteuid() != 0:
        return ()
    if shutil.which("setpriv") is None:
        pytest.skip("root without setpriv: permission bits cannot be made to count")
    return ("setpriv", "--bounding-set=-dac_override,-dac_read_search")


def test_a_cache_dir_this_user_cannot_write_is_one_message(warm, cache_copy, tmp_path):
    prefix = _without_dac_override()
    store = cache_copy / cache.LOCAL_DIR
    store.chmod(0)
    try:
        message = (f"TOPKGEN_CACHE_DIR={cache_copy}: cannot use the compile cache: {store}: Permission denied; "
                   f"set TOPKGEN_CACHE_DIR to a writable directory")
        for args in (["build", *SHARD, "--out", tmp_path / "out"], ["cache", "verify", "--sample", "50"],
                     ["cache", "import", warm[1]]):
            one_line_error(topkgen(*args, cache_dir=cache_copy, prefix=prefix, timeout=60), message)
    finally:
        store.chmod(0o755)
    assert not (tmp_path / "out").exists()


def _read_only_mount(directory: Path) -> tuple[str, ...]:
    """A command prefix that runs the command with `directory` bind-mounted read-only over
    itself, in a mount namespace of its own (EROFS, as on a read-only volume)."""
    prefix = ("unshare", "-m", "sh", "-c", 'mount --bind -o ro "$0" "$0" && exec "$@"', str(directory))
    if shutil.which("unshare") is None or subprocess.run([*prefix, "true"], capture_output=True).returncode:
        pytest.skip("no mount namespace or bind mount here: a read-only mount cannot be made")
    return prefix


@pytest.mark.parametrize("how", ["permission-bits", "read-only-mount"])
def test_a_cache_this_user_can_only_read_still_serves_build_merge_and_import(tiny_bundle_for_run, tmp_path, how):
    """A read-only cache (a shared copy, a read-only mount: every folder) is no
    error: verify reads it; a build and a merge of what it holds compile nothing, write
    nothing there and take their lock in a private temporary directory (they failed at the
    very end, unable to create a lock there); an import of what it holds has nothing to write."""
    bundle, policy = tiny_bundle_for_run[0], tiny_bundle_for_run[0].parent / "tiny.yaml"
    cache_dir = tmp_path / "cache"
    shutil.copytree(bundle.parent / "cache", cache_dir, symlinks=True)
    for i in (1, 2):
        part = topkgen("build", "--policy", policy, "--shard", f"{i}/2", "--out", tmp_path / f"s{i}",
                       cache_dir=cache_dir)
        assert part.returncode == 0, part.stderr
    folders = [cache_dir, *(p for p in cache_dir.rglob("*") if p.is_dir())] if how == "permission-bits" else []
    prefix = _without_dac_override() if how == "permission-bits" else _read_only_mount(cache_dir)
    before = tree(cache_dir)
    for folder in folders:
        folder.chmod(0o555)
    env = {"TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir()
    kernels = len(json.loads((bundle / "manifest.json").read_text())["kernels"])
    try:
        verify = topkgen("cache", "verify", "--sample", "50", cache_dir=cache_dir, prefix=prefix, timeout=120)
        assert verify.returncode == 0, verify.stderr
        built = topkgen("build", "--policy", policy, "--out", tmp_path / "out", cache_dir=cache_dir, prefix=prefix,
                        env=env, timeout=120)
        assert built.returncode == 0, built.stderr
        assert f"{kernels} local hits, 0 remote hits, 0 compiled" in built.stdout
        assert tree(tmp_path / "out") == tree(bundle)
        merged = topkgen("merge", tmp_path / "s1", tmp_path / "s2", "--out", tmp_path / "merged", cache_dir=cache_dir,
                         prefix=prefix, env=env, timeout=120)
        assert merged.returncode == 0, merged.stderr
        assert tree(tmp_path / "merged") == tree(bundle)
        imported = topkgen("cache", "import", bundle, cache_dir=cache_dir, prefix=prefix, env=env, timeout=120)
        assert imported.returncode == 0, imported.stderr
        assert f"0 entries added, {kernels} already present" in imported.stdout
    finally:
        for folder in folders:
            folder.chmod(0o755)
    assert tree(cache_dir) == before
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_lock_file_another_user_made_is_shared_for_reading(cache_copy, tmp_path):
    """A lock file beside --out that this user cannot write (another user's, left by a
    SIGKILLed build and made with umask 022) is opened for reading, which flock allows: both
    users still serialise on it. It is empty, so it is removed on the way out."""
    prefix = _without_dac_override()
    out = tmp_path / "out"
    lock = tmp_path / ".out.lock"
    lock.write_bytes(b"")
    lock.chmod(0o444)
    proc = topkgen("build", *SHARD, "--out", out, cache_dir=cache_copy, prefix=prefix, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "out"]


# ----------------------------------------------------------------------------- a full disk

@pytest.fixture
def full_disk(monkeypatch, tmp_path):
    """Writes under tmp_path/cache fail as on a full disk (at fsync, as NFS reports it);
    other files (the bundle) are written."""
    real_fsync = os.fsync
    full = str(tmp_path / "cache")

    def fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(full):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setenv("TOPKGEN_CACHE_DIR", full)
    monkeypatch.delenv("TOPKGEN_CACHE_URL", raising=False)
    return Path(full)


def test_a_full_disk_during_a_build_is_a_warning_and_a_complete_bundle(cli, warm, full_disk, tmp_path):
    result = cli("build", *SHARD, "--out", tmp_path / "out")
    assert result.exit_code == 0, result.stderr
    assert "cache: 0 local hits, 0 remote hits, 2 compiled;" in result.stdout
    assert result.stderr.startswith("topkgen: warning: the compile cache could not be written, so kernels "
                                    "compiled now are not cached: ")
    assert "No space left on device" in result.stderr and result.stderr.count("\n") == 1
    assert tree(tmp_path / "out") == tree(warm[1])
    assert not [p for p in full_disk.rglob("*") if p.is_file() and p.parent.name in ("ac", "cas")]


def test_a_full_disk_during_cache_import_is_one_message(cli, full_disk, tiny_bundle_for_run):
    result = cli("cache", "import", tiny_bundle_for_run[0])  # import takes whole bundles, not shards
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith(f"topkgen: error: TOPKGEN_CACHE_DIR={full_disk}: cannot use the compile cache: "
                                    f"{full_disk / cache.LOCAL_DIR / 'cas'}/")
    assert result.stderr.rstrip().endswith("No space left on device; set TOPKGEN_CACHE_DIR to a writable directory")


# ----------------------------------------------------------------------------- a remote import cannot write

@pytest.mark.parametrize("remote", ["regular-file", "read-only-mount"])
def test_cache_import_into_a_remote_it_cannot_write_fails_once_the_local_cache_is_filled(tiny_bundle_for_run,
                                                                                          tmp_path, remote):
    """Filling the stores is import's whole job: it said "imported ... into the local cache
    and file:///x (0 B written)", exit 0, when x was a file or a read-only directory."""
    bundle = tiny_bundle_for_run[0]
    kernels = len(json.loads((bundle / "manifest.json").read_text())["kernels"])
    target = tmp_path / "remote"
    if remote == "regular-file":
        target.write_text("not a directory")
        prefix, reason = (), "Not a directory"
    else:
        target.mkdir()
        prefix, reason = _read_only_mount(target), "Read-only file system"
    proc = topkgen("cache", "import", bundle, cache_dir=tmp_path / "cache", prefix=prefix,
                   env={"TOPKGEN_CACHE_URL": f"file://{target}"}, timeout=120)
    one_line_error(proc, f"TOPKGEN_CACHE_URL=file://{target}: cannot write this store: ", reason,
                   f"; the local cache was filled all the same ({kernels} entries added, 0 already present)")
    assert proc.stdout == ""
    assert len(list((tmp_path / "cache" / cache.LOCAL_DIR / "ac").iterdir())) == kernels


def test_a_cache_dir_under_a_quoted_tilde_is_in_the_home_directory(tiny_bundle_for_run, tmp_path):
    """TOPKGEN_CACHE_DIR="~/cache" (quoted: the shell leaves the ~) made a folder named `~`
    in the current directory; it is the home directory's, as the default ~/.cache is."""
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    proc = topkgen("cache", "import", tiny_bundle_for_run[0], cache_dir=Path("~/cache"),
                   prefix=("env", "-C", str(work)), env={"HOME": str(home)})
    assert proc.returncode == 0, proc.stderr
    assert list(work.iterdir()) == [] and (home / "cache" / cache.LOCAL_DIR / "ac").is_dir()


def test_a_cache_dir_under_the_tilde_of_no_user_is_named(tiny_bundle_for_run, tmp_path):
    """TOPKGEN_CACHE_DIR="~nosuchuser/cache" (a user of another machine) was an internal
    error (exit 70: "RuntimeError: Could not determine home directory."); it is refused
    naming the variable, and the commands that never use the cache still run."""
    work = tmp_path / "work"
    work.mkdir()
    setting = "~topkgen_no_such_user/cache"
    for command in (("cache", "import", str(tiny_bundle_for_run[0])), ("build", "--arch", "sm_90", "--out", "b")):
        proc = topkgen(*command, cache_dir=Path(setting), prefix=("env", "-C", str(work)))
        one_line_error(proc, f"TOPKGEN_CACHE_DIR={setting}: cannot use the compile cache: {setting}: "
                             f"~topkgen_no_such_user is no user's home directory here; set TOPKGEN_CACHE_DIR")
    assert list(work.iterdir()) == []
    assert topkgen("plan", cache_dir=Path(setting), prefix=("env", "-C", str(work))).returncode == 0


def test_a_file_url_without_an_absolute_path_is_refused(tiny_bundle_for_run, tmp_path):
    """`file://` wrote the shared cache's ac/ and cas/ into the current directory, and
    `file://relative` or `file://localhost/x` into ./relative, ./localhost/x: a file:// URL
    names an absolute path (three slashes), else exit 2 naming the variable, nothing written."""
    work = tmp_path / "work"
    work.mkdir()
    for url in ("file://", "file://relative", "file://localhost/shared", "local://x"):
        proc = topkgen("cache", "import", tiny_bundle_for_run[0], cache_dir=tmp_path / "cache",
                       prefix=("env", "-C", str(work)), env={"TOPKGEN_CACHE_URL": url})
        scheme = url.split("://")[0]
        one_line_error(proc, f"TOPKGEN_CACHE_URL={url}: a {scheme}:// URL names an absolute path, with three "
                             f"slashes: {scheme}:///shared/dir")
        assert proc.stdout == ""
    assert list(work.iterdir()) == []


# ----------------------------------------------------------------------------- the emulator's cache

EMULATED = """
extern "C" __global__ void twice(int* out) { out[threadIdx.x] = 2 * threadIdx.x; }
"""
EMULATE = """
import sys
from topkgen.emulator import compile_source
compile_source(sys.argv[1], name="twice")
print("ok")
"""


def _emulate(cache_dir: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TOPKGEN_CACHE_DIR": str(cache_dir)}
    return subprocess.run([sys.executable, "-c", EMULATE, EMULATED], capture_output=True, text=True, env=env,
                          timeout=120, preexec_fn=bounded)


@pytest.mark.parametrize("kind", ["dev-zero", "fifo"])
def test_an_emulator_cache_entry_that_is_not_a_regular_file_is_compiled_again(tmp_path, kind):
    first = _emulate(tmp_path / "cache")
    assert first.returncode == 0, first.stderr
    so = next((tmp_path / "cache" / "emulator").glob("*.so"))
    record = so.with_suffix(".sha256")
    good = so.read_bytes(), record.read_bytes()
    so.unlink()
    record.unlink()
    if kind == "dev-zero":
        so.symlink_to("/dev/zero")
        record.symlink_to("/dev/zero")
    else:
        os.mkfifo(so)
        os.mkfifo(record)
    again = _emulate(tmp_path / "cache")
    assert again.returncode == 0 and again.stdout == "ok\n", again.stderr
    assert (so.read_bytes(), record.read_bytes()) == good and not so.is_symlink()


def test_an_emulator_cache_dir_that_is_a_file_is_one_message(tmp_path, tiny_bundle_for_run):
    (tmp_path / "file").write_text("x")
    proc = topkgen("run", "--bundle", tiny_bundle_for_run[0], "--backend", "emulator", "--arch", "sm_90",
                   "--k", "8", tiny_bundle_for_run[1], cache_dir=tmp_path / "file", timeout=60)
    one_line_error(proc, f"TOPKGEN_CACHE_DIR={tmp_path / 'file'}: cannot use the emulator cache: "
                         f"{tmp_path / 'file'} is not a directory")


@pytest.fixture(scope="module")
def tiny_bundle_for_run(tmp_path_factory) -> tuple[Path, Path]:
    """A whole (unsharded) bundle `run` accepts, and an input for it."""
    import numpy as np


    base = tmp_path_factory.mktemp("run")
    (base / "tiny.yaml").write_text(TINY_POLICY)
    proc = topkgen("build", "--policy", base / "tiny.yaml", "--out", base / "out", cache_dir=base / "cache")
    assert proc.returncode == 0, proc.stderr
    np.save(base / "x.npy", np.arange(200, dtype=np.float32).reshape(2, 100))
    return base / "out", base / "x.npy"


# ----------------------------------------------------------------------------- verify compiles only what topkgen renders

def test_every_rendered_kernel_includes_only_the_allowed_headers(default_policy, legacy_policy):
    from topkgen.build import cache_admin
    from topkgen.policy import jit_plan, plan
    from topkgen.build.render import render

    for policy in (default_policy, legacy_policy):
        for arch in policy.archs:
            for spec in [*plan(policy, arch), *jit_plan(policy, arch)]:
                assert cache_admin.foreign_include(render(spec)) is None, spec.name


@pytest.mark.parametrize("trick", [
    '#include "/tmp/x"', '/**/ #include "/tmp/x"', '#inc\\\nlude "/tmp/x"', '%:include "/tmp/x"',
    '#include_next <cuda_fp16.h>', '#if __has_include("/tmp/x")\n#endif', '#define H "/tmp/x"\n#include H',
    '#include <cuda_fp16.h> // and "/tmp/x"',
])
def test_a_source_that_could_open_another_file_is_caught(trick):
    from topkgen.build import cache_admin

    assert cache_admin.foreign_include(f"#include <cuda_fp16.h>\n{trick}\nextern \"C\" void k() {{}}\n")


def test_verify_never_compiles_a_cached_source_that_includes_another_file(tmp_path):
    """NVRTC blocks opening a FIFO: a poisoned entry (a shared remote's, say) hung verify."""
    from topkgen.build.compile import cache_key, toolchain

    os.mkfifo(tmp_path / "fifo.h")
    name, arch = "topk_poisoned", "sm_90"
    source = f'#include "{tmp_path / "fifo.h"}"\nextern "C" __global__ void {name}() {{}}\n'.encode()
    cubin = b"anything: verify compiles before it compares"
    record = {"key": cache_key(source.decode(), name, arch), "name": name, "arch": arch, "symbol": name,
              "resources": {}, "cubin_sha256": cache.sha256(cubin), "cubin_size": len(cubin),
              "source_sha256": cache.sha256(source), "toolchain": toolchain()}
    store = cache.LocalStore(tmp_path / "cache" / cache.LOCAL_DIR)
    for rel, data in ((cache.cas_path(record["cubin_sha256"]), cubin),
                      (cache.cas_path(record["source_sha256"]), source),
                      (cache.ac_path(record["key"]), cache.record_bytes(record))):
        assert store.create(rel, data)
    proc = topkgen("cache", "verify", "--sample", "100", cache_dir=tmp_path / "cache", timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "0 identical, 1 wrong" in proc.stdout
    assert f"{name} (sm_90): its source includes what no topkgen kernel does: '#include \"{tmp_path}" in proc.stdout


def test_a_lock_that_is_not_a_regular_file_is_one_message_not_a_hang(cache_copy, tmp_path):
    """build serialises writers of one --out with a lock file beside it; a FIFO planted there
    would block open() for ever."""
    out = tmp_path / "out"
    os.mkfifo(tmp_path / ".out.lock")
    proc = topkgen("build", *SHARD, "--out", out, cache_dir=cache_copy, timeout=60)
    one_line_error(proc, f"--out {out}: cannot lock {tmp_path / '.out.lock'}", "not a regular file but a FIFO")
    assert not out.exists()
