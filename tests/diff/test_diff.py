"""`topkgen diff` against real git repositories made in temporary directories, real bundles
and real NVRTC builds (through the compile cache)."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from topkgen import policy as pol
from topkgen.diff import DEFAULT_KS, DEFAULT_NS
from topkgen.common.schema import load_schema

from ..conftest import DEFAULT_POLICY, LEGACY_POLICY, ROOT
from ..support.commands import TOPKGEN, on_terminal

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
ENV.pop("NO_COLOR", None)


def topkgen(*args, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*TOPKGEN, *map(str, args)], capture_output=True, text=True, cwd=cwd, env=env or ENV)


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args], cwd=repo,
                   check=True, capture_output=True)


def diff_json(*args, cwd: Path | None = None) -> tuple[int, dict]:
    proc = topkgen("diff", *args, "--format", "json", cwd=cwd)
    assert proc.returncode in (0, 1), proc.stderr
    doc = json.loads(proc.stdout)
    jsonschema.validate(doc, load_schema("diff.schema.json"))
    assert doc["differs"] == (proc.returncode == 1)
    return proc.returncode, doc


def plan_names(policy: pol.Policy) -> list[str]:
    return [s.name for arch in policy.archs for s in pol.plan(policy, arch)]


def jit_names(policy: pol.Policy) -> list[str]:
    """Every kernel the runtime may compile for this policy: any rule's, any dtype's, not in the plan,
    and the large-k path's."""
    aot = set(plan_names(policy))
    return [s.name for arch in policy.archs for s in pol.all_kernels(policy, arch) if s.name not in aot]


# The second commit drops the K=32/N=256 JIT tier and tightens the dynamic K ladder's launch
# bound for K=1024 from 5 CTAs per SM to 6.
DEFAULT_TEXT = DEFAULT_POLICY.read_text()
CHANGED = (DEFAULT_TEXT
           .replace("  - reg_exact_k32_n256\n", "")
           .replace(DEFAULT_TEXT[DEFAULT_TEXT.index("  - name: reg_exact_k32_n256"):
                                 DEFAULT_TEXT.index("  - name: reg_exact_k16_n1024_sm100")], "")
           .replace("      1024: 5\n", "      1024: 6\n", 1))
assert "      1024: 6\n" in CHANGED


@pytest.fixture
def repo(tmp_path):
    """A checkout's policies and templates; v1 is the default policy, HEAD the CHANGED one."""
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    shutil.copytree(ROOT / "policies", root / "policies")
    shutil.copytree(ROOT / "templates", root / "templates")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "default policy")
    git(root, "tag", "v1")
    (root / "policies" / "topk.yaml").write_text(CHANGED)
    git(root, "commit", "-q", "-am", "drop the K=32/N=256 tier; K=1024 one CTA per SM on sm_90")
    return root


# ----------------------------------------------------------------------------- revisions

def test_a_template_change_is_a_source_change_of_every_kernel_that_reads_it(repo, default_policy):
    common = repo / "templates" / "topk_common.cuh"
    common.write_text(common.read_text() + "// one more line in the shared header\n")
    git(repo, "commit", "-q", "-am", "touch the kernels' shared header")
    code, doc = diff_json("HEAD~1", "HEAD", cwd=repo)
    assert code == 1
    changed = {c["name"]: c for c in doc["kernels"]["changed"]}
    assert sorted(changed) == sorted(plan_names(default_policy)) and len(changed) == 58
    assert all(c["aspects"] == ["source"] and c["templates"] == ["topk_common.cuh"] for c in changed.values())
    assert doc["dispatch"]["changed"] == [] and doc["summary"]["kernels"]["changed_in"]["source"] == 58
    # The kernels the runtime compiles (JIT-only tiers, float16) read the header too.
    jit = jit_names(pol.loads(CHANGED))  # the policy at HEAD~1 and HEAD
    assert sorted(c["name"] for c in doc["kernels"]["jit_changed"]) == sorted(jit) and jit
    assert all(c["templates"] == ["topk_common.cuh"] for c in doc["kernels"]["jit_changed"])
    text = topkgen("diff", "HEAD~1", "HEAD", cwd=repo)
    assert text.returncode == 1
    assert "kernels: 0 added, 0 removed, 58 changed (58 in source)" in text.stdout
    assert "~ topk_radix_dyn_k64_fast_f32_sm_90: source (topk_common.cuh)" in text.stdout

    # A change to one family's template touches that family's kernels only.
    register = repo / "templates" / "register_select.cu.j2"
    register.write_text(register.read_text() + "// register kernels only\n")
    git(repo, "commit", "-q", "-am", "touch the register template")
    code, doc = diff_json("HEAD~1", "HEAD", cwd=repo)
    assert code == 1
    registers = [n for n in plan_names(default_policy) if n.startswith("topk_register_")]
    assert [c["name"] for c in doc["kernels"]["changed"]] == registers and registers
    assert all(c["templates"] == ["register_select.cu.j2"] for c in doc["kernels"]["changed"])


def test_a_change_that_only_the_jit_kernels_see(repo):
    radix = repo / "templates" / "radix_select.cu.j2"
    radix.write_text(radix.read_text() + '{% if ctype == "__half" %}// float16 only\n{% endif %}')
    git(repo, "commit", "-q", "-am", "a line for float16 radix kernels (all JIT)")
    code, doc = diff_json("HEAD~1", "HEAD", cwd=repo)
    assert code == 1 and doc["kernels"]["changed"] == []
    expected = [n for n in jit_names(pol.loads(CHANGED)) if n.startswith("topk_radix_") and "_f16_" in n]
    assert sorted(c["name"] for c in doc["kernels"]["jit_changed"]) == sorted(expected) and expected
    text = topkgen("diff", "HEAD~1", "HEAD", "--stat", cwd=repo).stdout
    assert f"JIT kernels: {len(expected)} changed in source" in text and text.rstrip().endswith("differ")


def test_two_revisions_with_a_policy_change(repo):
    code, doc = diff_json("HEAD~1", "HEAD", cwd=repo)
    assert code == 1
    assert doc["old"]["kind"] == doc["new"]["kind"] == "revision"
    assert doc["summary"]["counts"]["total"] == {"old": 58, "new": 58}
    assert [t["rule"] for t in doc["jit_only"]["removed"]] == ["reg_exact_k32_n256"]
    changed = {c["name"]: c for c in doc["kernels"]["changed"]}
    assert set(changed) == {"topk_radix_dyn_k1024_fast_f32_sm_90", "topk_radix_dyn_k1024_det_f32_sm_90",
                            "topk_radix_dyn_k1024_fast_bf16_sm_90", "topk_radix_dyn_k1024_det_bf16_sm_90"}
    entry = changed["topk_radix_dyn_k1024_det_f32_sm_90"]
    # Only what changed: the launch bound, and the source it is rendered into; no template did.
    assert set(entry["changes"]) == {"launch.min_ctas_per_sm", "source_sha256"}
    assert entry["changes"]["launch.min_ctas_per_sm"] == {"old": 5, "new": 6}
    assert entry["aspects"] == ["launch", "source"] and entry["templates"] == []
    moves = [d for d in doc["dispatch"]["changed"] if d["shape"]["k"] == 32 and d["shape"]["n"] == 256]
    assert moves and all(d["moves"] == "jit -> aot" for d in moves if d["shape"]["dtype"] != "float16")
    assert all(d["old"]["rule"] == "reg_exact_k32_n256" for d in moves)
    text = topkgen("diff", "v1", "HEAD", cwd=repo).stdout
    assert "~ topk_radix_dyn_k1024_det_f32_sm_90: min CTAs/SM 5 -> 6, source (templates unchanged)" in text


def test_revisions_are_read_through_git_not_the_work_tree(repo):
    (repo / "policies" / "topk.yaml").write_text("not: [valid")
    (repo / "templates" / "topk_common.cuh").write_text("#error not this one\n")
    assert topkgen("diff", "HEAD", "main", cwd=repo).returncode == 0
    proc = topkgen("diff", "v1", "HEAD", "--format", "markdown", cwd=repo)
    assert proc.returncode == 1
    assert proc.stdout.startswith("### topkgen diff `v1` → `HEAD`: differ")
    assert "| sm_90 | 29 | 29 | +0 |" in proc.stdout
    assert "- **JIT-only tiers**: 0 added, 1 removed" in proc.stdout


def test_one_revision_is_compared_with_the_working_tree(repo):
    assert topkgen("diff", "HEAD", cwd=repo).returncode == 0
    (repo / "policies" / "topk.yaml").write_text(DEFAULT_TEXT)
    code, doc = diff_json("HEAD", cwd=repo)
    assert code == 1 and doc["new"]["kind"] == "worktree" and doc["new"]["label"] == "working tree"
    assert [t["rule"] for t in doc["jit_only"]["added"]] == ["reg_exact_k32_n256"]
    assert diff_json("v1", cwd=repo)[0] == 0
    # Templates in the working tree count too, uncommitted as they are.
    header = repo / "templates" / "topk_common.cuh"
    header.write_text(header.read_text() + "// uncommitted\n")
    code, doc = diff_json("v1", cwd=repo)
    assert code == 1 and len(doc["kernels"]["changed"]) == 58
    assert {tuple(c["templates"]) for c in doc["kernels"]["changed"]} == {("topk_common.cuh",)}
    # Alone, OLD must be a revision.
    proc = topkgen("diff", DEFAULT_POLICY, cwd=repo)
    assert proc.returncode == 2 and "NEW is missing: only a git revision may stand alone" in proc.stderr


def test_a_range_is_read_as_git_diff_reads_it(repo, tmp_path):
    """`A..B` is A against B and `A...B` B against where A and B meet (an empty end is HEAD);
    both were "not a file, directory or git revision". A shallow clone says why HEAD~1 is not."""
    git(repo, "checkout", "-q", "-b", "side", "v1")
    git(repo, "commit", "-q", "--allow-empty", "-m", "a branch from v1 that changes nothing")
    code, doc = diff_json("main..side", cwd=repo)
    assert code == 1 and (doc["old"]["label"], doc["new"]["label"]) == ("main", "side")
    assert [t["rule"] for t in doc["jit_only"]["added"]] == ["reg_exact_k32_n256"]
    code, doc = diff_json("main...side", cwd=repo)  # side against v1, where it left main: the same
    v1 = subprocess.run(["git", "rev-parse", "v1"], cwd=repo, capture_output=True, text=True).stdout.strip()
    assert code == 0 and doc["old"]["label"] == v1[:12]  # as git log --oneline names it, not 40 digits
    assert diff_json("side...main", cwd=repo)[0] == 1 and diff_json("..side", cwd=repo)[0] == 0
    proc = topkgen("diff", "main...nowhere", cwd=repo)
    assert (proc.returncode, proc.stderr) == (2, "topkgen: error: nowhere: not a file, directory or git revision "
                                                 "of repo\n")
    # A path with `..` in it is no range: it is named as given (it read as HEAD against
    # '/missing/topk.yaml', or, outside a repository, as a revision 'HEAD' that is not there).
    for cwd, where in ((repo / "policies", "git revision of repo"), (tmp_path, "and not inside a git repository")):
        proc = topkgen("diff", "../missing/topk.yaml", cwd=cwd)
        assert proc.returncode == 2 and proc.stderr.startswith("topkgen: error: ../missing/topk.yaml: not a file"), \
            proc.stderr
        assert proc.stderr.endswith(f"{where}\n"), proc.stderr
    for args, name in ((("main..side", "side"), "OLD"), (("main", "main...side"), "NEW")):  # a range and a side
        proc = topkgen("diff", *args, cwd=repo)  # was "main..side: not a file, directory or git revision"
        spec = args[0] if name == "OLD" else args[1]
        assert (proc.returncode, proc.stderr) == (2, f"topkgen: error: {name} {spec}: a range names both sides; give "
                                                     f"it alone (topkgen diff {spec}), or OLD and NEW as two "
                                                     f"revisions\n")
    shallow = tmp_path / "shallow"
    git(tmp_path, "clone", "-q", "--depth", "1", "-b", "main", f"file://{repo}", str(shallow))
    proc = topkgen("diff", "HEAD~1", cwd=shallow)
    assert proc.returncode == 2 and proc.stderr == (
        "topkgen: error: HEAD~1: not a file, directory or git revision of shallow (a shallow clone: "
        "`git fetch --deepen=N` or `--unshallow` fetches older commits)\n")


def test_policy_option_picks_a_file_inside_each_side(repo):
    proc = topkgen("diff", "HEAD", "HEAD", "--policy", "policies/legacy/exact_n_grid.yaml", cwd=repo)
    assert proc.returncode == 0
    proc = topkgen("diff", "HEAD", "--policy", "policies/legacy/exact_n_grid.yaml", cwd=repo)
    assert proc.returncode == 0 and "old: revision" in proc.stdout
    assert "new: working tree: policies/legacy/exact_n_grid.yaml" in proc.stdout
    proc = topkgen("diff", "HEAD", str(repo / "policies" / "legacy" / "exact_n_grid.yaml"), cwd=repo)
    assert proc.returncode == 1 and "29 -> 48" in proc.stdout
    proc = topkgen("diff", "HEAD", "v1", "--policy", "../outside.yaml", cwd=repo)
    assert proc.returncode == 2 and "--policy '../outside.yaml': expected a path relative" in proc.stderr
    # A path is a path, not git's pathspec magic (which matched, then met a size limit of 0 bytes).
    proc = topkgen("diff", "HEAD", "v1", "--policy", ":(top)policies/topk.yaml", cwd=repo)
    assert (proc.returncode, proc.stderr) == (2, "topkgen: error: HEAD: no :(top)policies/topk.yaml at that revision\n")


def test_a_repository_of_policies_alone_renders_with_the_installed_templates(tmp_path):
    root = tmp_path / "policies-only"
    (root / "policies").mkdir(parents=True)
    git(root, "init", "-q")
    shutil.copy(DEFAULT_POLICY, root / "policies" / "topk.yaml")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "one")
    code, doc = diff_json("HEAD", DEFAULT_POLICY, cwd=root)
    assert code == 0 and "installed templates (no templates/ at that revision)" in doc["old"]["origin"]


def test_git_trees_are_read_in_one_batch_whatever_the_file_names(tmp_path):
    from topkgen.build.sources import GitRepo

    root = tmp_path / "names"
    (root / "templates" / "sub dir").mkdir(parents=True)
    files = {f"templates/t{i}.j2": f"file {i}\n".encode() * i for i in range(40)}
    files.update({"templates/sub dir/with space\n and newline.cuh": b"\x00\xff binary \n\n",
                  "templates/ünï.cuh": "ünïcode\n".encode(), "templates/empty": b"", "other/x": b"not asked for"})
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "many files")
    repo = GitRepo.around(root, "HEAD")
    read = repo.read(repo.commit("HEAD"), {"templates": 1 << 20})
    assert read == {name: data for name, data in files.items() if name.startswith("templates/")}


# ----------------------------------------------------------------------------- any two sides

def test_sides_with_different_dtypes_compare(tmp_path):
    without = re.sub(r"\n  jit: \[float16\][^\n]*", "", DEFAULT_TEXT)
    assert without != DEFAULT_TEXT
    path = tmp_path / "no_f16.yaml"
    path.write_text(without)
    assert topkgen("diff", path, path).returncode == 0  # a policy without float16 diffs against itself
    code, doc = diff_json(DEFAULT_POLICY, path)
    assert code == 1
    grid = [d for d in doc["dispatch"]["changed"]]
    f16_shapes = doc["dispatch"]["shapes_checked"] // 3  # three dtypes in the union, same grid each
    assert len(grid) == f16_shapes == doc["summary"]["dispatch"]["moves"]["served -> unsupported"]
    assert all(d["shape"]["dtype"] == "float16" and d["moves"] == "served -> unsupported"
               and d["new"]["source"] == "unsupported" for d in grid)
    assert {d["shape"]["arch"] for d in grid} == {"sm_90", "sm_100"}
    back = topkgen("diff", path, DEFAULT_POLICY, "--stat")
    assert back.returncode == 1 and f"dispatch: {f16_shapes} of {3 * f16_shapes} shapes change: " \
                                   f"{f16_shapes} unsupported -> served" in back.stdout


def test_a_split_in_one_launch_changes_the_kernels_parameters(tmp_path):
    """Setting the split sections' one_launch gives the radix kernels that may split four more
    parameters (schema 7): a loader's concern, so diff names them on each such kernel (and
    their source), while no shape moves."""
    assert DEFAULT_TEXT.count("one_launch: false") == 2
    path = tmp_path / "one_launch.yaml"
    path.write_text(DEFAULT_TEXT.replace("one_launch: false", "one_launch: true"))
    merging = {s.name for s in (pol.select(pol.load(path), arch, dtype, k, 131072).kernel
                                for arch in ("sm_90", "sm_100") for dtype in ("float32", "bfloat16")
                                for k in (64, 128, 256, 512, 1024))}
    code, doc = diff_json(DEFAULT_POLICY, path)
    assert code == 1 and doc["summary"]["dispatch"]["changed"] == 0 and not doc["kernels"]["added"]
    changed = {c["name"]: c for c in doc["kernels"]["changed"]}
    assert merging <= set(changed) and len(changed) == 40 and all(c["aspects"] == ["parameters", "source"]
                                                                   for c in changed.values())
    for change in changed.values():
        old, new = (change["changes"]["params"][side] for side in ("old", "new"))
        assert new[:len(old)] == old and [p["name"] for p in new[len(old):]] == \
            ["tickets", "merged_values", "merged_indices", "merged_flags"]
    text = topkgen("diff", DEFAULT_POLICY, path).stdout
    assert "~ topk_radix_dyn_k256_fast_f32_sm_90: params +tickets +merged_values +merged_indices +merged_flags, " \
           "source (templates unchanged)" in text
    assert topkgen("diff", path, path).returncode == 0


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """The default bundle for both archs, and one built for sm_100 only."""
    base = tmp_path_factory.mktemp("bundles")
    for name, archs in (("full", ()), ("sm100", ("--arch", "sm_100"))):
        proc = topkgen("build", *archs, "--out", base / name, "-j", "2")
        assert proc.returncode == 0, proc.stderr
    return base


def test_a_bundle_serves_an_arch_it_lacks_by_jit(bundles, default_policy):
    code, doc = diff_json(bundles / "full", bundles / "sm100")
    assert code == 1
    assert doc["summary"]["counts"]["sm_90"] == {"old": 29, "new": 0}
    moved = {json.dumps(d["shape"], sort_keys=True): d for d in doc["dispatch"]["changed"]}
    expected = 0
    for arch in ("sm_90", "sm_100"):
        for dtype in default_policy.dtypes:
            for k in DEFAULT_KS:
                for n, rows, det in itertools.product(DEFAULT_NS, (1, 64, 4096), (False, True)):
                        if k > n:
                            continue
                        sel = pol.select(default_policy, arch, dtype, k, n, deterministic=det, rows=rows)
                        key = json.dumps({"arch": arch, "dtype": dtype, "k": k, "n": n, "rows": rows,
                                          "deterministic": det}, sort_keys=True)
                        if arch == "sm_90" and sel.source == "aot":
                            expected += 1
                            assert moved[key]["moves"] == "aot -> jit"
                            assert moved[key]["old"]["kernel"] == moved[key]["new"]["kernel"] == sel.kernel.name
                        else:
                            assert key not in moved
    assert expected == len(moved) == doc["summary"]["dispatch"]["moves"]["aot -> jit"] > 0
    # A bundle and the policy it was built from, rendered here: the same sources, the same kernels.
    assert topkgen("diff", bundles / "full", DEFAULT_POLICY).returncode == 0


def test_an_arch_a_bundle_lacks_keeps_its_jit_only_tiers(bundles, tmp_path):
    """The runtime serves an arch the bundle lacks by JIT from the embedded policy, its exact
    tiers included: they were reported removed (the manifest lists its own archs' tiers)."""
    proc = topkgen("build", "--arch", "sm_90", "--out", tmp_path / "sm90", "-j", "2")
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((tmp_path / "sm90" / "manifest.json").read_text())
    full = json.loads((bundles / "full" / "manifest.json").read_text())
    assert {t["rule"] for t in manifest["jit_only"]} < {t["rule"] for t in full["jit_only"]}  # the case in question
    code, doc = diff_json(bundles / "full", tmp_path / "sm90")
    assert code == 1 and doc["summary"]["counts"]["sm_100"] == {"old": 29, "new": 0}
    assert doc["summary"]["jit_only"] == {"added": 0, "removed": 0, "changed": 0}


def test_manifest_and_bundle_sides_compare_resources(bundles, tmp_path):
    b = tmp_path / "b"
    shutil.copytree(bundles / "full", b)
    manifest = json.loads((b / "manifest.json").read_text())
    entry = next(k for k in manifest["kernels"] if k["name"] == "topk_radix_dyn_k64_fast_f32_sm_90")
    registers = entry["resources"]["registers"]
    entry["resources"]["registers"] = 200  # over the radix family's budget of 96
    (b / "manifest.json").write_text(json.dumps(manifest))
    assert topkgen("diff", bundles / "full", bundles / "full" / "manifest.json").returncode == 0
    proc = topkgen("diff", bundles / "full", b)
    assert proc.returncode == 1
    assert f"~ topk_radix_dyn_k64_fast_f32_sm_90: registers {registers} -> 200 ({200 - registers:+d})" in proc.stdout
    assert "over budget: old 0, new 1" in proc.stdout
    assert "! topk_radix_dyn_k64_fast_f32_sm_90: old: within budget; new: 200 registers > budget 96" in proc.stdout
    assert "dispatch: 0 of" in proc.stdout
    # A manifest against a policy: no resources on the policy side, so none compared; the
    # kernel over its budget is still shown.
    proc = topkgen("diff", b, DEFAULT_POLICY)
    assert proc.returncode == 0 and "kernels: 0 added, 0 removed, 0 changed\n" in proc.stdout
    assert "over budget: old 1, new not built" in proc.stdout
    assert "! topk_radix_dyn_k64_fast_f32_sm_90: old: 200 registers > budget 96; new: n/a" in proc.stdout


def test_a_bundle_whose_files_would_not_load_is_refused_not_the_same(bundles, tmp_path):
    """A cubin changed after the build: every loader refuses the bundle, so diff must not call
    it "same" (it read the manifest only). A lone manifest file has no files to check."""
    b = tmp_path / "b"
    shutil.copytree(bundles / "full", b)
    manifest = json.loads((b / "manifest.json").read_text())
    index, entry = next((i, k) for i, k in enumerate(manifest["kernels"]) if k["arch"] == "sm_90")
    cubin = bytearray((b / entry["cubin"]).read_bytes())
    cubin[-1] ^= 1
    (b / entry["cubin"]).write_bytes(bytes(cubin))
    proc = topkgen("diff", bundles / "full", b, "--stat")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (f"topkgen: error: {b / 'manifest.json'}: kernels[{index}].sha256: {entry['cubin']} does not "
                           f"match its sha256 in the manifest\n")
    assert topkgen("diff", bundles / "full", b / "manifest.json", "--stat").returncode == 0


def test_a_duplicated_kernel_entry_is_refused(bundles, tmp_path):
    manifest = json.loads((bundles / "full" / "manifest.json").read_text())
    manifest["kernels"].append(manifest["kernels"][3])
    dup = tmp_path / "dup.json"
    dup.write_text(json.dumps(manifest))
    name = manifest["kernels"][3]["name"]
    proc = topkgen("diff", bundles / "full", dup)
    assert proc.returncode == 2 and proc.stdout == ""
    assert f"dup.json: kernels[{len(manifest['kernels']) - 1}].name: duplicate kernel name '{name}'" in proc.stderr


def test_manifests_of_unsupported_schema_versions(bundles, tmp_path):
    manifest = json.loads((bundles / "full" / "manifest.json").read_text())
    manifest["schema_version"] = 99
    other = tmp_path / "v99.json"
    other.write_text(json.dumps(manifest))
    proc = topkgen("diff", bundles / "full", other)
    assert proc.returncode == 2 and "v99.json: schema_version: 99 is not supported" in proc.stderr


# ----------------------------------------------------------------------------- --build

def test_build_reports_the_resource_deltas_of_exactly_the_affected_kernels(repo, tmp_path):
    # sm_90's K=512 rung as it was: 256 threads, 4 loads in flight, no launch bound
    raised = (DEFAULT_TEXT.replace("      512: 128                #", "      512: 256                #", 1)
              .replace("      512: 5\n", "", 1).replace("256: 8, 512: 8, 1024: 8}", "256: 8, 1024: 8}", 1))
    assert raised.count("512: ") == DEFAULT_TEXT.count("512: ") - 2  # the bound and the loads entry
    (repo / "policies" / "topk.yaml").write_text(raised)
    git(repo, "commit", "-q", "-am", "sm_90: K=512 radix blocks of 256 threads")
    code, doc = diff_json("v1", "HEAD", "--build", "-j", "2", cwd=repo)
    assert code == 1 and doc["old"]["built"] and doc["new"]["built"]

    old_policy, new_policy = pol.loads(DEFAULT_TEXT), pol.loads(raised)
    old_plan = {s.name: s.record() for a in old_policy.archs for s in pol.plan(old_policy, a)}
    new_plan = {s.name: s.record() for a in new_policy.archs for s in pol.plan(new_policy, a)}
    affected = {n for n in new_plan if new_plan[n]["launch"] != old_plan[n]["launch"]}
    assert affected and all(n.endswith("_sm_90") and "_radix_" in n for n in affected)
    changed = {c["name"]: c["changes"] for c in doc["kernels"]["changed"]}
    assert set(changed) == affected

    # The deltas are those of real builds of each side (the same compile cache, so cheap).
    built = {}
    for label, text in (("old", DEFAULT_TEXT), ("new", raised)):
        (tmp_path / f"{label}.yaml").write_text(text)
        proc = topkgen("build", "--policy", tmp_path / f"{label}.yaml", "--arch", "sm_90", "--out", tmp_path / label)
        assert proc.returncode == 0, proc.stderr
        built[label] = {k["name"]: k for k in json.loads((tmp_path / label / "manifest.json").read_text())["kernels"]}
    fields = ("registers", "spill_stores", "spill_loads", "stack_bytes", "static_shared_bytes")
    for name in affected:
        assert changed[name]["launch.threads_per_block"] == {"old": 128, "new": 256}
        for f in fields:
            before, after = built["old"][name]["resources"][f], built["new"][name]["resources"][f]
            assert changed[name].get(f"resources.{f}") == ({"old": before, "new": after} if before != after else None)
        before, after = built["old"][name]["size_bytes"], built["new"][name]["size_bytes"]
        assert changed[name].get("size_bytes") == ({"old": before, "new": after} if before != after else None)
    assert any("resources.registers" in c for c in changed.values())

    text = topkgen("diff", "v1", "HEAD", "--build", cwd=repo).stdout
    line = next(line for line in text.splitlines() if line.startswith("  ~ topk_radix_dyn_k512_det_f32_sm_90:"))
    r_old = built["old"]["topk_radix_dyn_k512_det_f32_sm_90"]["resources"]["registers"]
    r_new = built["new"]["topk_radix_dyn_k512_det_f32_sm_90"]["resources"]["registers"]
    assert line.startswith("  ~ topk_radix_dyn_k512_det_f32_sm_90: threads 128 -> 256, ")
    if r_old != r_new:
        assert f", registers {r_old} -> {r_new} ({r_new - r_old:+d})" in line
    else:
        assert "registers" not in line
    assert "over budget: old 0, new 0" in text


def test_a_build_failure_is_trouble_not_a_difference(repo):
    register = repo / "templates" / "register_select.cu.j2"
    register.write_text(register.read_text() + "#error this template does not compile\n")
    git(repo, "commit", "-q", "-am", "break the register template")
    proc = topkgen("diff", "HEAD~1", "HEAD", "--build", "-j", "2", cwd=repo)
    assert proc.returncode == 2 and proc.stdout == ""
    # the first compile to fail is reported (-j 2: whichever register kernel ends first), and no other
    assert len(re.findall(r"--build: kernel topk_register_ladder_\w+_sm_90 \(sm_90\) failed to compile", proc.stderr)) == 1
    # NVRTC's log on lines of its own, as build prints it, not one line of literal \n
    assert any(line.strip().startswith("#error this template does not compile")
               or "error directive: this template does not compile" in line for line in proc.stderr.splitlines())
    assert "\\n" not in proc.stderr


# ----------------------------------------------------------------------------- the report

def test_a_jit_only_tier_whose_reason_changed_differs(tmp_path):
    """The reason of a JIT-only tier is written into the manifest (jit_only, and plan and
    explain print it): a change to it alone is a difference, in every format (it was "same",
    exit 0)."""
    old_reason = 'reason: "single-shape register kernel; kept out of the bundle'
    assert DEFAULT_TEXT.count(old_reason) == 1
    new = tmp_path / "new.yaml"
    new.write_text(DEFAULT_TEXT.replace(old_reason, 'reason: "measured again: single-shape register kernel; kept out of the bundle'))
    code, doc = diff_json(DEFAULT_POLICY, new)
    assert code == 1 and doc["summary"]["jit_only"] == {"added": 0, "removed": 0, "changed": 1}
    (tier,) = doc["jit_only"]["changed"]
    assert tier["rule"] == "reg_exact_k32_n256" and set(tier["changes"]) == {"reason"}
    assert tier["changes"]["reason"]["new"].startswith("measured again: single-shape")
    text = topkgen("diff", DEFAULT_POLICY, new)
    assert text.returncode == 1 and "JIT-only tiers: 0 added, 0 removed, 1 changed" in text.stdout
    assert '  ~ reg_exact_k32_n256: reason "single-shape register kernel;' in text.stdout
    assert '-> "measured again: single-shape register kernel;' in text.stdout
    md = topkgen("diff", DEFAULT_POLICY, new, "--format", "markdown")
    assert md.returncode == 1 and "<summary>JIT-only tiers changed: 1</summary>" in md.stdout
    assert '| `reg_exact_k32_n256` | reason "single-shape register kernel; kept out' in md.stdout
    assert topkgen("diff", DEFAULT_POLICY, DEFAULT_POLICY).returncode == 0


def test_markdown_keeps_a_reason_s_markup_mentions_and_references_inert(tmp_path):
    """A reason is free text: in a pull-request comment `@alice` would notify her, `#1` cite
    an issue, and **x**, [a](url), backticks, ~x~, _x_, | and <b> would render as markup.
    Each special is escaped; @ and # are followed by a zero-width space (GitHub links mentions
    and references in the rendered text, whatever the source escaped)."""
    from topkgen.diff.report import _md

    for special in "\\*[]()!|`~#":
        assert _md(f"a{special}b") == f"a\\{special}{'&#8203;' if special == '#' else ''}b"
    assert _md("@alice") == "@&#8203;alice" and _md("<b>&") == "&lt;b&gt;&amp;"
    assert _md("two\nlines\r\n| x") == "two lines \\| x"  # a line break would end the table row
    assert _md("_x_ sm_90 a__b") == "\\_x\\_ sm_90 a\\_\\_b"  # within a word `_` is no emphasis
    old_reason = 'reason: "single-shape register kernel; kept out of the bundle'
    new = tmp_path / "new.yaml"
    new.write_text(DEFAULT_TEXT.replace(old_reason, 'reason: "cc @alice, see #1: **x** [a](https://x.invalid) `c` '
                                                    '~s~ _i_ a|b <b> \\\\ ! kept out of the bundle'))
    md = topkgen("diff", DEFAULT_POLICY, new, "--format", "markdown").stdout
    assert ("cc @&#8203;alice, see \\#&#8203;1: \\*\\*x\\*\\* \\[a\\]\\(https:&#8203;//x.invalid\\) \\`c\\` \\~s\\~ "
            "\\_i\\_ a\\|b &lt;b&gt; \\\\\\\\ \\! kept out") in md  # the backslash as JSON writes it, each escaped
    assert "@alice" not in md and "#1" not in md and "**x**" not in md and "<b>" not in md


def test_markdown_keeps_emoji_shortcodes_and_bare_urls_inert(tmp_path):
    """GitHub renders `:rocket:` as an emoji, links a bare `https://...` or `www.x` and cites
    issue 12 for `GH-12` in a comment: a zero-width space after the colon, `www` or `GH` keeps
    a reason as the characters it holds, as after @ and #; a colon elsewhere (`k: 32`,
    `topk::x`) is left alone."""
    from topkgen.diff.report import _md

    zw = "&#8203;"
    assert _md(":rocket: :+1: :thumbs_up:") == f":{zw}rocket: :{zw}+1: :{zw}thumbs_up:"
    assert _md("see https://x.invalid/a or HTTP://x.invalid") == f"see https:{zw}//x.invalid/a or HTTP:{zw}//x.invalid"
    assert _md("www.x.invalid (WWW.y.invalid)") == f"www{zw}.x.invalid \\(WWW{zw}.y.invalid\\)"
    assert _md("see GH-12, gh-3") == f"see GH{zw}-12, gh{zw}-3"  # GitHub's other way to cite an issue
    assert _md("k: 32, topk::x, awww.x, SGH-1, GH-x") == "k: 32, topk::x, awww.x, SGH-1, GH-x"
    old_reason = 'reason: "single-shape register kernel; kept out of the bundle'
    new = tmp_path / "new.yaml"
    new.write_text(DEFAULT_TEXT.replace(old_reason, 'reason: ":rocket: see https://x.invalid and www.x.invalid; '
                                                    'kept out of the bundle'))
    md = topkgen("diff", DEFAULT_POLICY, new, "--format", "markdown").stdout
    assert f":{zw}rocket: see https:{zw}//x.invalid and www{zw}.x.invalid; kept out" in md
    assert ":rocket:" not in md and "https://" not in md and "www." not in md


def test_a_side_s_label_is_shown_on_one_line_escaped(tmp_path):
    """A label is the name the command line gave: a file name holding a line break ended the
    markdown heading and started a table row; the text report printed it raw too (and a
    terminal's escape sequence with it). Both show it escaped, as messages show paths; the
    json holds it as given."""
    odd = tmp_path / "new\n| x | y |\n\x1b[2J.yaml"
    shutil.copy(DEFAULT_POLICY, odd)
    md = topkgen("diff", odd, DEFAULT_POLICY, "--format", "markdown", "--stat", cwd=tmp_path)
    assert md.returncode == 0, md.stderr
    assert md.stdout.splitlines()[0].startswith("### topkgen diff `")
    assert "new\\n| x | y |\\n\\x1b[2J.yaml` → `" in md.stdout.splitlines()[0]
    text = topkgen("diff", odd, DEFAULT_POLICY, "--stat", cwd=tmp_path).stdout
    assert text.splitlines()[0] == f"topkgen diff {tmp_path}/new\\n| x | y |\\n\\x1b[2J.yaml -> {DEFAULT_POLICY}"
    assert "\x1b" not in text
    assert json.loads(topkgen("diff", odd, DEFAULT_POLICY, "--format", "json").stdout)["old"]["label"] == str(odd)


def test_legacy_against_default_in_markdown_is_review_sized():
    proc = topkgen("diff", LEGACY_POLICY, DEFAULT_POLICY, "--format", "markdown")
    assert proc.returncode == 1
    md = proc.stdout
    assert len(md) < 60_000
    summary, _, details = md.partition("<details>")
    assert summary.startswith("### topkgen diff `") and "| sm_90 | 48 | 29 | -19 |" in summary
    assert "- **Kernels**: 58 added, 96 removed, 0 changed" in summary and "- **Dispatch**: " in summary
    # added, removed, JIT kernels changed in source (the knobs differ), tiers +/-, dispatch
    assert md.count("<details>") == md.count("</details>") == 6
    stat = topkgen("diff", LEGACY_POLICY, DEFAULT_POLICY, "--format", "markdown", "--stat")
    assert stat.stdout == summary.rstrip("\n") + "\n"


def test_markdown_folds_and_counts_what_it_leaves_out(legacy_policy, default_policy):
    from topkgen import diff
    from topkgen.diff.sides import _rendered_side
    from topkgen.diff import report as diff_report
    from topkgen.build.sources import installed_templates

    sides = [_rendered_side(name, "policy", "policy file", p, installed_templates())
             for name, p in (("legacy", legacy_policy), ("default", default_policy))]
    report = diff.compare(*sides)
    full = diff_report.to_markdown(report, limit=10**9)
    assert "left out" not in full
    rows = full.count("\n- `") + full.count("\n| `") + full.count("\n| sm_")
    for limit in (3_000, 8_000, 20_000):
        md = diff_report.to_markdown(report, limit=limit)
        assert len(md) < limit and md.startswith(full.partition("<details>")[0])
        shown = md.count("\n- `") + md.count("\n| `") + md.count("\n| sm_")
        left = int(re.search(r"_(\d+) rows left out to stay under", md).group(1))
        assert shown + left == rows
        assert md.count("<details>") == md.count("</details>")


def test_stat_quiet_and_colour(repo):
    stat = topkgen("diff", "v1", "HEAD", "--stat", cwd=repo)
    assert stat.returncode == 1 and stat.stdout.rstrip().endswith("differ")
    assert "kernels changed (" not in stat.stdout and "kernels: 0 added, 0 removed, 4 changed" in stat.stdout
    quiet = topkgen("diff", "v1", "HEAD", "--quiet", cwd=repo)
    assert quiet.returncode == 1 and quiet.stdout == quiet.stderr == ""
    assert topkgen("diff", "HEAD", "HEAD", "-q", cwd=repo).returncode == 0
    assert "\x1b[" not in topkgen("diff", "v1", "HEAD", cwd=repo).stdout  # not a terminal
    bad = topkgen("diff", "v1", "HEAD", "--stat", "--format", "json", cwd=repo)
    assert bad.returncode == 2 and "--stat" in bad.stderr

    status, shown = on_terminal("diff", "v1", "HEAD", env=ENV, cwd=repo)
    assert status == 1 and "\x1b[" in shown, shown
    status, shown = on_terminal("diff", "v1", "HEAD", env={**ENV, "NO_COLOR": "1"}, cwd=repo)
    assert status == 1 and "\x1b[" not in shown, shown


# ----------------------------------------------------------------------------- trouble: exit 2

@pytest.mark.parametrize("suffix", ["yaml", "json"])
def test_workload_file(repo, suffix):
    shapes = [{"arch": "sm_90", "dtype": "float32", "k": 32, "n": 256},
              {"arch": "sm_90", "dtype": "bfloat16", "k": 20, "n": 256, "deterministic": True},
              {"arch": "sm_100", "dtype": "float32", "k": 5, "n": 100},
              {"arch": "sm_90", "dtype": "fp32", "k": 32, "n": 256}]  # the first again: counted once
    path = repo / f"shapes.{suffix}"
    path.write_text(json.dumps(shapes) if suffix == "json" else
                    "".join(f"- {json.dumps(s)}\n" for s in shapes))
    proc = topkgen("diff", "HEAD~1", "HEAD", "--shapes", path, cwd=repo)
    assert proc.returncode == 1
    assert "dispatch: 2 of 3 shapes change: 2 jit -> aot" in proc.stdout
    assert ("sm_90 float32 fast: topk_register_n256_k32_det_f32_sm_90 (jit) -> "
            "topk_radix_fv2_k64_det_f32_sm_90 (aot)  [jit -> aot]  1 shape(s): k=32 n=256") in proc.stdout


@pytest.mark.parametrize("entry,message", [
    ({"arch": "sm_90", "dtype": "float32", "k": 5}, "shape #2: missing 'n'"),
    ({"arch": "sm_90", "dtype": "float32", "k": 50, "n": 5}, "shape #2: k: must be <= n"),
    ({"arch": "sm_90", "dtype": "float64", "k": 5, "n": 50}, "shape #2: dtype: 'float64' is in neither side"),
    ({"arch": "sm_75", "dtype": "float32", "k": 5, "n": 50}, "shape #2: arch: 'sm_75' is in neither side"),
    ({"arch": "sm_90", "dtype": "float32", "k": "5", "n": 50}, "shape #2: k: expected an integer"),
    ({"arch": "sm_90", "dtype": "float32", "k": 5, "n": 50, "batch": 3}, "shape #2: unknown key(s) batch"),
    # values in the file's words: it said True, None, [5] (Python's)
    ({"arch": "sm_90", "dtype": "float32", "k": 5, "n": 50, "rows": True},
     "shape #2: rows: expected an integer in 0..2147483647, got true"),
    ({"arch": "sm_90", "dtype": "float32", "k": 5, "n": 50, "deterministic": None},
     "shape #2: deterministic: expected true or false, got null"),
    ({"arch": "sm_90", "dtype": "float32", "k": [5], "n": 50}, "shape #2: k: expected an integer, got a list"),
])
def test_bad_workload_entries(repo, entry, message):
    path = repo / "bad.json"
    path.write_text(json.dumps([{"arch": "sm_90", "dtype": "float32", "k": 1, "n": 8}, entry]))
    proc = topkgen("diff", "HEAD~1", "HEAD", "--shapes", path, cwd=repo)
    assert proc.returncode == 2 and proc.stdout == ""
    assert f"bad.json: {message}" in proc.stderr


def test_workload_files_name_the_line_take_dtype_spellings_and_json_errors_are_json(repo):
    path = repo / "shapes.yaml"
    path.write_text("- {arch: sm_90, dtype: fp32, k: 32, n: 256}\n"
                    "- {arch: sm_90, dtype: bf16, k: 4, n: 1000, rows: 2}\n"
                    "- {arch: sm_90, dtype: float32, k: 5}\n")
    proc = topkgen("diff", "HEAD~1", "HEAD", "--shapes", path, cwd=repo)
    assert proc.returncode == 2 and "shapes.yaml:3: shape #3: missing 'n'" in proc.stderr
    path.write_text("\n".join(path.read_text().splitlines()[:2]) + "\n")
    proc = topkgen("diff", "HEAD~1", "HEAD", "--shapes", path, cwd=repo)
    assert proc.returncode == 1 and "dispatch: 1 of 2 shapes change" in proc.stdout, proc.stderr
    # What only the sides can refuse names the line too (it named the file alone).
    for entry, problem in (("{arch: sm_90, dtype: fp32, k: 5, n: 4}", "k: must be <= n, got k=5 > n=4"),
                           ("{arch: sm_80, dtype: fp32, k: 5, n: 40}", "arch: 'sm_80' is in neither side's policy")):
        path.write_text(f"- {{arch: sm_90, dtype: fp32, k: 32, n: 256}}\n\n- {entry}\n")
        proc = topkgen("diff", "HEAD~1", "HEAD", "--shapes", path, cwd=repo)
        assert (proc.returncode, proc.stderr) == (2, f"topkgen: error: {path}:3: shape #2: {problem}\n")
    broken = repo / "shapes.json"
    broken.write_text('[{"arch": "sm_90",}]')
    proc = topkgen("diff", "HEAD~1", "HEAD", "--shapes", broken, cwd=repo)
    assert proc.returncode == 2 and "shapes.json:1:" in proc.stderr and "YAML" not in proc.stderr, proc.stderr


def test_bad_sides(repo, tmp_path):
    proc = topkgen("diff", "no-such-rev", "HEAD", cwd=repo)
    assert proc.returncode == 2 and "no-such-rev: not a file, directory or git revision" in proc.stderr
    proc = topkgen("diff", "HEAD", "missing.yaml", cwd=repo)
    assert proc.returncode == 2 and "missing.yaml: not a file, directory or git revision" in proc.stderr
    proc = topkgen("diff", "HEAD", "--policy", "policies/none.yaml", "v1", cwd=repo)
    assert proc.returncode == 2 and "HEAD: no policies/none.yaml at that revision" in proc.stderr
    (repo / "policies" / "topk.yaml").write_text(CHANGED.replace("threads: 256", "threads: 300", 1))
    git(repo, "commit", "-q", "-am", "bad threads")
    proc = topkgen("diff", "HEAD~1", "HEAD", cwd=repo)
    assert proc.returncode == 2
    assert "HEAD:policies/topk.yaml:10:14: archs.sm_90.threads: 300 is not one of" in proc.stderr
    outside = topkgen("diff", "HEAD~1", "HEAD", cwd=tmp_path)
    assert outside.returncode == 2 and "not inside a git repository" in outside.stderr


def peak_rss_mib(*args, cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    """`topkgen ARGS` and the largest resident set of it or any process it ran, in MiB."""
    probe = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
             "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); print(p.stderr, end='')")
    proc = subprocess.run([sys.executable, "-c", probe, *TOPKGEN, *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=ENV, check=True)
    status, rss = proc.stdout.split("\n", 1)[0].split()
    return subprocess.CompletedProcess(args, int(status), "", proc.stdout.split("\n", 1)[1]), int(rss) / 1024


def test_a_revision_s_files_over_their_limit_are_refused_unread(repo):
    """From the size git lists: a 96 MiB policy is never held in memory to be refused."""
    (repo / "policies" / "topk.yaml").write_bytes(b"#" * (96 << 20))
    git(repo, "commit", "-q", "-am", "a policy far over the limit")
    proc, rss = peak_rss_mib("diff", "v1", "HEAD", "--stat", cwd=repo)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"topkgen: error: HEAD:policies/topk.yaml: larger than 1048576 bytes ({96 << 20}); not read\n"
    assert rss < 96, f"{rss:.0f} MiB: the blob was read"
    # A template too, in a revision and in the working tree.
    git(repo, "checkout", "-q", "v1")
    (repo / "templates" / "huge.cuh").write_bytes(b"/" * ((1 << 20) + 1))
    proc = topkgen("diff", "HEAD", "--stat", cwd=repo)
    assert proc.returncode == 2 and proc.stderr.endswith(
        f"error: templates/huge.cuh: larger than 1048576 bytes ({(1 << 20) + 1}); not read\n"), proc.stderr
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "a template over the limit")
    proc = topkgen("diff", "v1", "HEAD", "--stat", cwd=repo)
    assert proc.returncode == 2 and proc.stderr.endswith(
        f"error: HEAD:templates/huge.cuh: larger than 1048576 bytes ({(1 << 20) + 1}); not read\n"), proc.stderr


def test_a_revision_s_policy_that_is_a_symbolic_link_is_named_as_one(repo):
    policies = repo / "policies"
    (policies / "topk.yaml").rename(policies / "real.yaml")
    (policies / "topk.yaml").symlink_to("real.yaml")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "the policy is a link")
    proc = topkgen("diff", "v1", "HEAD", "--stat", cwd=repo)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == ("topkgen: error: HEAD:policies/topk.yaml: a symbolic link at that revision (to real.yaml); "
                           "diff reads a revision's regular files only\n")
    assert topkgen("diff", "HEAD", "--policy", "policies/real.yaml", "--stat", cwd=repo).returncode == 0
    # templates/ as a link is not a folder of no templates (the installed ones would render it).
    (repo / "templates").rename(repo / "real-templates")
    (repo / "templates").symlink_to("real-templates")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "the templates are a link")
    proc = topkgen("diff", "HEAD", "--policy", "policies/real.yaml", "--stat", cwd=repo)
    assert proc.returncode == 2 and proc.stderr == ("topkgen: error: HEAD:templates: a symbolic link at that revision "
                                                    "(to real-templates); diff reads a revision's regular files only\n")


@pytest.mark.parametrize("name,content,message", [
    ("radix_select.cu.j2", b"{% if %}\n", "HEAD:templates/radix_select.cu.j2:1: "),
    ("topk_common.cuh", b"\xff\xfe not text\n", "HEAD:templates/topk_common.cuh: not UTF-8 text (byte 0)"),
    ("radix_select.cu.j2", b"{{ no_such_value }}\n", "HEAD:templates/: cannot render kernel topk_radix_"),
    ("radix_select.cu.j2", b"{{ no_such_value }}\n", "'no_such_value' is undefined; these templates expect values "
                                                      "this topkgen does not provide (written for another version?)"),
    ("radix_select.cu.j2", b'{% include "gone.cuh" %}\n', "HEAD:templates/: no template 'gone.cuh'"),
    # A branch under review must not run code on the reviewer's machine, nor loop for hours.
    ("radix_select.cu.j2", b"{{ cycler.__init__.__globals__.os.system('touch PWNED') }}\n",
     "access to attribute '__init__' of 'type' object is unsafe"),
    ("radix_select.cu.j2", b"{{ lipsum.__globals__['os'].system('touch PWNED') }}\n",
     "access to attribute '__globals__' of 'function' object is unsafe"),
    ("radix_select.cu.j2", b"{% for i in range(100000000) %}{% endfor %}\n",
     "range() of 100000000 items: templates may loop over at most 4096"),
])
def test_a_revision_whose_templates_do_not_render(repo, name, content, message):
    (repo / "templates" / name).write_bytes(content)
    git(repo, "commit", "-q", "-am", "break a template")
    proc = topkgen("diff", "HEAD~1", "HEAD", cwd=repo)
    assert proc.returncode == 2 and proc.stdout == ""
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert not (repo / "PWNED").exists()


def test_a_template_file_name_that_is_not_utf8_is_refused_by_name(repo):
    """Git and the file system give such a name as lone surrogates; no template can include
    it, and it is named in the message with its byte escaped, in a revision or a checkout."""
    (repo / "templates" / os.fsdecode(b"bad\xffname.cuh")).write_bytes(b"x\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "a file name that is not UTF-8")
    for args, where in ((("v1", "HEAD"), "HEAD:templates/"), (("v1",), "templates/")):
        proc = topkgen("diff", *args, "--stat", cwd=repo)
        assert proc.returncode == 2 and proc.stdout == "", proc.stderr
        assert proc.stderr == (f"topkgen: error: {where}bad\\xffname.cuh: the file name is not UTF-8 "
                               f"(templates are named in UTF-8)\n")


def schema_1(manifest: dict) -> dict:
    """A manifest as topkgen wrote it before schema 2: no dispatch table, no JIT sources, no
    `serves` (nor anything later, such as schema 6's launch.shared_bytes)."""
    old = {k: v for k, v in manifest.items() if k not in ("dispatch", "jit_kernels", "toolchain", "options",
                                                               "split_rules", "load_order")}
    old["schema_version"] = 1
    old["kernels"] = [{k: v for k, v in e.items() if k not in ("serves", "cache_key", "loads_in_flight")}
                      for e in manifest["kernels"]]
    for e in old["kernels"]:  # schema 6's launch keys
        e["launch"] = {k: v for k, v in e["launch"].items() if k not in ("shared_buffer_bytes", "shared_bytes")}
    jsonschema.validate(old, load_schema("manifest-1.schema.json"))
    return old


def test_schema_1_manifests_are_still_read(bundles, tmp_path):
    manifest = json.loads((bundles / "full" / "manifest.json").read_text())
    (tmp_path / "v1.json").write_text(json.dumps(schema_1(manifest)))
    (tmp_path / "v1-copy.json").write_text(json.dumps(schema_1(manifest)))
    proc = topkgen("diff", tmp_path / "v1.json", tmp_path / "v1-copy.json")
    assert proc.returncode == 0 and proc.stdout.endswith("same\n"), proc.stderr
    # Any two sides compare: a schema-1 manifest against the schema-2 bundle it came from.
    proc = topkgen("diff", tmp_path / "v1.json", bundles / "full", "--stat")
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stderr
    assert "dispatch: 0 of" in proc.stdout


def test_a_policy_side_may_be_a_pipe(tmp_path):
    """`topkgen diff <(git show main:policies/topk.yaml) policies/topk.yaml`: the shell hands
    over /dev/fd/N, a pipe, which diff took for a revision ("not a file or directory")."""
    edited, count = re.subn(r"rows_below: \d+", "rows_below: 48", DEFAULT_POLICY.read_text(), count=1)
    assert count == 1
    (tmp_path / "edited.yaml").write_text(edited)
    script = f'exec "$@" <(cat "{DEFAULT_POLICY}") "{{new}}" --stat'
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for new, status, verdict in ((DEFAULT_POLICY, 0, "same"), (tmp_path / "edited.yaml", 1, "differ")):
        proc = subprocess.run(["bash", "-c", script.format(new=new), "bash", *TOPKGEN, "diff"],
                              capture_output=True, text=True, env=env)
        assert (proc.returncode, proc.stderr) == (status, ""), proc.stderr
        assert re.match(r"topkgen diff /dev/fd/\d+ -> ", proc.stdout) and verdict in proc.stdout, proc.stdout


def test_a_parameter_change_is_worded_by_name():
    """What a loader must change: names added and removed, else the order or the C types."""
    from topkgen.diff.report import change_text

    x, n = {"name": "x", "ctype": "const float*"}, {"name": "n", "ctype": "int"}

    def text(old, new):
        return change_text({"changes": {"params": {"old": old, "new": new}}, "templates": None})
    assert text([x], [x, n]) == "params +n" and text([x, n], [x]) == "params -n"
    assert text([x, n], [n, x]) == "params reordered"
    assert text([x, n], [x, {"name": "n", "ctype": "long long"}]) == "params retyped"
