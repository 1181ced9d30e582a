"""diff lists dispatch moves as exact regions (issue 32): `k 129..256, n 392929..2^31-1, rows
32..95`, in text, markdown and JSON alike, from both sides' dispatch tables; a move between
the grid's points is reported too. Checked against `select` on both sides."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys

import jsonschema
import pytest

from topkgen import policy as pol
from topkgen.common.schema import load_schema
from topkgen.diff.sides import load_side
from topkgen.diff.regions import dispatch_regions, region_text
from topkgen.policy.split import ROWS_MAX

from ..conftest import DEFAULT_POLICY

TOPKGEN = [sys.executable, "-m", "topkgen"]


@pytest.fixture(scope="module")
def policies(tmp_path_factory):
    """The default policy with rows_below 96 on both archs, one whose sm_90 splits batches below
    32 rows instead of 96, and one below 95, a move no grid batch size (1, 64, 4096) sees."""
    root = tmp_path_factory.mktemp("regions")
    text, count = re.subn(r"rows_below: \d+", "rows_below: 96", DEFAULT_POLICY.read_text())
    assert count == 2
    old, fewer, one = root / "old.yaml", root / "fewer.yaml", root / "one.yaml"
    old.write_text(text)
    fewer.write_text(text.replace("rows_below: 96", "rows_below: 32", 1))
    one.write_text(text.replace("rows_below: 96", "rows_below: 95", 1))
    return old, fewer, one


def _serves(policy, region_or_shape, k, n, rows):
    r = region_or_shape
    if r["arch"] not in policy.archs or r["dtype"] not in policy.dtypes:
        return None
    sel = pol.select(policy, r["arch"], r["dtype"], k, n, deterministic=r["mode"] == "deterministic", rows=rows)
    return sel.kernel.name, sel.source, sel.chunks


def test_regions_are_exactly_where_select_differs(policies):
    old, new = (load_side(str(p)) for p in policies[:2])
    regions = dispatch_regions(old, new)
    assert regions and {r["moves"] for r in regions} == {"split"} and {r["arch"] for r in regions} == {"sm_90"}
    for r in regions:  # inside: every corner moves as the region says
        for k in r["k"]:
            for n in (max(r["n"][0], k), r["n"][1]):
                for rows in r["rows"]:
                    assert _serves(old.policy, r, k, n, rows) == (r["old"]["kernel"], r["old"]["source"],
                                                                 r["old"]["chunks"])
                    assert _serves(new.policy, r, k, n, rows) == (r["new"]["kernel"], r["new"]["source"],
                                                                 r["new"]["chunks"])
    rng = random.Random(3)  # outside every region: the same on both sides
    for _ in range(3000):
        arch, dtype, mode = rng.choice(["sm_90", "sm_100"]), rng.choice(["float32", "bfloat16", "float16"]), \
            rng.choice(["fast", "deterministic"])
        k = rng.randint(1, 1024)
        n = rng.choice([rng.randint(k, 300_000), rng.randint(k, pol.N_MAX)])
        rows = rng.choice([rng.randint(1, 128), rng.randint(1, ROWS_MAX)])
        shape = {"arch": arch, "dtype": dtype, "mode": mode}
        inside = [r for r in regions if (r["arch"], r["dtype"], r["mode"]) == (arch, dtype, mode)
                  and r["k"][0] <= k <= r["k"][1] and r["n"][0] <= n <= r["n"][1] and r["rows"][0] <= rows <= r["rows"][1]]
        assert len(inside) <= 1
        differs = _serves(old.policy, shape, k, n, rows) != _serves(new.policy, shape, k, n, rows)
        assert differs == bool(inside), (shape, k, n, rows)


def test_text_markdown_and_json_list_the_ranges(policies):
    old, new = map(str, policies[:2])
    text = subprocess.run([*TOPKGEN, "diff", old, new], capture_output=True, text=True)
    markdown = subprocess.run([*TOPKGEN, "diff", old, new, "--format", "markdown"], capture_output=True, text=True)
    raw = subprocess.run([*TOPKGEN, "diff", old, new, "--format", "json"], capture_output=True, text=True)
    assert (text.returncode, markdown.returncode, raw.returncode) == (1, 1, 1), text.stderr
    doc = json.loads(raw.stdout)
    jsonschema.validate(doc, load_schema("diff.schema.json"))
    assert doc["schema_version"] == 6 and doc["summary"]["dispatch"]["regions"] == len(doc["dispatch"]["regions"])
    wanted = "k 129..256, n 392929..2^31-1, rows 32..95"  # float32: 4-byte elements, shorter chunks
    assert wanted in [region_text(r) for r in doc["dispatch"]["regions"]]
    line = next(line for line in text.stdout.splitlines() if wanted in line and "sm_90 float32 fast" in line)
    assert line.startswith("  sm_90 float32 fast: topk_radix_dyn_k256_fast_f32_sm_90 (aot, 32 chunks per row) -> "
                           "topk_radix_dyn_k256_fast_f32_sm_90 (aot)  [split]  ")
    assert "k=256 n=131072" not in text.stdout  # no grid points
    assert wanted in markdown.stdout and "regions (k, n, rows)" in markdown.stdout
    assert f"{len(doc['dispatch']['regions'])} region(s) of (k, n, rows) move" in text.stdout


def test_a_move_between_the_grid_points_is_reported(policies):
    """Batches of 95 rows split no longer: no grid shape (rows 1, 64, 4096) moves, and diff
    said "same", exit 0."""
    old, _, one = map(str, policies)
    raw = subprocess.run([*TOPKGEN, "diff", old, one, "--format", "json"], capture_output=True, text=True)
    assert raw.returncode == 1, raw.stderr
    doc = json.loads(raw.stdout)
    assert doc["dispatch"]["changed"] == [] and doc["differs"]
    assert {tuple(r["rows"]) for r in doc["dispatch"]["regions"]} == {(95, 95)}
    text = subprocess.run([*TOPKGEN, "diff", old, one], capture_output=True, text=True).stdout
    assert re.search(r"dispatch: 0 of \d+ shapes change; ", text) and ", rows 95" in text


def test_same_sides_have_no_regions(policies):
    old = load_side(str(policies[0]))
    assert dispatch_regions(old, load_side(str(policies[0]))) == []
