"""Forward compatibility as policy data (issue 31 point 2): `ship_ptx` ships each AOT kernel's
PTX (compute_XY) beside its cubin, and `arch_specific` compiles an arch's cubins for its
arch-specific target (NVRTC 13 spells it sm_100a: --gpu-architecture=sm_100a). Built for real
with NVRTC; the manifest says which entries carry PTX and which targets are arch-specific; both
loaders check the PTX at load and take it (Python on the emulator, C++ by its load order) for a
GPU no cubin runs on; an arch-specific cubin serves exactly its arch."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from topkgen import policy as pol
from topkgen.build.compile import cache_key
from topkgen.build.render import render
from topkgen.manifest import reading as manifests
from topkgen.runtime import TopK, TopKError, reference
from topkgen.runtime.binary import resolve_manifest

from ..support.cpp import cpp_binary
from ..support.tiny import TINY_POLICY

SM90 = TINY_POLICY[TINY_POLICY.index("  sm_90:"):TINY_POLICY.index("dtypes:")]
FORWARD_POLICY = TINY_POLICY.replace(
    SM90, SM90 + "    ship_ptx: true\n" + SM90.replace("sm_90", "sm_100").replace("[9, 0]", "[10, 0]")
    + "    arch_specific: true\n")


@pytest.fixture(scope="module")
def forward_bundle(tmp_path_factory):
    root = tmp_path_factory.mktemp("forward")
    (root / "forward.yaml").write_text(FORWARD_POLICY)
    out = root / "out"
    proc = subprocess.run([sys.executable, "-m", "topkgen", "build", "--policy", root / "forward.yaml", "--out", out,
                           "-j", "2"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return out


def test_the_manifest_says_which_entries_are_ptx_and_which_targets_arch_specific(forward_bundle):
    policy = pol.loads(FORWARD_POLICY.encode())
    manifest, _ = manifests.load_manifest(forward_bundle)
    order = manifest["load_order"]
    assert order["ptx_archs"] == [a for a, t in policy.archs.items() if t.ship_ptx] == ["sm_90"]
    assert order["targets"] == {"sm_90": "sm_90", "sm_100": "sm_100a"}
    for entry in manifest["kernels"]:
        if entry["arch"] == "sm_90":
            ptx = (forward_bundle / entry["ptx"]["path"]).read_bytes()
            assert entry["ptx"]["path"] == f"sm_90/{entry['name']}.ptx" and len(ptx) == entry["ptx"]["size_bytes"]
            assert b".target sm_90" in ptx and f".entry {entry['symbol']}(".encode() in ptx
        else:  # compiled for sm_100a: the cache key is that target's, not sm_100's
            assert "ptx" not in entry
            spec = next(s for s in pol.plan(policy, "sm_100") if s.name == entry["name"])
            source = render(spec)
            assert entry["cache_key"] == cache_key(source, spec.name, "sm_100a", manifest["toolchain"])
            assert entry["cache_key"] != cache_key(source, spec.name, "sm_100", manifest["toolchain"])
    jit_options = {j["arch"]: j["nvrtc_options"][0] for j in manifest["jit_kernels"]}
    assert jit_options.get("sm_100", "--gpu-architecture=sm_100a") == "--gpu-architecture=sm_100a"
    ptx_on_disk = sum(f.stat().st_size for f in (forward_bundle / "sm_90").glob("*.ptx"))
    proc = subprocess.run([sys.executable, "-m", "topkgen", "show", forward_bundle, "--format", "json"],
                          capture_output=True, text=True)
    sizes = json.loads(proc.stdout)["sizes"]["archs"]
    assert (sizes["sm_90"]["ptx_bytes"], sizes["sm_100"]["ptx_bytes"]) == (ptx_on_disk, 0) and ptx_on_disk > 0
    files = manifests.read_files(forward_bundle, manifest)
    assert sorted(n for n in files if n.endswith(".ptx")) == sorted(
        f"{e['name']}.ptx" for e in manifest["kernels"] if e["arch"] == "sm_90")


def test_a_gpu_no_cubin_runs_on_takes_the_ptx_on_both_loaders(cpp, forward_bundle):
    """sm_103 (major 10): sm_100's cubins are arch-specific, so sm_90's PTX serves it; the
    emulator runs those kernels and they agree with the reference."""
    for gpu in ("sm_103", "sm_110", "sm_120"):
        op = TopK(forward_bundle, backend="emulator", gpu_arch=gpu)
        assert (op.binary.way, op.arch) == ("ptx", "sm_90"), op.binary
        manifest, _ = manifests.load_manifest(forward_bundle)
        b = resolve_manifest(gpu, manifest, jit=False)
        assert cpp_binary(cpp, forward_bundle, gpu, False) == (b.way, b.arch, b.words)
    x = np.random.default_rng(3).standard_normal((3, 5000)).astype(np.float32)
    values, indices = op(x, 50, deterministic=True)
    ref_values, ref_indices = reference.topk(x, 50)
    np.testing.assert_array_equal(indices, ref_indices)
    np.testing.assert_array_equal(values, ref_values)
    assert "the sm_90 kernels' PTX (compute_90)" in op.explain("float32", 50, 5000).reason


def test_an_arch_specific_cubin_serves_exactly_its_arch(cpp, forward_bundle):
    op = TopK(forward_bundle, backend="emulator", gpu_arch="sm_100")
    assert (op.binary.way, op.arch) == ("cubin", "sm_100")
    assert "arch-specific sm_100a: this arch only" in op.binary.words
    assert cpp_binary(cpp, forward_bundle, "sm_100", False)[2] == op.binary.words
    with pytest.raises(TopKError, match=r"no binary of the bundle serves this GPU \(sm_89\)"):
        TopK(forward_bundle, backend="emulator", gpu_arch="sm_89")  # PTX runs forward only


def test_both_loaders_refuse_a_tampered_ptx_alike(cpp, forward_bundle, tmp_path):
    root = tmp_path / "bundle"
    shutil.copytree(forward_bundle, root)
    manifest = json.loads((root / "manifest.json").read_text())
    path = manifest["kernels"][0]["ptx"]["path"]
    (root / path).write_bytes((root / path).read_bytes() + b"// more\n")
    with pytest.raises(manifests.ManifestError) as err:
        manifests.read_files(root, manifests.load_manifest(root)[0])
    assert str(err.value) == f"{root}/manifest.json: kernels[0].ptx.sha256: {path} does not match its sha256 in the manifest"
    proc = subprocess.run([cpp, "verify", root], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr == f"topkgen-cpp: error: {err.value}\n"


@pytest.mark.parametrize("edit, key, words", [
    ("    arch_specific: true\n", "arch_specific", "sm_80 has no arch-specific target"),
    ("    arch_specific: true\n    ship_ptx: true\n", "ship_ptx", "their PTX would run on sm_90 only"),
])
def test_the_policy_refuses_what_has_no_target(edit, key, words):
    text = TINY_POLICY.replace(SM90, SM90 + edit)
    if "sm_80" in words:
        text = text.replace("sm_90", "sm_80").replace("[9, 0]", "[8, 0]")
    with pytest.raises(pol.PolicyError) as err:
        pol.loads(text.encode())
    assert err.value.key.endswith(key) and words in err.value.message


def test_per_arch_bundles_with_ptx_merge_into_the_full_build(forward_bundle, tmp_path):
    (tmp_path / "forward.yaml").write_text(FORWARD_POLICY)
    parts = []
    for arch in ("sm_90", "sm_100"):
        out = tmp_path / arch
        proc = subprocess.run([sys.executable, "-m", "topkgen", "build", "--policy", tmp_path / "forward.yaml",
                               "--arch", arch, "--out", out], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        parts.append(out)
    proc = subprocess.run([sys.executable, "-m", "topkgen", "merge", *parts, "--out", tmp_path / "merged"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    whole = {p.relative_to(forward_bundle): p.read_bytes() for p in forward_bundle.rglob("*") if p.is_file()}
    merged = {p.relative_to(tmp_path / "merged"): p.read_bytes() for p in (tmp_path / "merged").rglob("*") if p.is_file()}
    assert any(str(p).endswith(".ptx") for p in whole)
    assert whole.keys() == merged.keys()
    assert [p for p in whole if whole[p] != merged[p]] == []  # byte-identical, manifest included
