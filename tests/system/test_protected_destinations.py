"""Directories `build --out` and `merge --out` never replace, --force or not: the command's
own inputs, the compile caches (local, and a file:// shared one), the home directory, a git
repository, a file system's root (and, for --force, a top-level directory or a tree holding a
repository). A hostile-user trial wiped each of them with --force; merge wrote over one of its
own parts without it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from topkgen.common.destinations import DestinationError, check_bundle_destination

from ..support.commands import TOPKGEN, one_line_error, tree

NEVER = "the --out directory is replaced as a whole, --force or not"


@pytest.fixture(scope="module")
def tiny_shards(tmp_path_factory, tiny_policy) -> Path:  # noqa: F811
    """The tiny policy's two shards, parts/s1 and parts/s2 (read-only: copy before writing)."""
    parts = tmp_path_factory.mktemp("shards") / "parts"
    for i in (1, 2):
        proc = subprocess.run([*TOPKGEN, "build", "--policy", str(tiny_policy), "--shard", f"{i}/2",
                               "--out", str(parts / f"s{i}")], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    return parts


def _precious(directory: Path) -> dict[str, str]:
    """A directory of the user's, with something in it that must survive."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "precious.txt").write_text("mine\n")
    return tree(directory)


# ----------------------------------------------------------------------------- merge

def test_merge_never_writes_over_its_own_parts(cli, tmp_path, tiny_shards, monkeypatch):
    parts = tmp_path / "parts"
    shutil.copytree(tiny_shards, parts)
    before = tree(parts)
    monkeypatch.chdir(tmp_path)
    for out, relation, force in (("parts/s1", "is the input parts/s1", ()),
                                 ("parts/s1", "is the input parts/s1", ("--force",)),
                                 ("parts/s1/sub", "lies inside the input parts/s1", ("--force",)),
                                 ("parts", "holds the input parts/s1", ("--force",))):
        result = cli("merge", "parts/s1", "parts/s2", "--out", out, *force)
        one_line_error(result, f"--out {out}: {relation}; {NEVER}")
    assert tree(parts) == before  # s1 was replaced by the merged bundle (exit 0)


def test_merge_force_replaces_a_directory_that_is_not_a_bundle(cli, tmp_path, tiny_shards):
    target = tmp_path / "target"
    _precious(target)
    result = cli("merge", tiny_shards / "s1", tiny_shards / "s2", "--out", target)
    one_line_error(result, "is not a topkgen bundle (no manifest.json, and it holds precious.txt); "
                            "pass --force to replace it")
    assert (target / "precious.txt").exists()
    result = cli("merge", tiny_shards / "s1", tiny_shards / "s2", "--out", target, "--force")  # was: no such option
    assert result.exit_code == 0, result.stderr
    assert sorted(tree(target)) == [  # the large-k path (k above K 1024) ships as JIT sources
        "jit/sm_90/topk_radix_large_det_f32_sm_90.cu", "jit/sm_90/topk_radix_large_fast_f32_sm_90.cu",
        "manifest.json", "sm_90/topk_radix_dyn_k1024_det_f32_sm_90.cubin",
        "sm_90/topk_radix_dyn_k64_det_f32_sm_90.cubin"]


# ----------------------------------------------------------------------------- build --force

def _home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "users" / "me"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id").write_text("key\n")
    monkeypatch.setenv("HOME", str(home))
    return home


def _clone(tmp_path, _monkeypatch) -> Path:
    repo = tmp_path / "clone"
    (repo / ".git").mkdir(parents=True)
    (repo / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    return repo


def _cache(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "store" / "cache"
    _precious(cache)
    monkeypatch.setenv("TOPKGEN_CACHE_DIR", str(cache))
    return cache


def _shared_cache(tmp_path, monkeypatch) -> Path:
    shared = tmp_path / "mnt" / "shared"
    _precious(shared)
    monkeypatch.setenv("TOPKGEN_CACHE_URL", f"file://{shared}")
    return shared


# (what to set up, the --out it gives relative to tmp_path, the reason in the refusal)
PROTECTED = {
    "home": (_home, "users/me", "is the home directory {tmp}/users/me"),
    "holds the home": (_home, "users", "holds the home directory {tmp}/users/me"),
    "git clone": (_clone, "clone", "is a git repository (it holds .git)"),
    "cache": (_cache, "store/cache", "is the compile cache {tmp}/store/cache (TOPKGEN_CACHE_DIR)"),
    "in the cache": (_cache, "store/cache/sub", "lies inside the compile cache {tmp}/store/cache (TOPKGEN_CACHE_DIR)"),
    "holds the cache": (_cache, "store", "holds the compile cache {tmp}/store/cache (TOPKGEN_CACHE_DIR)"),
    "shared cache": (_shared_cache, "mnt/shared", "is the shared compile cache {tmp}/mnt/shared (TOPKGEN_CACHE_URL)"),
    "holds the shared cache": (_shared_cache, "mnt", "holds the shared compile cache {tmp}/mnt/shared "
                                                     "(TOPKGEN_CACHE_URL)"),
}


@pytest.mark.parametrize("case", sorted(PROTECTED))
def test_force_never_replaces_a_protected_directory(cli, tmp_path, tiny_policy, monkeypatch, case):  # noqa: F811
    setup, out, reason = PROTECTED[case]
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # not the current directory: that refusal would come first
    setup(tmp_path, monkeypatch)
    before = tree(tmp_path)
    target = (tmp_path / out).resolve()
    result = cli("build", "--policy", tiny_policy, "--out", target, "--force")
    one_line_error(result, f"--out {target}: {reason.format(tmp=tmp_path)}; {NEVER}")
    assert tree(tmp_path) == before


def test_force_never_replaces_the_policy_it_builds(cli, tmp_path, tiny_policy, monkeypatch):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pol").mkdir()
    (tmp_path / "pol" / "topk.yaml").write_bytes(tiny_policy.read_bytes())
    result = cli("build", "--policy", "pol/topk.yaml", "--out", "pol", "--force")
    one_line_error(result, f"--out pol: holds the input pol/topk.yaml; {NEVER}")
    assert (tmp_path / "pol" / "topk.yaml").read_bytes() == tiny_policy.read_bytes()


def test_force_never_replaces_a_tree_holding_a_repository(cli, tmp_path, tiny_policy, monkeypatch):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    (tmp_path / "src" / "project" / ".git").mkdir(parents=True)
    (tmp_path / "src" / "notes.txt").write_text("mine\n")
    before = tree(tmp_path / "src")
    result = cli("build", "--policy", tiny_policy, "--out", "src", "--force")
    one_line_error(result, "--out src: holds a git repository (project/.git); --force replaces the whole directory")
    assert tree(tmp_path / "src") == before


def test_force_never_replaces_a_top_level_directory():
    """Only checked, never built into: a broken check must not cost the machine its /usr."""
    candidates = [Path(p) for p in ("/usr", "/etc", "/var") if Path(p).is_dir() and any(Path(p).iterdir())]
    if not candidates:
        pytest.skip("no top-level directory with files here")
    for top in candidates:
        with pytest.raises(DestinationError, match=f"--out {top}: is (a top-level directory of the file system|"
                                                   f"the root of a file system)"):
            check_bundle_destination(top, force=True)


def test_force_still_replaces_a_bundle_or_a_plain_directory(cli, tmp_path, tiny_policy, monkeypatch):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    _precious(tmp_path / "plain")
    for out in ("plain", "plain"):  # a directory of the user's (asked for), then the bundle now there
        result = cli("build", "--policy", tiny_policy, "--out", out, "--force")
        assert result.exit_code == 0, result.stderr
        assert not (tmp_path / out / "precious.txt").exists()


# ----------------------------------------------------------------------------- a full disk

def _with_file_size_limit(limit: int):
    """A real write failure, as a full disk gives one: the kernel refuses (EFBIG) every write
    past `limit` bytes of one file (Python ignores SIGXFSZ, so the write raises)."""
    import resource

    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


@pytest.mark.parametrize("command", ["merge", "build"])
def test_a_write_that_fails_leaves_the_destination_as_it_was(tmp_path, tiny_shards, tiny_policy, command):  # noqa: F811
    """merge: one line, exit 2; build: a failed build, exit 1. Either way the old bundle is
    untouched and nothing half-written (a temporary directory) is left beside it."""
    args = {"merge": ["merge", str(tiny_shards / "s1"), str(tiny_shards / "s2")],
            "build": ["build", "--policy", str(tiny_policy)]}[command]
    work = tmp_path / "work"
    shutil.copytree(tiny_shards / "s1", work / "out")  # a bundle the command may replace
    before = tree(work)
    proc = subprocess.run([*TOPKGEN, *args, "--out", "out"], cwd=work, capture_output=True, text=True,
                          preexec_fn=_with_file_size_limit(4096))
    assert proc.stdout == "" or command == "build"  # build's progress lines are on stdout
    expected = {"merge": "topkgen: error: cannot write the bundle out: File too large\n",
                "build": "topkgen: error: build: out left as it was: cannot write the bundle out: File too large\n"}[command]
    assert (proc.returncode, proc.stderr) == (2, expected)  # a full disk or a file size limit: exit 2 (issue 33)
    assert tree(work) == before and sorted(p.name for p in work.iterdir()) == ["out"]


# ----------------------------------------------------------------------------- symbolic-link loops

def test_a_symbolic_link_loop_on_the_way_is_one_message_not_an_internal_error(cli, tmp_path, tiny_shards,
                                                                               tiny_policy, monkeypatch):  # noqa: F811
    """Python 3.11's Path.resolve raises RuntimeError on a loop, which reached the user as an
    internal error (exit 70) from build --out, merge --out, a merge part and TOPKGEN_CACHE_DIR."""
    monkeypatch.chdir(tmp_path)
    Path("loop").symlink_to("loop")
    parts = [str(tiny_shards / "s1"), str(tiny_shards / "s2")]
    loop_error = "Too many levels of symbolic links"
    for args, fragment in ((["build", "--policy", tiny_policy, "--out", "loop/out"], "--out loop/out: "),
                           (["build", "--policy", tiny_policy, "--out", "loop/a/b", "--force"], "--out loop/a/b: "),
                           (["merge", *parts, "--out", "loop/out"], "--out loop/out: "),
                           (["merge", "loop/part", "--out", "merged"], "loop/part: cannot read manifest: ")):
        one_line_error(cli(*args), fragment + loop_error)
    monkeypatch.setenv("TOPKGEN_CACHE_DIR", str(tmp_path / "loop" / "cache"))
    one_line_error(cli("build", "--policy", tiny_policy, "--out", "out"),
                    f"TOPKGEN_CACHE_DIR={tmp_path}/loop/cache: cannot use the compile cache: ", loop_error)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loop"]
