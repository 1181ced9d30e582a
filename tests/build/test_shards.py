"""`build --shard I/N` and `topkgen merge`: three shards merged are byte-identical to a full
build; a missing, duplicated, foreign or tampered part is refused with exit status 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from topkgen.manifest import reading as manifests

from ..support.commands import topkgen, tree


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A full build and its three shards, with the session's cache."""
    base = tmp_path_factory.mktemp("shards")
    topkgen("build", "--out", base / "full", "-j", "2", env={})
    for i in (1, 2, 3):
        proc = topkgen("build", "--shard", f"{i}/3", "--out", base / f"part{i}", "-j", "2", env={})
        assert f"shard {i}/3 of 58: {(58 - i) // 3 + 1} kernels" in proc.stdout
    return base


def merge(*args, check: bool = False):
    return topkgen("merge", *args, env={}, check=check)


def test_three_shards_merge_byte_identical_to_a_full_build(built, tmp_path):
    parts = [built / f"part{i}" for i in (3, 1, 2)]  # any order
    proc = merge(*parts, "--out", tmp_path / "merged", check=True)
    assert proc.stdout == f"merged 3 shards into {tmp_path / 'merged'}/manifest.json: 58 kernels (sm_90 29, sm_100 29)\n"
    assert tree(tmp_path / "merged") == tree(built / "full")
    shard = json.loads((built / "part2" / "manifest.json").read_text())["shard"]
    assert shard["index"] == 2 and shard["count"] == 3 and len(shard["plan_sha256"]) == 64


def test_shards_partition_the_plan(built):
    names = [sorted(k["name"] for k in json.loads((built / f"part{i}" / "manifest.json").read_text())["kernels"])
             for i in (1, 2, 3)]
    full = sorted(k["name"] for k in json.loads((built / "full" / "manifest.json").read_text())["kernels"])
    assert sorted(sum(names, [])) == full
    assert [len(n) for n in names] == [20, 19, 19]


@pytest.mark.parametrize("case, message", [
    ("missing", "shard 3/3 missing (given: 1/3, 2/3)"),
    ("duplicate", "shard 2/3 given twice: "),
    ("not a shard", "a whole bundle among shards (merge shards of one plan, or bundles of other archs, not both)"),
    ("other count", "shard.count differs from "),
    ("tampered cubin", "does not match its sha256 in the manifest"),
    ("tampered entry", "launch not what the plan and this topkgen's templates give"),
    ("moved kernel", "kernels are not shard 1/3 of the plan; missing: "),
    ("other policy", "policy.sha256 differs from "),
])
def test_merge_refuses_parts_that_do_not_make_the_plan(built, tmp_path, case, message):
    parts = [built / f"part{i}" for i in (1, 2, 3)]
    if case == "missing":
        parts = parts[:2]
    elif case == "duplicate":
        parts.append(built / "part2")
    elif case == "not a shard":
        parts[2] = built / "full"
    elif case == "other count":
        topkgen("build", "--shard", "3/4", "--out", tmp_path / "q", env={})
        parts[2] = tmp_path / "q"
    else:
        parts[0] = tmp_path / "p1"
        shutil.copytree(built / "part1", parts[0])
        manifest_path = parts[0] / "manifest.json"
        manifest = json.loads(manifest_path.read_text())
        if case == "tampered cubin":
            cubin = parts[0] / manifest["kernels"][1]["cubin"]
            data = cubin.read_bytes()
            cubin.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
        elif case == "tampered entry":
            manifest["kernels"][1]["launch"]["threads_per_block"] *= 2
        elif case == "moved kernel":
            manifest["kernels"].pop()
        elif case == "other policy":
            manifest["policy"]["text"] += "\n# edited\n"
            import hashlib
            manifest["policy"]["sha256"] = hashlib.sha256(manifest["policy"]["text"].encode()).hexdigest()
        manifest_path.write_text(json.dumps(manifest))
    proc = merge(*parts, "--out", tmp_path / "merged")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("topkgen: error: ") and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "merged").exists()


@pytest.mark.parametrize("arg", ["0/3", "4/3", "3", "a/b", "1/0"])
def test_bad_shard_arguments_exit_2(tmp_path, arg):
    proc = topkgen("build", "--shard", arg, "--out", tmp_path / "x", env={}, check=False)
    assert proc.returncode == 2
    assert f"--shard {arg}: expected INDEX/COUNT with 1 <= INDEX <= COUNT" in proc.stderr
    assert not (tmp_path / "x").exists()


def test_a_shard_count_past_the_plan_s_size_is_refused(tmp_path):
    """Every part holds a kernel: 58 shards of the 58-kernel plan, not 59 (an empty matrix job)."""
    for arg, size in (("59/59", 58), ("1/999999", 58), ("30/30 --arch sm_90", 29)):
        shard, *more = arg.split()
        proc = topkgen("build", "--shard", shard, *more, "--out", tmp_path / "x", env={}, check=False)
        assert proc.returncode == 2 and proc.stdout == "", proc.stderr
        assert proc.stderr == (f"topkgen: error: --shard {shard}: more shards than the plan's {size} kernels "
                               f"(a part would hold none); expected a COUNT of at most {size}\n")
        assert not (tmp_path / "x").exists()


def test_merge_lists_a_few_of_many_missing_shards(built, tmp_path):
    """A manifest may claim any count up to 999999: the message stays one short line."""
    part = tmp_path / "p1"
    shutil.copytree(built / "part1", part)
    manifest = json.loads((part / "manifest.json").read_text())
    manifest["shard"]["count"] = 999999
    (part / "manifest.json").write_text(json.dumps(manifest))
    proc = merge(part, "--out", tmp_path / "merged")
    assert proc.returncode == 2
    assert proc.stderr == ("topkgen: error: shards 2/999999, 3/999999, 4/999999, 5/999999, 6/999999 and 999993 more "
                           "missing (given: 1/999999)\n")
    two = merge(built / "part1", "--out", tmp_path / "merged")
    assert two.stderr == "topkgen: error: shards 2/3, 3/3 missing (given: 1/3)\n"


def test_a_part_is_not_a_bundle_to_either_loader(built, cpp):  # noqa: F811
    """A part's dispatch rows name kernels that other parts hold: both loaders refuse it
    with one message, before serving anything."""
    import subprocess

    from topkgen.runtime import TopK, TopKError

    part = built / "part2"
    expected = (f"{part}/manifest.json: shard: part 2/3 of a sharded build, not a bundle; "
                f"assemble the parts with `topkgen merge` first")
    with pytest.raises(TopKError) as err:
        TopK(part, arch="sm_90", backend="emulator")
    assert str(err.value) == expected
    proc = subprocess.run([cpp, "verify", part], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr == f"topkgen-cpp: error: {expected}\n"


def test_diff_refuses_a_part_and_show_says_what_it_is(built):
    """diff, like the loaders, takes a part for no bundle (compared whole, two parts of one plan
    would differ by most kernels); show lists a part for inspection and says it is one."""
    for old, new in ((built / "part1", built / "part2"), (built / "full", built / "part3" / "manifest.json")):
        proc = topkgen("diff", old, new, "--stat", env={}, check=False)
        part = new if old == built / "full" else old
        index = 3 if old == built / "full" else 1
        assert proc.returncode == 2 and proc.stdout == "", proc.stderr
        assert proc.stderr == (f"topkgen: error: {part}: a part of a sharded build (shard {index}/3), not a bundle; "
                               f"merge the parts first: topkgen merge PART... --out DIR\n")
    header = topkgen("show", built / "part2", env={}).stdout.splitlines()[0]
    assert header.startswith(f"part {built / 'part2'} (shard 2/3 of a plan; merge the parts for a bundle): "
                             f"manifest schema {manifests.SCHEMA_VERSION}, NVRTC "), header
    assert topkgen("show", built / "full", env={}).stdout.startswith(
        f"bundle {built / 'full'}: manifest schema {manifests.SCHEMA_VERSION}, ")
