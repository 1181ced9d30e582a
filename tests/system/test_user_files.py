"""The user's files and the commands that touch them (issue 11, points 1, 5 and 6):
`build --out` never replaces what is not a bundle unless asked and checks the destination
before compiling; locks litter nothing; manifests and .npy inputs that are broken or
hostile get one clear error; `run -o` is checked like `--out`; anything unexpected exits 70
with one line."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from ..conftest import ROOT
from ..support.commands import TOPKGEN, one_line_error, tree
from ..support.tiny import each_command
from ..support.topk_cases import check_topk, make_rows

# ----------------------------------------------------------------------------- build --out

def test_build_never_replaces_a_directory_that_is_not_a_bundle(cli, tmp_path, tiny_policy, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "victim" / "src").mkdir(parents=True)
    (tmp_path / "victim" / "src" / "important.txt").write_text("precious\n")
    result = cli("build", "--policy", tiny_policy, "--out", "victim")
    one_line_error(result, "--out victim: exists, is not empty and is not a topkgen bundle (no manifest.json, "
                            "and it holds src); pass --force to replace it")
    assert (tmp_path / "victim" / "src" / "important.txt").read_text() == "precious\n"
    # A bundle with something of the user's inside is not a bundle either.
    assert cli("build", "--policy", tiny_policy, "--out", "bundle").exit_code == 0
    (tmp_path / "bundle" / "sm_90" / "notes.txt").write_text("mine\n")
    one_line_error(cli("build", "--policy", tiny_policy, "--out", "bundle"), "it holds sm_90/notes.txt")
    assert (tmp_path / "bundle" / "sm_90" / "notes.txt").exists()
    # --force is the user asking for it.
    result = cli("build", "--policy", tiny_policy, "--out", "victim", "--force")
    assert result.exit_code == 0, result.stderr
    assert sorted(tree(tmp_path / "victim")) == [  # the large-k path (k above K 1024) ships as JIT sources
        "jit/sm_90/topk_radix_large_det_f32_sm_90.cu", "jit/sm_90/topk_radix_large_fast_f32_sm_90.cu",
        "manifest.json", "sm_90/topk_radix_dyn_k1024_det_f32_sm_90.cubin",
        "sm_90/topk_radix_dyn_k64_det_f32_sm_90.cubin"]


def test_a_policy_whose_file_name_is_not_utf8_builds_a_bundle_that_loads(cli, tmp_path, tiny_policy, monkeypatch):
    """The manifest named the policy by its file name, lone surrogate and all, and every loader
    (rightly) refused that manifest: a bundle nothing could read. The label is escaped now."""
    monkeypatch.chdir(tmp_path)
    for raw, label in ((b"tiny\xff.yaml", "tiny\\udcff.yaml"), ("tiny\u202e.yaml".encode(), "tiny\\u202e.yaml")):
        policy = tmp_path / os.fsdecode(raw)
        policy.write_bytes(tiny_policy.read_bytes())
        assert cli("build", "--policy", policy, "--out", "bundle", "--force").exit_code == 0
        assert json.loads((tmp_path / "bundle" / "manifest.json").read_text())["policy"]["path"] == label
        result = cli("show", "bundle")
        assert result.exit_code == 0, result.stderr


def test_build_refuses_the_current_directory_and_its_parents(cli, tmp_path, tiny_policy, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("TOPKGEN_CACHE_DIR", str(tmp_path / "cache"))
    for out in (".", "..", str(tmp_path), "/"):
        result = cli("build", "--policy", tiny_policy, "--out", out)
        one_line_error(result, f"--out {out}: is the current directory or one of its parents")
    # Nothing compiled, nothing left behind (it used to leave a `..lock` file).
    assert not (tmp_path / "cache").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"] and not any(work.iterdir())


def test_an_unwritable_destination_is_refused_before_compiling(cli, tmp_path, tiny_policy, monkeypatch):
    monkeypatch.setenv("TOPKGEN_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "file").write_text("x")
    one_line_error(cli("build", "--policy", tiny_policy, "--out", tmp_path / "file" / "out"),
                    f"{tmp_path / 'file'} is not a directory")
    if os.geteuid() != 0:  # root writes anywhere; a read-only mount would be needed
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        one_line_error(cli("build", "--policy", tiny_policy, "--out", locked / "out"), "cannot write in")
    one_line_error(cli("build", "--policy", tiny_policy, "--out", "/proc/topkgen-out"), "cannot write in /proc")
    assert not (tmp_path / "cache").exists()  # nothing was compiled


def test_no_lock_is_left_beside_the_bundle_nor_in_the_cache(tmp_path, tiny_policy):
    """Writers of one --out serialise on a lock file beside it, which the holder removes."""
    env = {**os.environ, "TOPKGEN_CACHE_DIR": str(tmp_path / "cache")}
    for _ in range(2):  # a new bundle, then the bundle replaced
        proc = subprocess.run([*TOPKGEN, "build", "--policy", str(tiny_policy), "--out", str(tmp_path / "out" / "b")],
                              capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stderr
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["b"]
    assert not (tmp_path / "cache" / "locks").exists()


def test_no_lock_file_is_committed():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    assert [f for f in files if f.endswith(".lock")] == []


# ----------------------------------------------------------------------------- manifests

def _tampered(tiny_bundle: Path, tmp_path: Path, edit) -> Path:
    copy = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, copy)
    text = (copy / "manifest.json").read_text()
    (copy / "manifest.json").write_text(edit(text))
    return copy


@pytest.mark.parametrize("case,edit,fragment", [
    # Each was a traceback: encode() of a lone surrogate, RecursionError, an unhashable list,
    # and "embedded null byte" when the cubin path was resolved.
    ("surrogate", lambda t: t.replace('"text": "', '"text": "\\udc80', 1), "U+DC80, a lone surrogate, is not allowed"),
    ("deep", lambda t: "[" * 100_000 + "]" * 100_000, "manifest.json:1:33: nested deeper than 32 levels"),
    ("list_rule", lambda t: t.replace('"jit_only": []', '"jit_only": [{"rule": ["a"], "reason": "r"}]'),
     "jit_only[0].rule: expected string, got a list"),
    ("nul_in_cubin", lambda t: t.replace('"cubin": "sm_90/', '"cubin": "sm_90/\\u0000', 1),
     "U+0000, a NUL byte (is the file UTF-16?), is not allowed"),
], ids=["surrogate", "deep", "list_rule", "nul_in_cubin"])
def test_broken_manifests_get_one_clear_error(cli, tiny_bundle, tiny_policy, tmp_path, case, edit, fragment):
    bundle = _tampered(tiny_bundle, tmp_path, edit)
    one_line_error(cli("diff", bundle, tiny_policy), str(bundle / "manifest.json"), fragment)
    np.save(tmp_path / "x.npy", np.zeros((1, 100), np.float32))
    one_line_error(cli("run", "--bundle", bundle, "--arch", "sm_90", "--backend", "emulator", "--k", "5",
                        tmp_path / "x.npy", "-o", tmp_path / "o.npz"), fragment)


# ----------------------------------------------------------------------------- run

def _npy_with_header(header: str, payload: bytes = b"") -> bytes:
    header += " " * (-(len(header) + 11) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + payload


RUN_INPUTS = {
    "zero_d": (lambda p: np.save(p, np.float32(3)), "a 0-d array (a single value)"),
    "npz_named_npy": (lambda p: p.write_bytes(_npz_bytes()), "an .npz archive (a zip of arrays), not a .npy array"),
    "empty": (lambda p: p.write_bytes(b""), "the file is empty"),  # was "Aborted!", exit 1
    "four_tebibytes": (lambda p: p.write_bytes(_npy_with_header(
        "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1099511627776), }", b"\0" * 8)),
        "the header declares shape (1, 1099511627776) of float32 (4398046511104 bytes of data) but the file "
        "holds 8 bytes after the header"),
    # found by a hostile-user trial: numpy raised from reshape (exit 70) on both
    "negative_dims": (lambda p: p.write_bytes(_npy_with_header(
        "{'descr': '<f4', 'fortran_order': False, 'shape': (-4, -300), }", b"\0" * 4800)),
        "the header declares a negative dimension: shape (-4, -300)"),
    "empty_but_huge": (lambda p: p.write_bytes(_npy_with_header(
        "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 4611686018427387904), }")),
        "the header declares shape (0, 4611686018427387904): a dimension over 2147483647"),
    # found by a hostile trial of the runtime: numpy raised from reshape (exit 70)
    "rows_over_2_31": (lambda p: p.write_bytes(_npy_with_header(
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2147483647, 2147483647, 0), }")),
        "the header declares shape (2147483647, 2147483647, 0): 4611686014132420609 rows, over 2147483647"),
    "empty_over_numpys_limit": (lambda p: p.write_bytes(_npy_with_header(  # 2^62 elements of 4 bytes
        "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 2147483647, 2147483647), }")),
        "the header declares shape (0, 2147483647, 2147483647): too large for numpy to shape"),
    "empty_unshapeable": (lambda p: p.write_bytes(_npy_with_header(
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2147483647, 2147483647, 2147483647, 0, 5), }")),
        "the header declares shape (2147483647, 2147483647, 2147483647, 0, 5): too large for numpy to shape"),
    # found by a new user's trial: numpy's header check takes True for an int, and reshape raised (exit 70)
    "bool_dimension": (lambda p: p.write_bytes(_npy_with_header(
        "{'descr': '<f4', 'fortran_order': False, 'shape': (True, 8), }", b"\0" * 32)),
        "the header declares shape (True, 8): a dimension that is not an integer"),
    # found by the same trial: more dimensions than numpy's limit, which reshape raised (exit 70)
    "too_many_dimensions": (lambda p: p.write_bytes(_npy_with_header(
        "{'descr': '<f4', 'fortran_order': False, 'shape': (" + "1, " * 70 + "8), }", b"\0" * 32)),
        "the header declares 71 dimensions (numpy takes at most"),
    # the message named ast's node with its memory address ('<ast.Call object at 0x7f...>'), other at each run
    "expression_header": (lambda p: p.write_bytes(_npy_with_header("__import__('os').getcwd()", b"\0" * 4)),
                          "bad .npy header: malformed node or string on line 1: an expression (Call), not a literal "
                          "value"),
    # refused from the header: a 1 GiB int8 file was read whole first
    "int8": (lambda p: np.save(p, np.zeros((3, 100), np.int8)), "dtype int8 is not one topkgen ranks: float32, "
             "float16, or bfloat16 (ml_dtypes.bfloat16, or its bits as uint16)"),
    "float64": (lambda p: np.save(p, np.zeros((3, 100))), "dtype float64 is not one topkgen ranks"),
    # numpy's own refusal advised allow_pickle=True
    "huge_header": (lambda p: p.write_bytes(b"\x93NUMPY\x02\x00" + (20001).to_bytes(4, "little") + b"{" + b" " * 20000),
                    "the header is 20001 bytes long (at most 10000)"),
    # the path was printed twice ("x.npy: cannot read: x.npy: not a regular file")
    "fifo": (lambda p: os.mkfifo(p), "is a FIFO, not a regular file"),
    "structured": (lambda p: np.save(p, np.zeros(4, dtype=[("a", "<f4"), ("b", "<f4")])), "a structured dtype"),
    "objects": (lambda p: p.write_bytes(_npy_with_header("{'descr': '|O', 'fortran_order': False, 'shape': (2,), }",
                                                         b"\0" * 16)), "holds Python objects"),
    "not_npy": (lambda p: p.write_text("1,2,3\n"), "not a .npy file"),
    "truncated_header": (lambda p: p.write_bytes(b"\x93NUMPY\x01\x00\xff\x00{'descr'"), "bad .npy header"),
    # found by `make fuzz`: a header length of 1 made numpy's parser raise tokenize.TokenError
    "header_length_one": (lambda p: p.write_bytes(b"\x93NUMPY\x01\x00\x01\x00{'descr': '<f4', 'fortran_order': "
                                                  b"False, 'shape': (1,), }\n\x00\x00\x00\x00"), "bad .npy header"),
}


def _npz_bytes() -> bytes:
    import io

    buffer = io.BytesIO()
    np.savez(buffer, x=np.zeros((2, 8), np.float32))
    return buffer.getvalue()


@pytest.mark.parametrize("case", sorted(RUN_INPUTS))
def test_run_refuses_bad_arrays_by_name(cli, tiny_bundle, tmp_path, case):
    write, fragment = RUN_INPUTS[case]
    path = tmp_path / "in.npy"
    write(path)
    result = cli("run", "--bundle", tiny_bundle, "--arch", "sm_90", "--backend", "emulator", "--k", "1",
                 path, "-o", tmp_path / "out.npz")
    one_line_error(result, f"{path}: {fragment}")
    assert not (tmp_path / "out.npz").exists()


@pytest.mark.parametrize("layout", ["fortran", "big_endian"])
def test_run_takes_fortran_order_and_big_endian_arrays(cli, tiny_bundle, tmp_path, layout):
    # The emulator backend refused Fortran-order arrays ("the last dimension must be contiguous").
    x = make_rows("float32", 6, 700, seed=4)
    stored = np.asfortranarray(x) if layout == "fortran" else x.astype(">f4")
    np.save(tmp_path / "in.npy", stored)
    result = cli("run", "--bundle", tiny_bundle, "--arch", "sm_90", "--backend", "emulator", "--k", "9",
                 "--deterministic", tmp_path / "in.npy", "-o", tmp_path / "out.npz")
    assert result.exit_code == 0, result.stderr
    out = np.load(tmp_path / "out.npz")
    check_topk(x, out["values"], out["indices"], 9, True, True, "float32")


def test_run_checks_its_arguments_and_output_before_running(cli, tiny_bundle, tmp_path):
    np.save(tmp_path / "in.npy", np.zeros((2, 100), np.float32))
    args = ["run", "--bundle", tiny_bundle, "--backend", "emulator", "--k", "3", tmp_path / "in.npy"]
    one_line_error(cli(*args, "--arch", "", "-o", tmp_path / "o.npz"), "arch: '' is not in the bundle's policy")
    one_line_error(cli(*args, "--arch", "sm_90", "-o", "/dev/null/x.npz"), "-o /dev/null/x.npz: /dev/null is not "
                                                                           "an existing directory")
    one_line_error(cli(*args, "--arch", "sm_90", "-o", tmp_path / "in.npy"), "is the input file")
    (tmp_path / "notes.npz").write_text("my notes\n")
    one_line_error(cli(*args, "--arch", "sm_90", "-o", tmp_path / "notes.npz"),
                    "exists and is not the output of an earlier topkgen run")
    assert (tmp_path / "notes.npz").read_text() == "my notes\n"
    for _ in range(2):  # an earlier run's output may be replaced
        assert cli(*args, "--arch", "sm_90", "-o", tmp_path / "o.npz").exit_code == 0
    assert cli(*args, "--arch", "sm_90", "-o", tmp_path / "notes.npz", "--force").exit_code == 0
    assert sorted(np.load(tmp_path / "notes.npz").files) == ["indices", "values"]


def test_names_a_command_prints_are_escaped_as_in_messages(cli, tiny_bundle, tiny_policy, tmp_path, monkeypatch):
    """A file name holding a line break or a terminal's escape sequence went out raw in the
    line a command prints (run's input and -o, show's, cache import's, build's and merge's
    bundle, the cache verify checked): it split the line, or acted on the terminal. It is
    escaped, as every error message shows a path."""
    odd = "a\n\x1b[2J"
    bundle = tmp_path / f"b{odd}"
    shutil.copytree(tiny_bundle, bundle)
    np.save(tmp_path / f"x{odd}.npy", np.zeros((2, 100), np.float32))
    shown = "a\\n\\x1b[2J"
    args = ["run", "--bundle", bundle, "--backend", "emulator", "--arch", "sm_90", "--k", "3", tmp_path / f"x{odd}.npy"]
    assert cli(*args).stdout.splitlines()[0].startswith(f"{tmp_path}/x{shown}.npy: largest 3 of 2 row(s) ")
    assert cli(*args, "-o", tmp_path / f"o{odd}.npz").stdout.startswith(f"{tmp_path}/o{shown}.npz: values float32")
    assert cli("show", bundle).stdout.startswith(f"bundle {tmp_path}/b{shown}: manifest schema ")
    assert cli("cache", "import", bundle).stdout.startswith(f"imported {tmp_path}/b{shown}: ")
    built = cli("build", "--policy", tiny_policy, "--out", tmp_path / f"o{odd}").stdout
    assert f"\nwrote {tmp_path}/o{shown}/manifest.json in " in built, built
    parts = []
    for shard in ("1/2", "2/2"):
        parts.append(tmp_path / f"part{shard[0]}")
        assert cli("build", "--policy", tiny_policy, "--shard", shard, "--out", parts[-1]).exit_code == 0
    merged = cli("merge", *parts, "--out", tmp_path / f"m{odd}").stdout
    assert merged.startswith(f"merged 2 shards into {tmp_path}/m{shown}/manifest.json: ")
    monkeypatch.setenv("TOPKGEN_CACHE_DIR", str(tmp_path / f"c{odd}"))
    assert cli("cache", "import", bundle).exit_code == 0  # verify refuses a cache that holds nothing
    verified = cli("cache", "verify", "--sample", "1").stdout
    assert verified.startswith(f"verified 1 of "), verified
    assert f" entries in {tmp_path}/c{shown}/nvrtc-store (1%" in verified, verified


def test_run_force_never_replaces_a_device_a_fifo_or_the_bundle_it_reads(cli, tiny_bundle, tmp_path):
    """-o is written beside its name and renamed over it: `-o /dev/null --force` as root
    deleted /dev/null, and `-o BUNDLE/manifest.json --force` the bundle being read."""
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, bundle)
    before = tree(bundle)
    np.save(tmp_path / "in.npy", np.zeros((2, 100), np.float32))
    args = ["run", "--bundle", bundle, "--backend", "emulator", "--arch", "sm_90", "--k", "3", tmp_path / "in.npy",
            "--force", "-o"]
    os.mkfifo(tmp_path / "fifo")
    one_line_error(cli(*args, tmp_path / "fifo"), f"-o {tmp_path / 'fifo'}: is a FIFO, not a regular file, and -o "
                                                   f"replaces regular files only, --force or not")
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode)
    (tmp_path / "to-fifo.npz").symlink_to(tmp_path / "fifo")  # as /dev/stdout leads to a pipe or a terminal
    one_line_error(cli(*args, tmp_path / "to-fifo.npz"), "to-fifo.npz: points to a FIFO, not a regular file")
    with tempfile.TemporaryDirectory(dir="/tmp") as short, socket.socket(socket.AF_UNIX) as sock:  # 108-byte names
        sock.bind(f"{short}/sock")
        one_line_error(cli(*args, f"{short}/sock"), "is a socket, not a regular file")
        assert stat.S_ISSOCK(os.lstat(f"{short}/sock").st_mode)
    (bundle / "escape.npz").symlink_to(tmp_path / "elsewhere.npz")  # the name in the bundle is what is replaced
    for target in (bundle / "manifest.json", bundle / "sm_90" / "new.npz", bundle / "escape.npz"):
        one_line_error(cli(*args, target), f"-o {target}: lies inside the input {bundle}")
    (bundle / "escape.npz").unlink()
    assert tree(bundle) == before
    (tmp_path / "into-bundle.npz").symlink_to(bundle / "manifest.json")  # the link is replaced, not the bundle
    assert cli(*args, tmp_path / "into-bundle.npz").exit_code == 0
    assert tree(bundle) == before and not (tmp_path / "into-bundle.npz").is_symlink()


# ----------------------------------------------------------------------------- internal errors

def _break_policy_building(monkeypatch) -> None:
    """A stand-in for a bug: every command loads a policy through policy._build."""
    from topkgen.policy import loading as policy

    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug\non two lines")

    monkeypatch.setattr(policy, "_build", broken)


def test_an_unexpected_error_is_one_line_and_exit_70_for_every_command(cli, tiny_bundle, tiny_policy, tmp_path,
                                                                       monkeypatch):
    commands = each_command(tiny_policy, tiny_bundle, tmp_path)
    _break_policy_building(monkeypatch)
    for name, args in commands.items():
        result = cli(*args)
        assert result.exit_code == 70, (name, result.exit_code, result.stderr)
        assert result.stderr == ("topkgen: internal error: ZeroDivisionError: a bug\\non two lines; "
                                 "set TOPKGEN_DEBUG=1 for the traceback\n"), (name, result.stderr)
    monkeypatch.setenv("TOPKGEN_DEBUG", "1")
    result = cli("plan")
    assert result.exit_code == 70 and "Traceback (most recent call last)" in result.stderr
    assert 'raise ZeroDivisionError("a bug' in result.stderr


def test_the_installed_entry_point_has_the_same_handler(tmp_path):
    code = ("import sys, topkgen.policy.loading as p\n"
            "p._build = lambda *a, **k: 1 / 0\n"
            "from topkgen.cli import main\n"
            "sys.argv = ['topkgen', 'plan']\n"
            "main()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 70 and proc.stderr == ("topkgen: internal error: ZeroDivisionError: division by zero; "
                                                     "set TOPKGEN_DEBUG=1 for the traceback\n")
    assert json.loads(subprocess.run([*TOPKGEN, "plan", "--format", "json"], capture_output=True, text=True,
                                     check=True).stdout)["totals"]["all"] == 58


def test_a_blank_cache_dir_is_unset_not_a_folder_named_blank(tmp_path, monkeypatch):
    """TOPKGEN_CACHE_DIR=' ' made a folder named ' ' wherever a command ran."""
    from topkgen.common.paths import cache_root, unusable_message

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    for blank in ("", " ", "\t"):
        monkeypatch.setenv("TOPKGEN_CACHE_DIR", blank)
        assert cache_root() == tmp_path / "xdg" / "topkgen"
        assert unusable_message(cache_root(), "is a file").startswith("cannot use the compile cache: ")
    monkeypatch.setenv("TOPKGEN_CACHE_DIR", f" {tmp_path}/c ")  # not a folder named ' '
    assert cache_root() == tmp_path / "c"
