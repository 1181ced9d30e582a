"""`topkgen diff` against real git repositories made in temporary directories."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from topkgen.schema import load_schema

from .conftest import DEFAULT_POLICY, LEGACY_POLICY

TOPKGEN = [sys.executable, "-m", "topkgen.cli"]


def topkgen(*args, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*TOPKGEN, *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args], cwd=repo,
                   check=True, capture_output=True)


# The second commit drops the K=32/N=256 JIT tier and narrows the dynamic K ladder's launch
# bound for K=1024 from 2 CTAs per SM to 1.
CHANGED = (DEFAULT_POLICY.read_text()
           .replace("  - reg_exact_k32_n256\n", "")
           .replace(DEFAULT_POLICY.read_text()[DEFAULT_POLICY.read_text().index("  - name: reg_exact_k32_n256"):
                                               DEFAULT_POLICY.read_text().index("  - name: reg_exact_k16_n1024_sm100")], "")
           .replace("    min_ctas_per_sm:          # launch bounds by K rung\n      1024: 2",
                    "    min_ctas_per_sm:          # launch bounds by K rung\n      1024: 1", 1))
assert "K rung\n      1024: 1" in CHANGED


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "repo"
    (root / "policies" / "legacy").mkdir(parents=True)
    git(root, "init", "-q", "-b", "main")
    shutil.copy(DEFAULT_POLICY, root / "policies" / "topk.yaml")
    shutil.copy(LEGACY_POLICY, root / "policies" / "legacy" / "exact_n_grid.yaml")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "default policy")
    git(root, "tag", "v1")
    (root / "policies" / "topk.yaml").write_text(CHANGED)
    git(root, "commit", "-q", "-am", "drop the K=32/N=256 tier; K=1024 one CTA per SM on sm_90")
    return root


def test_legacy_against_default_policy_files():
    proc = topkgen("diff", LEGACY_POLICY, DEFAULT_POLICY)
    assert proc.returncode == 1
    assert "sm_90    48 -> 29" in proc.stdout and "sm_100   48 -> 29" in proc.stdout
    assert "total    96 -> 58" in proc.stdout
    assert "JIT-only tiers added: 3" in proc.stdout and "JIT-only tiers removed: 1" in proc.stdout
    assert "\x1b[" not in proc.stdout  # no colour when not on a terminal
    same = topkgen("diff", DEFAULT_POLICY, DEFAULT_POLICY)
    assert same.returncode == 0 and same.stdout.rstrip().endswith("same")


def test_two_revisions(repo):
    proc = topkgen("diff", "HEAD~1", "HEAD", "--format", "json", cwd=repo)
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    jsonschema.validate(doc, load_schema("diff.schema.json"))
    assert doc["old"]["kind"] == doc["new"]["kind"] == "revision"
    assert doc["counts"]["total"] == {"old": 58, "new": 58}
    assert [t["rule"] for t in doc["jit_only"]["removed"]] == ["reg_exact_k32_n256"]
    changed = {c["name"]: c["changes"] for c in doc["kernels"]["changed"]}
    assert set(changed) == {"topk_radix_dyn_k1024_fast_f32_sm_90", "topk_radix_dyn_k1024_det_f32_sm_90",
                            "topk_radix_dyn_k1024_fast_bf16_sm_90", "topk_radix_dyn_k1024_det_bf16_sm_90"}
    assert changed["topk_radix_dyn_k1024_det_f32_sm_90"]["launch"]["new"]["min_ctas_per_sm"] == 1
    moves = [d for d in doc["dispatch"]["changed"] if d["shape"]["k"] == 32 and d["shape"]["n"] == 256]
    assert moves and all(d["moves"] == "jit -> aot" for d in moves if d["shape"]["dtype"] != "float16")
    assert all(d["old"]["rule"] == "reg_exact_k32_n256" for d in moves)


def test_revisions_are_read_through_git_not_the_work_tree(repo):
    (repo / "policies" / "topk.yaml").write_text("not: [valid")
    assert topkgen("diff", "HEAD", "main", cwd=repo).returncode == 0
    proc = topkgen("diff", "v1", "HEAD", "--format", "markdown", cwd=repo)
    assert proc.returncode == 1
    assert proc.stdout.startswith("### topkgen diff `v1` → `HEAD`")
    assert "| sm_90 | 29 | 29 | +0 |" in proc.stdout
    assert "**JIT-only tiers removed: 1**" in proc.stdout


def test_policy_option_picks_a_file_inside_the_revision(repo):
    proc = topkgen("diff", "HEAD", "HEAD", "--policy", "policies/legacy/exact_n_grid.yaml", cwd=repo)
    assert proc.returncode == 0
    proc = topkgen("diff", "HEAD", str(repo / "policies" / "legacy" / "exact_n_grid.yaml"), cwd=repo)
    assert proc.returncode == 1 and "29 -> 48" in proc.stdout


@pytest.mark.parametrize("suffix", ["yaml", "json"])
def test_workload_file(repo, suffix):
    shapes = [{"arch": "sm_90", "dtype": "float32", "k": 32, "n": 256},
              {"arch": "sm_90", "dtype": "bfloat16", "k": 20, "n": 256, "deterministic": True},
              {"arch": "sm_100", "dtype": "float32", "k": 5, "n": 100}]
    path = repo / f"shapes.{suffix}"
    path.write_text(json.dumps(shapes) if suffix == "json" else
                    "".join(f"- {json.dumps(s)}\n" for s in shapes))
    proc = topkgen("diff", "HEAD~1", "HEAD", "--shapes", path, cwd=repo)
    assert proc.returncode == 1
    assert "dispatch: 2 of 3 shapes change" in proc.stdout
    assert ("sm_90 float32 k=32 n=256: topk_register_n256_k32_det_f32_sm_90 (JIT) -> "
            "topk_radix_fv1_k64_det_f32_sm_90 (AOT)  [jit -> aot]") in proc.stdout


@pytest.mark.parametrize("entry,message", [
    ({"arch": "sm_90", "dtype": "float32", "k": 5}, "shape #2: missing 'n'"),
    ({"arch": "sm_90", "dtype": "float32", "k": 50, "n": 5}, "shape #2: k: must be <= n"),
    ({"arch": "sm_90", "dtype": "float64", "k": 5, "n": 50}, "shape #2: dtype: 'float64' is not in the policy"),
    ({"arch": "sm_75", "dtype": "float32", "k": 5, "n": 50}, "shape #2: arch: 'sm_75' is in neither side"),
    ({"arch": "sm_90", "dtype": "float32", "k": "5", "n": 50}, "shape #2: k: expected an integer"),
    ({"arch": "sm_90", "dtype": "float32", "k": 5, "n": 50, "batch": 3}, "shape #2: unknown key(s) batch"),
])
def test_bad_workload_entries(repo, entry, message):
    path = repo / "bad.json"
    path.write_text(json.dumps([{"arch": "sm_90", "dtype": "float32", "k": 1, "n": 8}, entry]))
    proc = topkgen("diff", "HEAD~1", "HEAD", "--shapes", path, cwd=repo)
    assert proc.returncode == 2 and proc.stdout == ""
    assert f"bad.json: {message}" in proc.stderr


def test_bad_sides(repo, tmp_path):
    proc = topkgen("diff", "no-such-rev", "HEAD", cwd=repo)
    assert proc.returncode == 2 and "no-such-rev: not a file, directory or git revision" in proc.stderr
    proc = topkgen("diff", "HEAD", "missing.yaml", cwd=repo)
    assert proc.returncode == 2 and "missing.yaml: not a file, directory or git revision" in proc.stderr
    (repo / "policies" / "topk.yaml").write_text(CHANGED.replace("threads: 256", "threads: 300", 1))
    git(repo, "commit", "-q", "-am", "bad threads")
    proc = topkgen("diff", "HEAD~1", "HEAD", cwd=repo)
    assert proc.returncode == 2
    assert "HEAD:policies/topk.yaml:10:14: archs.sm_90.threads: 300 is not one of" in proc.stderr
    outside = topkgen("diff", "HEAD~1", "HEAD", cwd=tmp_path)
    assert outside.returncode == 2 and "not inside a git repository" in outside.stderr


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    base = tmp_path_factory.mktemp("built")
    proc = topkgen("build", "--arch", "sm_90", "--out", base / "a")
    assert proc.returncode == 0, proc.stderr
    return base


def test_manifest_and_bundle_sides_compare_resources(built, tmp_path):
    b = tmp_path / "b"
    shutil.copytree(built / "a", b)
    manifest = json.loads((b / "manifest.json").read_text())
    entry = next(k for k in manifest["kernels"] if k["name"] == "topk_radix_dyn_k64_fast_f32_sm_90")
    entry["resources"]["registers"] += 8
    (b / "manifest.json").write_text(json.dumps(manifest))
    assert topkgen("diff", built / "a", built / "a" / "manifest.json").returncode == 0
    proc = topkgen("diff", built / "a", b)
    assert proc.returncode == 1
    assert "~ topk_radix_dyn_k64_fast_f32_sm_90: resources:" in proc.stdout
    assert "dispatch: 0 of" in proc.stdout
    # A manifest against a policy: plan level, no resource columns.
    proc = topkgen("diff", b, DEFAULT_POLICY)
    assert "sm_100   0 -> 29" in proc.stdout and "resources" not in proc.stdout


def test_manifests_of_different_schema_versions(built, tmp_path):
    manifest = json.loads((built / "a" / "manifest.json").read_text())
    manifest["schema_version"] = 2
    other = tmp_path / "v2.json"
    other.write_text(json.dumps(manifest))
    proc = topkgen("diff", built / "a", other)
    assert proc.returncode == 2 and "v2.json: schema_version: 2 is not supported" in proc.stderr
