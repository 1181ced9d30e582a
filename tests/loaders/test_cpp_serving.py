"""The C++ loader serving a GPU the policy did not describe exactly (manifest schema 5), against
the Python side: split plans for the GPU's own SM count (split_rules) equal
topkgen.policy.select's on the policy retuned for that count (what TopK(sm_count=) and
`explain --sm-count` use), over a grid of SM counts and shapes; and the load order
(load_order) gives the same binary in the same words as topkgen.runtime.binary for every
arch topkgen knows, JIT on and off."""

from __future__ import annotations

import random

import pytest

from topkgen import policy as pol
from topkgen.manifest import reading as manifests
from topkgen.policy import dispatch_table
from topkgen.policy.split import ROWS_MAX
from topkgen.runtime.binary import NoBinaryError, resolve_manifest

from ..support.cpp import cpp_binary, cpp_select, python_select


def _sm_counts(policy: pol.Policy) -> list[int]:
    """Common parts' SM counts (H20 78, H100 PCIe 114, H800 and H100 SXM 132, B200 148) and the
    extremes, beside each policy arch's own."""
    own = {t.split.sm_count for t in policy.archs.values() if t.split is not None}
    return sorted({1, 2, 7, 20, 78, 114, 132, 148, 170, 1024} | own | {c + 1 for c in own} | {c - 1 for c in own})


def _split_shapes(policy: pol.Policy, seed: int) -> list[tuple]:
    """Shapes where a split may happen: the boundary grid's k and n where the arch splits rows,
    each with the rows breakpoints of this SM count and beside them, and random small batches."""
    rng = random.Random(seed)
    shapes = []
    for arch, tuning in policy.archs.items():
        if tuning.split is None:
            continue
        for dtype in policy.dtypes:
            ks, ns, rs = dispatch_table.boundary_grid(policy, arch, dtype)
            ns = [n for n in ns if n >= tuning.split.min_n - 1]
            ks = rng.sample(ks, min(len(ks), 12))
            for k in ks:
                for n in rng.sample(ns, min(len(ns), 8)) + [max(k, tuning.split.min_n)]:
                    if n >= k:
                        for rows in {1, *rs[:40], rng.randint(1, tuning.split.rows_below), ROWS_MAX}:
                            det = rng.random() < 0.5
                            shapes += [(arch, dtype, k, n, det, True, rows), (arch, dtype, k, n, det, False, rows)]
    return shapes


def test_cpp_plans_splits_for_the_gpus_sm_count_as_select_does(cpp, built_bundle, default_policy):
    compared = split = differ = 0
    for i, sm_count in enumerate(_sm_counts(default_policy)):
        retuned = default_policy
        for arch in default_policy.archs:
            retuned = retuned.with_sm_count(arch, sm_count)
        shapes = _split_shapes(retuned, seed=i)
        got = cpp_select(cpp, built_bundle, shapes, sm_count=sm_count)
        expect = [python_select(retuned, s) for s in shapes]
        mismatches = [(s, g, e) for s, g, e in zip(shapes, got, expect) if g != e]
        assert len(got) == len(shapes) and not mismatches, (sm_count, mismatches[:5])
        table = [python_select(default_policy, s) for s in shapes]
        compared += len(shapes)
        split += sum(1 for e in expect if not e.startswith("error:") and e.split()[1] != "1")
        differ += sum(1 for e, t in zip(expect, table) if e != t)
    print(f"C++ == select for {len(_sm_counts(default_policy))} SM counts: {compared} split plans, {split} split, "
          f"{differ} differ from the policy's own SM count's plan, 0 mismatches")
    assert split and differ  # the grid reaches splits, and SM counts that change them


def test_cpp_sm_count_is_checked(cpp, built_bundle):
    import subprocess

    for bad in ("0", "1025", "x", "-3"):
        proc = subprocess.run([cpp, "select", built_bundle, "--sm-count", bad], input="", capture_output=True, text=True)
        assert proc.returncode == 2
        assert proc.stderr == f"topkgen-cpp: error: --sm-count: expected a whole number in 1..1024, got '{bad}'\n"


@pytest.mark.parametrize("jit", [True, False])
def test_both_loaders_take_the_same_binary_for_every_known_gpu(cpp, built_bundle, jit):
    manifest, _ = manifests.load_manifest(built_bundle)
    ways = set()
    for gpu in [*pol.SHARED_BYTES_PER_BLOCK, "sm_130"]:  # sm_130: an arch topkgen does not know yet
        try:
            b = resolve_manifest(gpu, manifest, jit=jit)
            expect = (b.way, b.arch, b.words)
        except NoBinaryError as err:
            expect = str(err)
        assert cpp_binary(cpp, built_bundle, gpu, jit) == expect, gpu
        ways.add(expect[0] if isinstance(expect, tuple) else "refused")
    assert ways == ({"cubin", "lower-minor cubin", "jit", "refused"} if jit else {"cubin", "lower-minor cubin", "refused"})


def _edited_copy(built_bundle, tmp_path, edit):
    import json
    import shutil

    root = tmp_path / "bundle"
    shutil.copytree(built_bundle, root)
    doc = json.loads((root / "manifest.json").read_text())
    edit(doc)
    (root / "manifest.json").write_text(json.dumps(doc, indent=2))
    return root


def _ptx_and_arch_specific(doc):
    doc["load_order"]["targets"]["sm_100"] = "sm_100a"
    doc["load_order"]["ptx_archs"] = ["sm_90"]


def test_both_loaders_agree_on_ptx_and_arch_specific_targets(cpp, built_bundle, tmp_path):
    """A bundle whose sm_100 cubins are arch-specific (sm_100a) and whose sm_90 kernels ship PTX:
    sm_103 gets no sm_100 cubin but sm_90's PTX; sm_89 nothing without JIT."""
    root = _edited_copy(built_bundle, tmp_path, _ptx_and_arch_specific)
    manifest, _ = manifests.load_manifest(root)
    seen = {}
    for jit in (True, False):
        for gpu in [*pol.SHARED_BYTES_PER_BLOCK, "sm_130"]:
            try:
                b = resolve_manifest(gpu, manifest, jit=jit)
                expect = (b.way, b.arch, b.words)
            except NoBinaryError as err:
                expect = str(err)
            assert cpp_binary(cpp, root, gpu, jit) == expect, (gpu, jit)
            seen[gpu, jit] = expect
    way, arch, words = seen["sm_103", False]
    assert (way, arch) == ("ptx", "sm_90")
    assert words.startswith("sm_103 GPU: no cubin runs on it (sm_100 cubins are arch-specific (sm_100a): they run on "
                            "sm_100 only); the sm_90 kernels' PTX (compute_90), compiled for sm_103 by the driver's JIT")
    assert seen["sm_100", False][2] == "sm_100 GPU: the bundle's sm_100 cubins (arch-specific sm_100a: this arch only)"
    assert "no PTX in the bundle for an arch at or below sm_89" in seen["sm_89", False]


@pytest.mark.parametrize("edit, words", [
    (lambda d: d["split_rules"].pop("sm_100"), "split_rules: has sm_90, not the bundle's archs (sm_100, sm_90)"),
    (lambda d: d["load_order"]["targets"].update(sm_130="sm_130"),
     "load_order.targets: has sm_100, sm_130, sm_90, not the bundle's archs (sm_100, sm_90)"),
    (lambda d: d["load_order"]["targets"].update(sm_90="sm_100a"), "load_order.targets.sm_90: 'sm_100a' must be sm_90 or sm_90a"),
    (lambda d: d["load_order"].update(ptx_archs=["sm_86"]), "load_order.ptx_archs[0]: sm_86 is not one of the bundle's archs"),
])
def test_both_loaders_refuse_serving_data_of_other_archs_alike(cpp, built_bundle, tmp_path, edit, words):
    import subprocess

    root = _edited_copy(built_bundle, tmp_path, edit)
    with pytest.raises(manifests.ManifestError) as err:
        manifests.load_manifest(root)
    proc = subprocess.run([cpp, "verify", root], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr == f"topkgen-cpp: error: {err.value}\n"
    assert str(err.value) == f"{root}/manifest.json: {words}"
