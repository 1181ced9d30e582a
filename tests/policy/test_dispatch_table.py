"""The manifest's dispatch table against topkgen.policy.select, the one dispatch rule: every
k from 1 to 1024 at every n breakpoint and batch sizes that split or not, a property test
over the whole domain (rows included), and the load checks that refuse a table that is not
a tiling or names the wrong kernels or splits a kernel cannot run."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topkgen.manifest import reading as manifests
from topkgen.policy import dispatch_table
from topkgen import policy as pol
from topkgen.policy.dispatch_table import ArchTable, FieldError
from topkgen.manifest.checks import check_manifest
from topkgen.policy.split import ROWS_MAX

MODES = (False, True)  # deterministic


def _expected(policy, arch, dtype, k, n, det, jit, rows=None):
    try:
        sel = pol.select(policy, arch, dtype, k, n, deterministic=det, jit=jit, rows=rows)
        return sel.kernel.name, sel.chunks
    except pol.DispatchError as err:
        return f"error: {err}"


def _looked_up(table, dtype, k, n, det, jit, rows=None):
    try:
        choice = table.lookup(dtype, k, n, det, jit, rows)
        return choice.kernel, choice.chunks
    except pol.DispatchError as err:
        return f"error: {err}"


@pytest.fixture(scope="module", params=["default", "legacy"])
def tables(request, default_policy, legacy_policy):
    policy = default_policy if request.param == "default" else legacy_policy
    built = dispatch_table.build(policy, list(policy.archs))
    return policy, {arch: ArchTable(arch, by_dtype) for arch, by_dtype in built.items()}


def test_table_equals_select_at_every_k_and_every_n_breakpoint(tables):
    """Batch sizes: unknown, and 1 and 64 (split, into different chunks) where a row may split."""
    policy, by_arch = tables
    compared = 0
    for arch, table in by_arch.items():
        split = policy.archs[arch].split
        for dtype in policy.dtypes:
            n_points = sorted({n + d for n in dispatch_table.n_starts(policy, arch, dtype) for d in (-1, 0, 1)}
                              | {pol.N_MAX})
            for k in range(1, pol.K_COVERED + 1):
                for n in (n for n in n_points if k <= n <= pol.N_MAX):
                    for rows in (None, 1, 64) if split and n >= split.min_n else (None,):
                        for det in MODES:
                            for jit in (True, False):
                                assert _looked_up(table, dtype, k, n, det, jit, rows) == \
                                    _expected(policy, arch, dtype, k, n, det, jit, rows), (arch, dtype, k, n, rows, det, jit)
                                compared += 1
    print(f"table == select on {compared} decisions (every k, every n breakpoint -1/0/+1, rows)")
    assert compared > 100_000


def test_table_equals_select_on_the_boundary_grid_with_every_batch_breakpoint(tables):
    policy, by_arch = tables
    table = dispatch_table.build(policy, list(by_arch))
    assert dispatch_table.check_against_select(policy, table) > (100_000 if policy.archs["sm_90"].split else 5_000)


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_table_equals_select_anywhere_in_the_domain(tables, data):
    policy, by_arch = tables
    arch = data.draw(st.sampled_from(sorted(by_arch)))
    dtype = data.draw(st.sampled_from(policy.dtypes))
    k = data.draw(st.integers(1, pol.K_COVERED))
    n = data.draw(st.one_of(st.integers(k, pol.N_MAX), st.integers(k, max(k, 5000)),
                            st.integers(max(k, 100_000), 600_000)))
    rows = data.draw(st.one_of(st.none(), st.integers(1, 200), st.integers(1, ROWS_MAX)))
    det, jit = data.draw(st.booleans()), data.draw(st.booleans())
    assert _looked_up(by_arch[arch], dtype, k, n, det, jit, rows) == _expected(policy, arch, dtype, k, n, det, jit, rows)


def test_the_kernel_does_not_depend_on_the_batch_and_an_unknown_batch_is_not_split(default_policy):
    """rows only decides chunks: the kernel is the one-CTA-per-row answer, which a caller that
    does not know rows gets (today's answer), unsplit."""
    for arch in default_policy.archs:
        for dtype in default_policy.dtypes:
            ks, ns, rs = dispatch_table.boundary_grid(default_policy, arch, dtype)
            for k in ks[::7]:
                for n in (n for n in ns if n >= k):
                    unknown = pol.select(default_policy, arch, dtype, k, n)
                    assert unknown.split is None
                    for rows in rs:
                        assert pol.select(default_policy, arch, dtype, k, n, rows=rows).kernel == unknown.kernel


def test_lookups_refuse_what_select_refuses(default_policy):
    table = ArchTable("sm_90", dispatch_table.build(default_policy, ["sm_90"])["sm_90"])
    for k, n in ((0, 5), (1025, 5000), (5, 0), (5, 2**31), (9, 8), (True, 8), (3, 2.0)):
        assert _looked_up(table, "float32", k, n, False, True) == _expected(default_policy, "sm_90", "float32", k, n,
                                                                           False, True)
    for rows in (-3, ROWS_MAX + 1, True, 2.0):
        refused = _looked_up(table, "float32", 5, 200_000, False, True, rows)
        assert refused == _expected(default_policy, "sm_90", "float32", 5, 200_000, False, True, rows)
        assert refused.startswith("error: rows: must be")
    empty = _looked_up(table, "float32", 5, 200_000, False, True, 0)  # an empty batch: served unsplit, as by select
    assert empty == _expected(default_policy, "sm_90", "float32", 5, 200_000, False, True, 0)
    assert table.lookup("float32", 5, 200_000, False, True, 0) == table.lookup("float32", 5, 200_000, False, True)
    assert _looked_up(table, "float16", 5, 50, False, False) == \
        "error: dtype: 'float16' has no AOT kernels and JIT is disabled"
    assert _looked_up(table, "int8", 5, 50, False, True) == _expected(default_policy, "sm_90", "int8", 5, 50, False,
                                                                     True) == \
        "error: dtype: 'int8': integer inputs are not supported; top-k runs on floating point values (float32, " \
        "bfloat16, float16; or fp32, f32, bf16, fp16, f16, half)"
    assert _looked_up(table, "flaot32", 5, 50, False, True) == _expected(default_policy, "sm_90", "flaot32", 5, 50,
                                                                        False, True) == \
        "error: dtype: 'flaot32' is not one of float32, bfloat16, float16 (or fp32, f32, bf16, fp16, f16, half); " \
        "did you mean float32?"


def test_the_build_check_catches_a_table_that_disagrees_with_select(default_policy):
    table = dispatch_table.build(default_policy, ["sm_90"])
    assert dispatch_table.check_against_select(default_policy, table) > 5_000
    rows = table["sm_90"]["float32"]["fast"]
    row = next(r for r in rows if r["source"] == "jit")
    row["kernel"], row["source"] = row["aot_fallback"], "aot"  # the JIT tier forgotten
    with pytest.raises(FieldError, match=r"dispatch\.sm_90\.float32\.fast: at k=1 n=2048 rows=1 the table says "
                                         r"topk_radix_dyn_k64_fast_f32_sm_90 \(aot.*select says "
                                         r"topk_register_n2048_k16_det_f32_sm_90 \(jit"):
        dispatch_table.check_against_select(default_policy, table)


def test_rows_are_few_and_reach_below_the_diagonal_only_from_n_1(default_policy):
    table = dispatch_table.build(default_policy, list(default_policy.archs))
    lists = [rows for by_dtype in table.values() for by_mode in by_dtype.values() for rows in by_mode.values()]
    assert len(lists) == 2 * 3 * 2 and max(len(rows) for rows in lists) <= 150
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
    # 58 AOT; 43 JIT before issue 29, then the K=2048/4096 tier (2 archs x 3 dtypes x 4) and the
    # large-k path (2 archs x 3 dtypes x 2 modes)
    assert len(check_manifest(manifest)) == 58 + 43 + 24 + 12


def test_overlapping_rows_are_refused(manifest):
    doc = copy.deepcopy(manifest)
    rows = doc["dispatch"]["sm_90"]["float32"]["fast"]
    rows[1]["n"][0] -= 1
    assert _refusal(doc) == ("dispatch.sm_90.float32.fast: rows [0] and [1] overlap at k=1..16 n=1024..1024 "
                             "rows=1..2147483647")


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
    row = doc["dispatch"]["sm_90"]["float16"]["fast"][0]
    row["aot_fallback"], row["aot_chunks"] = "topk_register_n2048_k16_det_f16_sm_90", 1
    assert _refusal(doc) == ("dispatch.sm_90.float16.fast[0].aot_fallback: no AOT kernel "
                             "'topk_register_n2048_k16_det_f16_sm_90' for sm_90")


def _split_row(rows: list[dict]) -> int:
    return next(i for i, r in enumerate(rows) if r["chunks"] > 1)


def test_batch_sizes_must_be_tiled_too(manifest):
    doc = copy.deepcopy(manifest)
    rows = doc["dispatch"]["sm_90"]["float32"]["fast"]
    i = _split_row(rows)  # rows [1, 8] in 32 chunks, then [9, 16]
    (k_lo, k_hi), (n_lo, n_hi) = rows[i]["k"], rows[i]["n"]
    rows[i]["rows"][1] += 1
    assert _refusal(doc) == (f"dispatch.sm_90.float32.fast: rows [{i}] and [{i + 1}] overlap at k={k_lo}..{k_hi} "
                             f"n={n_lo}..{n_hi} rows=9..9")
    doc = copy.deepcopy(manifest)
    rows = doc["dispatch"]["sm_90"]["float32"]["fast"]
    rows[i]["rows"][1] -= 2
    assert _refusal(doc) == f"dispatch.sm_90.float32.fast: no row serves k={k_lo} n={n_lo}..{n_hi} rows=7..8"
    doc = copy.deepcopy(manifest)
    rows = doc["dispatch"]["sm_90"]["float32"]["fast"]
    rows[i]["rows"] = [9, 8]
    assert _refusal(doc) == f"dispatch.sm_90.float32.fast[{i}].rows: [9, 8] is empty (lo > hi)"


def test_a_split_must_fit_its_kernel(manifest):
    doc = copy.deepcopy(manifest)
    rows = doc["dispatch"]["sm_90"]["float32"]["fast"]
    rows[0]["chunks"] = rows[0]["aot_chunks"] = 2  # the register ladder, k 1..16, n 1..1024
    assert _refusal(doc) == ("dispatch.sm_90.float32.fast[0].chunks: topk_register_ladder_k16_det_f32_sm_90 cannot "
                             "run a split: it does not take x_indices, chunk, row_stride")
    doc = copy.deepcopy(manifest)
    rows = doc["dispatch"]["sm_90"]["float32"]["fast"]
    j = next(j for j, r in enumerate(rows) if r["chunks"] > 1 and r["k"][1] == 1024)
    rows[j]["chunks"] = rows[j]["aot_chunks"] = 256
    assert _refusal(doc) == (f"dispatch.sm_90.float32.fast[{j}].chunks: 256 chunks of rows from 131072 hold fewer "
                             f"than k=1024 elements")
    doc = copy.deepcopy(manifest)  # chunks of 16 to 31 elements: the kernel would count 64 to 127 of them
    rows = doc["dispatch"]["sm_90"]["float32"]["fast"]
    j = next(j for j, r in enumerate(rows) if r["k"] == [1, 16] and r["n"][0] == 1025)
    rows[j]["chunks"] = rows[j]["aot_chunks"] = 64
    assert _refusal(doc) == (f"dispatch.sm_90.float32.fast[{j}].chunks: 64 chunks of rows from 1025 are shorter than "
                             f"64 elements: n / chunk would not be 64")
    doc = copy.deepcopy(manifest)  # stage 1 of a batch of 2^31-1 rows in 2 chunks: more CTAs than a grid holds
    rows = doc["dispatch"]["sm_90"]["float32"]["fast"]
    j = next(j for j, r in enumerate(rows) if r["k"] == [1, 16] and r["n"][0] == 2049)
    rows[j]["chunks"] = rows[j]["aot_chunks"] = 2
    assert _refusal(doc) == (f"dispatch.sm_90.float32.fast[{j}].chunks: 2 chunks of batches up to 2147483647 rows "
                             f"are more CTAs than a grid holds (2147483647)")
    i = _split_row(manifest["dispatch"]["sm_90"]["float32"]["fast"])
    doc = copy.deepcopy(manifest)
    rows = doc["dispatch"]["sm_90"]["float32"]["fast"]
    rows[i]["aot_chunks"] = 16
    assert _refusal(doc) == f"dispatch.sm_90.float32.fast[{i}].aot_chunks: must be 32, the row's chunks"
    doc = copy.deepcopy(manifest)
    rows = doc["dispatch"]["sm_90"]["float16"]["fast"]
    rows[0]["aot_chunks"] = 1
    assert _refusal(doc) == "dispatch.sm_90.float16.fast[0].aot_chunks: must be null exactly when aot_fallback is"
    doc = copy.deepcopy(manifest)  # a merge outside the kernel's window
    entry = next(e for e in doc["kernels"] if e["name"] == "topk_radix_dyn_k64_fast_f32_sm_90")
    entry["n_window"]["min"] = 600
    assert _refusal(doc) == (f"dispatch.sm_90.float32.fast[{i}].chunks: topk_radix_dyn_k64_fast_f32_sm_90 serves n "
                             f"600..2147483647, not its chunks and merges 32..512")


def test_parameters_must_be_ones_a_loader_can_pass(manifest):
    doc = copy.deepcopy(manifest)
    doc["kernels"][3]["params"][1]["name"] = "stride"
    assert _refusal(doc) == ("kernels[3].params[1].name: 'stride' is not a parameter a loader can pass (known: x, "
                             "x_indices, values, indices, rows, n, k, largest, chunk, row_stride, lengths, starts, "
                             "window_bytes, split_n)")
    doc = copy.deepcopy(manifest)
    doc["kernels"][3]["params"][0]["ctype"] = "const double*"
    assert _refusal(doc) == "kernels[3].params[0].ctype: 'const double*' must be 'const float*'"


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
    with pytest.raises(manifests.ManifestError, match="schema_version: 1 has no dispatch table; rebuild the bundle"):
        manifests.load_manifest(tmp_path)


# ----------------------------------------------------------------------------- the schema

def test_the_manifest_schema_validates_the_manifest(manifest):
    # test_own_policy.py checks that every shipped schema describes every property.
    import jsonschema

    from topkgen.common.schema import load_schema, validate

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
