"""benchmarks/split_crossover.py: the policies gpu-check times against each other, the
rows_below it picks from their times, and the one-line edit that writes it back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from topkgen import policy

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import split_crossover as sc  # noqa: E402

SHAPES = (("float32", 131072, 16), ("float32", 262144, 1024))


def grid(split_us, unsplit_us=lambda d, n, k, r: 100.0, chunks=lambda d, n, k, r: 8) -> list[sc.Measured]:
    return [sc.Measured(d, n, k, r, chunks(d, n, k, r), split_us(d, n, k, r), unsplit_us(d, n, k, r))
            for d, n, k in SHAPES for r in sc.ROWS]


def test_the_threshold_is_one_past_the_last_batch_where_splitting_pays():
    found = sc.choose_rows_below(grid(lambda d, n, k, r: 50.0 if r <= 32 else 150.0))
    assert found.rows_below == 33 and found.worst is None
    assert found.geomean_ratio == pytest.approx(((0.5 ** 4) * (1.5 ** 0)) ** (1 / 9))  # 4 of 9 rows split, per shape


def test_one_shape_that_loses_is_outweighed_by_the_grid_and_named():
    def split_us(d, n, k, r):
        if k == 1024:
            return 110.0 if r >= 16 else 60.0  # this shape stops paying at 16 rows
        return 40.0 if r <= 64 else 120.0
    found = sc.choose_rows_below(grid(split_us))
    assert found.rows_below == 65
    assert (found.worst.k, found.worst.rows) == (1024, 16)  # all three slowed batches are 1.10x: the first
    text = sc.summary("sm_90", "NVIDIA H200", 96, found)
    assert "crossover: rows_below 65 (the policy has 96)" in text
    assert "slowest under that rule: float32 16 x 262144 K=1024 in 8 chunks, 1.10x the unsplit time" in text


def test_never_paying_and_always_paying():
    never = sc.choose_rows_below(grid(lambda d, n, k, r: 101.0))
    assert never.rows_below is None and never.geomean_ratio == pytest.approx(1.0)
    assert "remove the split section" in sc.summary("sm_90", "H200", 96, never)
    always = sc.choose_rows_below(grid(lambda d, n, k, r: 99.0))
    assert always.rows_below == 265
    assert "the crossover lies beyond it" in sc.summary("sm_90", "H200", 96, always)


def test_equal_times_tie_to_the_smaller_threshold_and_unsplit_batches_are_left_out():
    # Splitting neither helps nor hurts: no split. A batch the policy left whole (1 chunk)
    # timed 10x faster "split" is noise between two identical launches and must not count.
    found = sc.choose_rows_below(grid(lambda d, n, k, r: 10.0 if r == 264 else 100.0,
                                      chunks=lambda d, n, k, r: 1 if r == 264 else 8))
    assert found.rows_below is None and 264 not in found.measured_rows
    with pytest.raises(ValueError, match="no measured batch was split"):
        sc.choose_rows_below(grid(lambda d, n, k, r: 1.0, chunks=lambda d, n, k, r: 1))


def test_the_variants_differ_from_the_policy_only_in_the_arch_split():
    text = policy.default_policy_path().read_text()
    base = policy.loads(text)
    variants = {name: policy.loads(v) for name, v in sc.variant_policies(text, "sm_90").items()}
    assert variants["split"].archs["sm_90"].split.rows_below == sc.ALWAYS_SPLIT
    assert all(variants["split"].archs["sm_90"].split.rows_below_for(k) == sc.ALWAYS_SPLIT for k in (64, 256, 1024))
    assert variants["unsplit"].archs["sm_90"].split is None
    for v in variants.values():
        assert v.archs["sm_100"] == base.archs["sm_100"]
        assert [s.name for s in policy.plan(v, "sm_90")] == [s.name for s in policy.plan(base, "sm_90")]
    kept = {"rows_below": base.archs["sm_90"].split.rows_below, "rows_below_by_k": base.archs["sm_90"].split.rows_below_by_k}
    assert variants["split"].archs["sm_90"].split.__dict__ | kept == base.archs["sm_90"].split.__dict__


def test_the_write_back_changes_one_value_on_one_line():
    text = policy.default_policy_path().read_text()
    edited = sc.with_rows_below(text, "sm_90", 48, "NVIDIA H200 # x")
    before, after = text.splitlines(), edited.splitlines()
    changed = [i for i, (a, b) in enumerate(zip(before, after)) if a != b]
    assert len(before) == len(after) and len(changed) == 1
    assert after[changed[0]] == ("      rows_below: 48  # measured on NVIDIA H200 x (make gpu-check, "
                                 "benchmarks/split_crossover.py)")
    loaded = policy.loads(edited)
    assert loaded.archs["sm_90"].split.rows_below == 48
    assert loaded.archs["sm_100"].split.rows_below == policy.loads(text).archs["sm_100"].split.rows_below
    again = sc.with_rows_below(edited, "sm_90", 40, "NVIDIA H200")  # the old comment is replaced
    assert again.splitlines()[changed[0]].count("#") == 1 and "rows_below: 40  # measured" in again


def test_the_command_writes_the_policy_or_refuses_with_exit_2(tmp_path):
    pol = tmp_path / "topk.yaml"
    pol.write_text(policy.default_policy_path().read_text())
    results = tmp_path / "split_crossover.json"
    measured = grid(lambda d, n, k, r: 50.0 if r <= 16 else 150.0)
    sc.write_results(results, "sm_90", "NVIDIA H200", measured[:9], len(measured))  # out of time: one shape of 2
    partial = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "split_crossover.py"), str(results),
                              "--policy", str(pol), "--write"], capture_output=True, text=True)
    assert partial.returncode == 2 and "9 of 18 batches measured" in partial.stderr
    assert pol.read_text() == policy.default_policy_path().read_text()
    sc.write_results(results, "sm_90", "NVIDIA H200", measured, len(measured))
    command = [sys.executable, str(ROOT / "benchmarks" / "split_crossover.py"), str(results), "--policy", str(pol)]
    shown = subprocess.run(command, capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    rows_below = policy.load().archs["sm_90"].split.rows_below
    assert f"crossover: rows_below 17 (the policy has {rows_below})" in shown.stdout
    assert pol.read_text() == policy.default_policy_path().read_text()  # not asked to write
    wrote = subprocess.run([*command, "--write"], capture_output=True, text=True)
    assert wrote.returncode == 0 and f"wrote rows_below 17 for sm_90 into {pol}" in wrote.stdout
    assert policy.load(pol).archs["sm_90"].split.rows_below == 17
    results.write_text(json.dumps({"arch": "sm_90", "device": "x", "grid": 1, "measured": [{"rows": 1}]}))
    bad = subprocess.run(command, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("split_crossover: ") and "Traceback" not in bad.stderr
