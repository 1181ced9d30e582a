"""The policy: kernel sets, JIT-only tiers, dispatch, and import isolation."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topkgen import policy as pol
from topkgen.common.schema import load_schema

from ..conftest import DEFAULT_POLICY, LEGACY_POLICY, ROOT

ARCHS = ("sm_90", "sm_100")
DTYPES = ("float32", "bfloat16", "float16")


def test_default_plan_has_29_kernels_per_arch(default_policy):
    counts = {arch: len(pol.plan(default_policy, arch)) for arch in ARCHS}
    assert counts == {"sm_90": 29, "sm_100": 29}


def test_default_plan_matches_the_kernel_table(default_policy):
    for arch in ARCHS:
        table = Counter((s.family, s.work_rung, s.k, s.mode, s.dtype) for s in pol.plan(default_policy, arch))
        expected = Counter()
        for dt in ("float32", "bfloat16"):
            expected[("register", "ladder", 16, "deterministic", dt)] += 1
            for k in (64, 128, 256, 512, 1024):
                for mode in ("fast", "deterministic"):
                    expected[("radix", "dynamic", k, mode, dt)] += 1
            for k in (64, 128, 256):
                expected[("radix", "fixed_vec=2", k, "deterministic", dt)] += 1
        expected[("radix", "fixed_vec=8", 512, "deterministic", "float32")] += 1
        assert table == expected


def test_launch_bounds_and_tail_policy_come_from_the_arch(default_policy):
    for arch, tail in (("sm_90", ("fixed", 4)), ("sm_100", ("runtime", None))):
        for spec in pol.plan(default_policy, arch):
            # every radix rung (K=64 to 1024) runs 128 threads (threads_by_k), bounded to 5 CTAs
            # an SM (at most 102 registers); the register kernels have no bound
            radix = spec.family == "radix"
            assert spec.min_ctas_per_sm == (5 if radix else 1)
            assert (spec.tail_policy, spec.tail_max_iterations) == tail
            if radix:
                assert spec.threads == 128


def test_legacy_plan_is_the_old_48_point_grid(legacy_policy):
    for arch in ARCHS:
        specs = pol.plan(legacy_policy, arch)
        assert len(specs) == 48
        grid = {(s.dtype, s.exact_n, s.k, s.mode) for s in specs}
        assert grid == {(d, n, k, m) for d in ("float32", "bfloat16") for n in (2048, 4096, 8192, 16384)
                        for k in (64, 128, 256) for m in ("fast", "deterministic")}


def test_kernel_names_are_unique_stable_and_encode_parameters(default_policy, legacy_policy):
    for policy in (default_policy, legacy_policy):
        names = [s.name for a in ARCHS for s in pol.plan(policy, a)]
        assert len(names) == len(set(names))
        assert names == [s.name for a in ARCHS for s in pol.plan(pol.load(policy.path), a)]
    spec = next(s for s in pol.plan(default_policy, "sm_100") if s.work == "dynamic" and s.k == 512)
    assert spec.name == "topk_radix_dyn_k512_fast_f32_sm_100"


def test_jit_only_tiers_and_reasons(default_policy):
    tiers = {(r.name, r.k_rungs, r.n_exact, r.archs) for r in default_policy.jit_only_rules()}
    assert tiers == {
        ("reg_exact_k16_n2048", (16,), (2048,), ARCHS),
        ("reg_exact_k32_n256", (32,), (256,), ARCHS),
        ("reg_exact_k16_n1024_sm100", (16,), (1024,), ("sm_100",)),
        ("radix_k2048_k4096", (2048, 4096), (), ARCHS),
    }
    assert "72%" in default_policy.rule("reg_exact_k16_n2048").reason
    assert "10.91%" in default_policy.rule("reg_exact_k16_n1024_sm100").reason
    for arch in ARCHS:
        bundle = {s.name for s in pol.plan(default_policy, arch)}
        assert not bundle & {s.name for s in pol.jit_kernels(default_policy, arch)}


@pytest.mark.parametrize("arch,k,n,rule,source", [
    ("sm_90", 16, 2048, "reg_exact_k16_n2048", "jit"),
    ("sm_100", 16, 2048, "reg_exact_k16_n2048", "jit"),
    ("sm_90", 32, 256, "reg_exact_k32_n256", "jit"),
    ("sm_100", 32, 256, "reg_exact_k32_n256", "jit"),
    ("sm_100", 16, 1024, "reg_exact_k16_n1024_sm100", "jit"),
    ("sm_90", 16, 1024, "reg_ladder", "aot"),
    ("sm_90", 5, 100, "reg_ladder", "aot"),
    ("sm_90", 100, 1000, "radix_small_n", "aot"),
    ("sm_90", 300, 4096, "radix_k512_bounded", "aot"),
    ("sm_90", 300, 4097, "radix_dynamic", "aot"),
])
def test_select_known_shapes(default_policy, arch, k, n, rule, source):
    sel = pol.select(default_policy, arch, "float32", k, n)
    assert (sel.rule, sel.source) == (rule, source)
    assert rule in sel.reason


def test_without_jit_the_exact_tiers_fall_back_to_aot_kernels(default_policy):
    ladder = pol.select(default_policy, "sm_100", "float32", 16, 1024, jit=False)
    assert (ladder.rule, ladder.source) == ("reg_ladder", "aot")
    assert ladder.skipped == ("reg_exact_k16_n1024_sm100",)
    for arch in ARCHS:
        for k, n in ((16, 2048), (32, 256)):
            sel = pol.select(default_policy, arch, "bfloat16", k, n, jit=False)
            assert sel.source == "aot" and sel.kernel.family == "radix"


def test_float16_is_served_by_jit_from_the_same_rules(default_policy):
    sel = pol.select(default_policy, "sm_90", "float16", 10, 500)
    assert sel.source == "jit" and sel.rule == "reg_ladder" and sel.kernel.dtype == "float16"
    with pytest.raises(pol.DispatchError, match="dtype"):
        pol.select(default_policy, "sm_90", "float16", 10, 500, jit=False)


def _boundaries(policy):
    points = {1, 2, pol.N_MAX - 1, pol.N_MAX}
    for arch in ARCHS:
        for rule in policy.rules:
            for dtype in DTYPES:
                for spec in pol.kernels_of_rule(policy, rule, arch, dtype):
                    for b in (spec.n_min, spec.n_max, spec.vector_width, *spec.ladder):
                        points.update({b - 1, b, b + 1})
    return sorted(p for p in points if 1 <= p <= pol.N_MAX)


def _check(sel, k, n, arch, dtype, deterministic):
    spec = sel.kernel
    assert spec.arch == arch and spec.dtype == dtype
    assert spec.k_min <= k <= spec.k and spec.serves_n(n)
    if deterministic:
        assert spec.mode == "deterministic"


def test_total_dispatch_exhaustive_over_k_at_every_boundary(default_policy):
    ns = _boundaries(default_policy)
    for arch in ARCHS:
        for dtype in DTYPES:
            for det in (False, True):
                for n in ns:
                    for k in range(1, min(n, pol.K_COVERED) + 1):
                        sel = pol.select(default_policy, arch, dtype, k, n, deterministic=det)
                        _check(sel, k, n, arch, dtype, det)
                        if dtype != "float16":
                            aot = pol.select(default_policy, arch, dtype, k, n, deterministic=det, jit=False)
                            assert aot.source == "aot"
                            _check(aot, k, n, arch, dtype, det)


@settings(max_examples=400, deadline=None)
@given(arch=st.sampled_from(ARCHS), dtype=st.sampled_from(DTYPES), k=st.integers(1, 1024),
       extra=st.integers(0, pol.N_MAX), det=st.booleans(), jit=st.booleans())
def test_total_dispatch_property(default_policy, arch, dtype, k, extra, det, jit):
    n = min(pol.N_MAX, k + extra)
    if not jit and dtype == "float16":
        return
    sel = pol.select(default_policy, arch, dtype, k, n, deterministic=det, jit=jit)
    _check(sel, k, n, arch, dtype, det)
    assert sel.source == ("jit" if dtype == "float16" or not default_policy.rule(sel.rule).aot else "aot")


@pytest.mark.parametrize("args,word", [
    (("sm_90", "float32", 0, 10), "k"), (("sm_90", "float32", -3, 10), "k"),
    (("sm_90", "float32", 11, 10), "k"), (("sm_90", "float32", 2**31, 2**31 - 1), "k"),
    (("sm_90", "float32", 1, 0), "n"), (("sm_90", "float32", 1, 2**31), "n"),
    (("sm_90", "float64", 1, 10), "dtype"), (("sm_89", "float32", 1, 10), "arch"),
    (("sm_90", "float32", 1.5, 10), "k"),
])
def test_select_rejects_shapes_outside_the_domain(default_policy, args, word):
    with pytest.raises(pol.DispatchError) as err:
        pol.select(default_policy, *args)
    assert str(err.value).startswith(word + ":")


def test_import_loads_no_torch_cuda_or_numpy():
    code = ("import sys, topkgen.policy as p; p.select(p.load(), 'sm_90', 'float32', 5, 100); "
            "bad = [m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'cuda', 'numpy', 'jinja2', 'click', 'jsonschema', 'fastjsonschema')]; "
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_shipped_schemas_agree_with_the_reference_validator(default_policy, legacy_policy, cli):
    import yaml
    schema = load_schema("policy.schema.json")
    jsonschema.Draft202012Validator.check_schema(schema)
    for path in (DEFAULT_POLICY, LEGACY_POLICY):
        jsonschema.validate(yaml.safe_load(path.read_text()), schema)
    plan_schema = load_schema("plan.schema.json")
    jsonschema.Draft202012Validator.check_schema(plan_schema)
    for path in (DEFAULT_POLICY, LEGACY_POLICY):
        doc = json.loads(cli("plan", "--policy", path, "--format", "json").stdout)
        jsonschema.validate(doc, plan_schema)


def test_packaged_policy_is_found_outside_the_checkout(tmp_path):
    # Build and install the wheel into a throwaway target, then load the default policy there.
    wheel_dir, target = tmp_path / "wheel", tmp_path / "site"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                            "-w", str(wheel_dir), str(ROOT)], check=True, capture_output=True, text=True)
    assert "warning" not in (built.stdout + built.stderr).lower()  # e.g. setuptools' "Package would be ignored"
    wheel = next(wheel_dir.glob("topkgen-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                    str(wheel)], check=True, capture_output=True)
    code = ("import topkgen.policy as p, topkgen.build.render as r; "
            "print(p.default_policy_path()); print(len(p.plan(p.load(), 'sm_90'))); print(r.template_dir()); "
            "print(len(r.render(p.plan(p.load(), 'sm_90')[0])))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}, check=True)
    lines = out.stdout.split()
    assert lines[0].startswith(str(target)) and lines[1] == "29" and lines[2].startswith(str(target))
    assert int(lines[3]) > 1000  # the kernel template and its shared header render from the wheel
    plan = subprocess.run([sys.executable, "-m", "topkgen", "plan"], capture_output=True, text=True, cwd=tmp_path,
                          env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}, check=True)
    assert plan.stdout.startswith("policy: the packaged default policy (topk, sha256 ")
    schemas = sorted(p.name for p in (target / "topkgen" / "schemas").iterdir())
    assert schemas == sorted(p.name for p in (ROOT / "topkgen" / "schemas").glob("*.json"))


def test_select_takes_yes_no_arguments_as_bools_not_whatever_python_finds_truthy(default_policy):
    """select(..., deterministic="no") served the deterministic kernel and jit="no" allowed
    JIT: a string, None or a number is refused by name (as TopK refuses it); numpy's bools
    are bools."""
    import numpy as np

    fast = pol.select(default_policy, "sm_90", "float32", 64, 262144)
    assert fast.kernel.mode == "fast"
    assert pol.select(default_policy, "sm_90", "float32", 64, 262144, deterministic=np.False_) == fast
    for label in ("deterministic", "jit"):
        for bad in ("no", None, 0, 1.0):
            with pytest.raises(pol.DispatchError) as err:
                pol.select(default_policy, "sm_90", "float32", 64, 262144, **{label: bad})
            assert str(err.value) == f"{label}: expected True or False, got {bad!r}"
