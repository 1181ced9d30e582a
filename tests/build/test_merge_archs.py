"""`topkgen merge` of per-arch bundles (`build --arch`): byte-identical to a single build of
the same archs, whatever the order the parts are named in; an arch given twice, a bundle
among shards, or a bundle of another policy is refused with exit status 2."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from ..support.commands import topkgen, tree


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """The default bundle, one bundle per arch, and a shard, with the session's cache."""
    base = tmp_path_factory.mktemp("archs")
    topkgen("build", "--out", base / "full", "-j", "2", env={})
    for arch in ("sm_90", "sm_100"):
        topkgen("build", "--arch", arch, "--out", base / arch, "-j", "2", env={})
    topkgen("build", "--shard", "1/2", "--out", base / "shard1", "-j", "2", env={})
    return base


def merge(*args, check: bool = False):
    return topkgen("merge", *args, env={}, check=check)


def test_per_arch_bundles_merge_byte_identical_to_one_build(built, tmp_path):
    proc = merge(built / "sm_100", built / "sm_90", "--out", tmp_path / "merged", check=True)  # any order
    assert proc.stdout == (f"merged 2 bundles into {tmp_path / 'merged'}/manifest.json: "
                           f"58 kernels (sm_90 29, sm_100 29)\n")
    assert tree(tmp_path / "merged") == tree(built / "full")
    assert (hashlib.sha256((tmp_path / "merged" / "manifest.json").read_bytes()).hexdigest()
            == hashlib.sha256((built / "full" / "manifest.json").read_bytes()).hexdigest())


def test_one_bundle_merges_into_itself(built, tmp_path):
    merge(built / "sm_90", "--out", tmp_path / "merged", check=True)
    assert tree(tmp_path / "merged") == tree(built / "sm_90")


@pytest.mark.parametrize("case, message", [
    ("same arch twice", "arch sm_90 is in two bundles: "),
    ("a shard too", "a whole bundle among shards (merge shards of one plan, or bundles of other archs, not both)"),
    ("other policy", "policy.sha256 differs from "),
    ("tampered entry", "kernel topk_register_ladder_k16_det_f32_sm_100: launch not what the plan"),
    ("missing kernel", "kernel: no kernel 'topk_radix_dyn_k1024_det_bf16_sm_100' for sm_100"),  # the loader's check
])
def test_merge_refuses_bundles_that_do_not_make_one_build(built, tmp_path, case, message):
    parts = [built / "sm_90", built / "sm_100"]
    if case == "same arch twice":
        parts.append(built / "sm_90")
    elif case == "a shard too":
        parts.append(built / "shard1")
    else:
        parts[1] = tmp_path / "b"
        shutil.copytree(built / "sm_100", parts[1])
        manifest_path = parts[1] / "manifest.json"
        manifest = json.loads(manifest_path.read_text())
        if case == "other policy":
            manifest["policy"]["text"] += "\n# edited\n"
            manifest["policy"]["sha256"] = hashlib.sha256(manifest["policy"]["text"].encode()).hexdigest()
        elif case == "tampered entry":
            manifest["kernels"][0]["launch"]["threads_per_block"] *= 2
        else:
            manifest["kernels"].pop()
        manifest_path.write_text(json.dumps(manifest))
    proc = merge(*parts, "--out", tmp_path / "merged")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("topkgen: error: ") and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "merged").exists()
