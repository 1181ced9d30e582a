"""policies/fleet.yaml: every arch the pinned NVRTC compiles for and a top-k user runs, its
tuning within each arch's documented limits (topkgen/policy/model.py's tables), the limits
enforced when a policy asks for more, and explain saying what a smaller shared memory does."""

from __future__ import annotations

import json
import re

import pytest

from topkgen import policy as pol
from topkgen.policy.explain import explain

from ..conftest import DEFAULT_POLICY, ROOT

FLEET_POLICY = ROOT / "policies" / "fleet.yaml"
FLEET_ARCHS = ["sm_75", "sm_80", "sm_86", "sm_87", "sm_89", "sm_90", "sm_100", "sm_103", "sm_110", "sm_120", "sm_121"]


@pytest.fixture(scope="module")
def fleet():
    return pol.load(FLEET_POLICY)


def test_fleet_declares_every_arch_with_29_kernels(fleet):
    assert list(fleet.archs) == FLEET_ARCHS
    assert {arch: len(pol.plan(fleet, arch)) for arch in fleet.archs} == {arch: 29 for arch in FLEET_ARCHS}


def test_the_pinned_nvrtc_compiles_every_fleet_arch():
    from cuda.bindings import nvrtc

    err, supported = nvrtc.nvrtcGetSupportedArchs()
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS
    assert {int(a[3:]) for a in FLEET_ARCHS} <= set(supported)
    assert not {50, 52, 60, 61, 70, 72} & set(supported)  # what fleet.yaml's header says NVRTC 13 dropped


def test_schema_archs_are_the_archs_with_documented_limits():
    schema = json.loads((ROOT / "topkgen" / "schemas" / "policy.schema.json").read_text())
    names = schema["$defs"]["arch"]["enum"]
    assert names == list(pol.SHARED_BYTES_PER_BLOCK) == list(pol.THREADS_PER_SM_BY_ARCH)
    assert set(FLEET_ARCHS) <= set(names)


def test_each_arch_comment_quotes_the_documented_limits(fleet):
    """The arch's header comment states its limits as NVIDIA documentation; they must be the
    numbers topkgen checks the policy against."""
    text = FLEET_POLICY.read_text()
    for arch in FLEET_ARCHS:
        line = re.search(rf"^  {arch}:.*$", text, re.M).group(0)
        m = re.search(r"(\d+) bytes per block, (\d+) threads per SM \(NVIDIA documentation\)", line)
        assert m, line
        assert (int(m.group(1)), int(m.group(2))) == (pol.SHARED_BYTES_PER_BLOCK[arch], pol.THREADS_PER_SM_BY_ARCH[arch])


def test_no_tuning_value_claims_a_measurement():
    """The header and arch sections: every commented value is documentation or a model
    estimate; 'measured' appears only to say that nothing is."""
    archs_part = FLEET_POLICY.read_text().split("\ndtypes:")[0]
    for line in archs_part.splitlines():
        if "measured" in line.lower():
            assert "none is measured" in line, line


def test_fleet_tuning_fits_each_arch(fleet):
    for arch, tuning in fleet.archs.items():
        for spec in pol.plan(fleet, arch):
            assert spec.dynamic_shared_bytes + pol.RADIX_STATIC_SHARED_BYTES <= pol.SHARED_BYTES_PER_BLOCK[arch]
            assert spec.min_ctas_per_sm * spec.threads <= pol.THREADS_PER_SM_BY_ARCH[arch], spec.name
        # two radix CTAs (row copy and static shared memory, 1 KB reserved each from sm_80) per SM
        per_sm = {"sm_75": 64, "sm_80": 164, "sm_87": 164, "sm_86": 100, "sm_89": 100, "sm_120": 100,
                  "sm_121": 100}.get(arch, 228) * 1024
        reserved = 0 if arch == "sm_75" else 1024
        assert 2 * (tuning.shared_row_bytes + pol.RADIX_STATIC_SHARED_BYTES + reserved) <= per_sm


def test_sm_90_and_sm_100_are_the_default_policys_kernels(fleet):
    default = pol.load(DEFAULT_POLICY)
    for arch in ("sm_90", "sm_100"):
        assert [s.record() for s in pol.plan(fleet, arch)] == [s.record() for s in pol.plan(default, arch)]


def _edited(old: str, new: str) -> str:
    text = FLEET_POLICY.read_text()
    assert old in text
    return text.replace(old, new, 1)


def test_the_default_96_kb_does_not_fit_a_99_kb_part():
    text = _edited("    shared_row_bytes: 32768 ", "    shared_row_bytes: 98304 ")  # the first 99 KB arch: sm_86
    with pytest.raises(pol.PolicyError, match=r"archs\.sm_86\.shared_row_bytes: 98304 bytes leave no room .* "
                                              r"within sm_86's 101376 per block \(at most 84480\)"):
        pol.loads(text, source="fleet.yaml")


def test_two_1024_thread_ctas_do_not_fit_1536_threads_per_sm():
    # sm_86 (the first 1536-thread arch) and sm_75 (1024) without threads_by_k: K=1024 runs
    # max(K, threads) = 1024 threads, and the fleet's two CTAs of it no longer fit.
    for arch, most in (("sm_86", 1536), ("sm_75", 1024)):
        text = FLEET_POLICY.read_text()
        start = text.index(f"  {arch}:")
        text = text[:start] + text[start:].replace("512: 128, 1024: 128, 2048: 256}", "512: 128, 2048: 256}", 1)
        with pytest.raises(pol.PolicyError, match=rf"archs\.{arch}\.min_ctas_per_sm\.1024: 5 CTAs of 1024 threads "
                                                  rf".* exceed {arch}'s {most} threads per SM"):
            pol.loads(text, source="fleet.yaml")


def test_explain_says_a_row_longer_than_the_arch_holds_is_read_twice(fleet):
    small = explain(fleet, "sm_86", "float32", 100, 20000)
    assert small.source == "aot" and small.kernel.name == "topk_radix_dyn_k128_fast_f32_sm_86"
    assert ("n=20000 is longer than the 8189 elements its 32768 bytes of dynamic shared memory hold (sm_86's "
            "shared_row_bytes 32768, within the 101376 bytes a block may have there)") in small.reason
    big = explain(fleet, "sm_90", "float32", 100, 20000)  # 96 KB holds it: read once, nothing to say
    assert "longer than" not in big.reason
    assert "longer than" not in explain(fleet, "sm_86", "float32", 100, 8189).reason
    assert "longer than" in explain(fleet, "sm_86", "float32", 100, 8190).reason
