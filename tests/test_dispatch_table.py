"""The manifest's dispatch table against topkgen.policy.select, the one dispatch rule: every
k from 1 to 1024 at every n breakpoint, a property test over the whole domain, and the
load checks that refuse a table that is not a tiling or names the wrong kernels."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topkgen import bundle, dispatch_table
from topkgen import policy as pol
from topkgen.dispatch_table import ArchTable, FieldError
from topkgen.manifest_checks import check_manifest

MODES = (False, True)  # deterministic


def _expected(policy, arch, dtype, k, n, det, jit):
    try:
        return pol.select(policy, arch, dtype, k, n, deterministic=det, jit=jit).kernel.name
    except pol.DispatchError as err:
        return f"error: {err}"


def _looked_up(table, dtype, k, n, det, jit):
    try:
        return table.lookup(dtype, k, n, det, jit).kernel
    except pol.DispatchError as err:
        return f"error: {err}"


@pytest.fixture(scope="module", params=["default", "legacy"])
def tables(request, default_policy, legacy_policy):
    policy = default_policy if request.param == "default" else legacy_policy
    built = dispatch_table.build(policy, list(policy.archs))
    return policy, {arch: ArchTable(arch, by_dtype) for arch, by_dtype in built.items()}


def test_table_equals_select_at_every_k_and_every_n_breakpoint(tables):
    policy, by_arch = tables
    compared = 0
    for arch, table in by_arch.items():
        for dtype in policy.dtypes:
            n_points = sorted({n + d for n in dispatch_table.n_starts(policy, arch, dtype) for d in (-1, 0, 1)}
                              | {pol.N_MAX})
            for k in range(1, pol.K_MAX + 1):
                for n in (n for n in n_points if k <= n <= pol.N_MAX):
                    for det in MODES:
                        for jit in (True, False):
                            assert _looked_up(table, dtype, k, n, det, jit) == _expected(policy, arch, dtype, k, n, det, jit), \
                                (arch, dtype, k, n, det, jit)
                            compared += 1
    print(f"table == select on {compared} decisions (every k, every n breakpoint -1/0/+1)")
    assert compared > 100_000


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_table_equals_select_anywhere_in_the_domain(tables, data):
    policy, by_arch = tables
    arch = data.draw(st.sampled_from(sorted(by_arch)))
    dtype = data.draw(st.sampled_from(policy.dtypes))
    k = data.draw(st.integers(1, pol.K_MAX))
    n = data.draw(st.one_of(st.integers(k, pol.N_MAX), st.integers(k, max(k, 5000))))
    det, jit = data.draw(st.booleans()), data.draw(st.booleans())
    assert _looked_up(by_arch[arch], dtype, k, n, det, jit) == _expected(policy, arch, dtype, k, n, det, jit)


def test_lookups_refuse_what_select_refuses(default_policy):
    table = ArchTable("sm_90", dispatch_table.build(default_policy, ["sm_90"])["sm_90"])
    for k, n in ((0, 5), (1025, 5000), (5, 0), (5, 2**31), (9, 8), (True, 8), (3, 2.0)):
        assert _looked_up(table, "float32", k, n, False, True) == _expected(default_policy, "sm_90", "float32", k, n,
                                                                           False, True)
    assert _looked_up(table, "float16", 5, 50, False, False) == \
        "error: dtype: 'float16' has no AOT kernels and JIT is disabled"
    assert _looked_up(table, "int8", 5, 50, False, True) == \
        "error: dtype: 'int8' is not in the bundle (known: bfloat16, float16, float32)"


def test_the_build_check_catches_a_table_that_disagrees_with_select(default_policy):
    table = dispatch_table.build(default_policy, ["sm_90"])
    assert dispatch_table.check_against_select(default_policy, table) > 5_000
    rows = table["sm_90"]["float32"]["fast"]
    row = next(r for r in rows if r["source"] == "jit")
    row["kernel"], row["source"] = row["aot_fallback"], "aot"  # the JIT tier forgotten
    with pytest.raises(FieldError, match=r"dispatch\.sm_90\.float32\.fast: at k=1 n=2048 the table says "
                                         r"topk_radix_dyn_k64_fast_f32_sm_90 \(aot.*select says "
                                         r"topk_register_n2048_k16_det_f32_sm_90 \(jit"):
        dispatch_table.check_against_select(default_policy, table)


def test_rows_are_few_and_reach_below_the_diagonal_only_from_n_1(default_policy):
    table = dispatch_table.build(default_policy, list(default_policy.archs))
    lists = [rows for by_dtype in table.values() for by_mode in by_dtype.values() for rows in by_mode.values()]
    assert len(lists) == 2 * 3 * 2 and max(len(rows) for rows in lists) <= 20
    for rows in lists:
        for row in rows:
            assert row["n"][0] == 1 or row["n"][0] >= row["k"][0]


# ----------------------------------------------------------------------------- load checks

@pytest.fixture(scope="module")
def manifest(built_bundle):
    return json.loads((built_bundle / "manifest.json").read_text())


def _refusal(doc) -> str:
    with pytest.raises(FieldError) as err:
        check_manifest(doc)
    return str(err.value)


def test_the_built_manifest_passes_every_check(manifest):
    assert len(check_manifest(manifest)) == 58 + 43


def test_overlapping_rows_are_refused(manifest):
    doc = copy.deepcopy(manifest)
    rows = doc["dispatch"]["sm_90"]["float32"]["fast"]
    rows[1]["n"][0] -= 1
    assert _refusal(doc) == "dispatch.sm_90.float32.fast: rows [0] and [1] overlap at k=1..16 n=1024..1024"


def test_a_gap_is_refused(manifest):
    doc = copy.deepcopy(manifest)
    rows = doc["dispatch"]["sm_90"]["bfloat16"]["deterministic"]
    del rows[2]
    assert _refusal(doc).startswith("dispatch.sm_90.bfloat16.deterministic: no row serves k=1 n=")


def test_a_row_must_name_a_kernel_of_its_dtype_mode_and_window(manifest):
    doc = copy.deepcopy(manifest)
    rows = doc["dispatch"]["sm_100"]["float32"]["fast"]
    rows[0]["kernel"] = rows[0]["aot_fallback"] = "topk_register_ladder_k16_det_bf16_sm_100"
    assert _refusal(doc) == ("dispatch.sm_100.float32.fast[0].kernel: topk_register_ladder_k16_det_bf16_sm_100 "
                             "is a bfloat16 kernel, not float32")
    doc = copy.deepcopy(manifest)
    rows = doc["dispatch"]["sm_90"]["float32"]["deterministic"]
    last = rows[-1]
    last["kernel"] = last["aot_fallback"] = last["kernel"].replace("_det_", "_fast_")
    assert _refusal(doc).endswith(f"{last['kernel']} does not serve deterministic")
    doc = copy.deepcopy(manifest)
    rows = doc["dispatch"]["sm_90"]["float32"]["fast"]
    rows[0]["n"] = [1, 1500]
    rows[1]["n"][0] = 1501
    assert _refusal(doc) == ("dispatch.sm_90.float32.fast[0].kernel: topk_register_ladder_k16_det_f32_sm_90 "
                             "serves n 1..1024, not 1..1500")
    doc = copy.deepcopy(manifest)
    doc["dispatch"]["sm_90"]["float16"]["fast"][0]["aot_fallback"] = "topk_register_n2048_k16_det_f16_sm_90"
    assert _refusal(doc) == ("dispatch.sm_90.float16.fast[0].aot_fallback: no AOT kernel "
                             "'topk_register_n2048_k16_det_f16_sm_90' for sm_90")


def test_every_arch_has_a_table_and_no_other(manifest):
    doc = copy.deepcopy(manifest)
    del doc["dispatch"]["sm_100"]
    assert _refusal(doc) == "dispatch: no table for sm_100"
    doc = copy.deepcopy(manifest)
    doc["archs"] = ["sm_90"]
    doc["kernels"] = [e for e in doc["kernels"] if e["arch"] == "sm_90"]
    doc["jit_kernels"] = [e for e in doc["jit_kernels"] if e["arch"] == "sm_90"]
    assert _refusal(doc) == "dispatch.sm_100: not one of the bundle's archs"


def test_the_runtime_refuses_schema_1_and_asks_for_a_rebuild(built_bundle, tmp_path):
    doc = json.loads((built_bundle / "manifest.json").read_text())
    doc["schema_version"] = 1
    (tmp_path / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(bundle.ManifestError, match="schema_version: 1 has no dispatch table; rebuild the bundle"):
        bundle.load_manifest(tmp_path)


# ----------------------------------------------------------------------------- the schema

def test_the_manifest_schema_validates_the_manifest(manifest):
    # test_own_policy.py checks that every shipped schema describes every property.
    import jsonschema

    from topkgen.schema import load_schema, validate

    schema = load_schema("manifest.schema.json")
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator.check_schema(load_schema("manifest-1.schema.json"))
    jsonschema.validate(manifest, schema)
    validate(manifest, schema)
    doc = copy.deepcopy(manifest)
    doc["dispatch"]["sm_90"]["float32"]["fast"][0]["aot_fallback"] = 7
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, schema)
    with pytest.raises(Exception, match=r"aot_fallback: expected string or null"):
        validate(doc, schema)
