"""`topkgen show BUNDLE`: what a bundle holds, like cuobjdump --list-elf plus -res-usage."""

from __future__ import annotations

import json


def test_show_lists_kernels_by_family_with_resources_and_budget(cli, built_bundle):
    result = cli("show", built_bundle, "--arch", "sm_90")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    from topkgen.manifest.reading import SCHEMA_VERSION

    assert f"manifest schema {SCHEMA_VERSION}" in out and "policy policies/topk.yaml" in out
    assert "sm_90: 29 AOT kernels" in out and "sm_100" not in out
    assert "  family register" in out and "  family radix" in out
    for column in ("serves", "threads", "regs", "spills st/ld", "stack", "smem static", "smem dyn", "cubin bytes",
                   "budget"):
        assert column in out
    line = next(row for row in out.splitlines() if row.strip().startswith("topk_radix_dyn_k1024_det_f32_sm_90 "))
    assert "1024" in line and "deterministic" in line and "96 regs, no spills" in line
    assert "sm_90: 38 JIT sources" in out and "topk_register_n2048_k16_det_f16_sm_90" in out
    assert "dispatch sm_90" not in out


def test_show_dispatch_prints_the_table(cli, built_bundle):
    out = cli("show", built_bundle, "--arch", "sm_100", "--dispatch").stdout
    assert "dispatch sm_100 float32 fast:" in out and "dispatch sm_100 float16 deterministic:" in out
    row = next(line for line in out.splitlines() if "topk_register_n1024_k16_det_f32_sm_100" in line and " jit " in line)
    assert row.split()[:3] == ["1..2^31-1", "1..16", "=1024"]
    assert row.split()[-1] == "topk_register_ladder_k16_det_f32_sm_100"


def test_show_dispatch_tells_the_split_rows_apart(cli, built_bundle):
    """Rows of one (k, n) window that differ only in batch size and chunks per row printed as
    identical lines before the rows and chunks columns."""
    out = cli("show", built_bundle, "--arch", "sm_90", "--dispatch").stdout
    manifest = json.loads((built_bundle / "manifest.json").read_text())
    split = next(r for r in manifest["dispatch"]["sm_90"]["float32"]["fast"] if r["chunks"] > 1)
    table = out.split("dispatch sm_90 float32 fast:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert table[0].split() == ["rows", "k", "n", "kernel", "chunks", "source", "without", "JIT"]
    lo, hi = split["rows"]
    assert [f"{lo}..{hi}", split["kernel"], str(split["chunks"])] in [[c[0], c[3], c[4]] for c in map(str.split, table)]
    for mode in ("fast", "deterministic"):
        for dtype in ("float32", "bfloat16", "float16"):
            lines = out.split(f"dispatch sm_90 {dtype} {mode}:\n", 1)[1].split("\n\n", 1)[0].splitlines()
            assert len(lines) == len(set(lines)), (dtype, mode)


def test_show_json_is_the_manifest_parts_of_the_chosen_archs(cli, built_bundle):
    doc = json.loads(cli("show", built_bundle, "--format", "json", "--dispatch").stdout)
    manifest = json.loads((built_bundle / "manifest.json").read_text())
    assert doc["kernels"] == manifest["kernels"] and doc["jit_kernels"] == manifest["jit_kernels"]
    assert doc["dispatch"] == manifest["dispatch"] and doc["archs"] == ["sm_90", "sm_100"]


def test_show_refuses_an_arch_the_bundle_lacks(cli, built_bundle):
    result = cli("show", built_bundle, "--arch", "sm_80")
    assert result.exit_code == 2 and "--arch sm_80: not in the bundle" in result.stderr


def test_show_reports_bytes_per_arch_and_in_all(cli, built_bundle):
    """Each arch's files and all of them, as the bytes on disk; the JSON holds the same and
    validates against schemas/show.schema.json."""
    from topkgen.common.schema import load_schema, validate

    doc = json.loads(cli("show", built_bundle, "--format", "json").stdout)
    validate(doc, load_schema("show.schema.json"))
    on_disk = {arch: (sum(f.stat().st_size for f in (built_bundle / arch).glob("*.cubin")),
                      sum(f.stat().st_size for f in (built_bundle / "jit" / arch).glob("*.cu")))
               for arch in ("sm_90", "sm_100")}
    for arch, (cubin, source) in on_disk.items():
        assert doc["sizes"]["archs"][arch] == {"kernels": 29, "cubin_bytes": cubin, "ptx_bytes": 0,
                                               "jit_source_bytes": source, "bytes": cubin + source}
    assert doc["sizes"]["all"]["bytes"] == sum(c + s for c, s in on_disk.values())
    assert doc["sizes"]["all"]["kernels"] == 58
    out = cli("show", built_bundle).stdout
    rows = {line.split()[0]: line.split()[1:] for line in out.split("bytes per arch", 1)[1].split("\n\n", 1)[0].splitlines()[2:]}
    assert rows["sm_90"] == ["29", str(on_disk["sm_90"][0]), "0", str(on_disk["sm_90"][1]), str(sum(on_disk["sm_90"]))]
    assert rows["all"][0] == "58" and rows["all"][-1] == str(doc["sizes"]["all"]["bytes"])
