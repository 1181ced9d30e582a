"""explain prints the real grid (issue 32): CTAs x threads and what each CTA takes, for
every family; it said "one CTA per row" of the register kernels, which run several rows per
CTA. The numbers are checked against the launches every backend makes (policy.split.stages
with the kernel's launch configuration)."""

from __future__ import annotations

import pytest

from topkgen.policy.explain import explain
from topkgen.policy.split import stages

SHAPES = [(8, 512, 100), (8, 512, 1), (16, 1024, 4097), (256, 131072, 1), (256, 131072, 4096), (1024, 262144, 3),
          (64, 4096, 64)]


def _line(text: str, label: str) -> str:
    (line,) = [part for part in text.splitlines() if part.startswith(label)]
    return line[len(label):].strip()


@pytest.mark.parametrize("k, n, rows", SHAPES, ids=[f"k{k}-n{n}-rows{r}" for k, n, r in SHAPES])
def test_the_grid_line_is_the_launches_grid(default_policy, k, n, rows):
    answer = explain(default_policy, "sm_90", "float32", k, n, rows=rows)
    spec, plan = answer.kernel, answer.selection.split
    grids = [-(-stage.grid_rows // spec.rows_per_block) for stage in stages(rows, n, k, True, plan)]
    grid = _line(str(answer), "grid:")
    if plan is None:
        (ctas,) = grids
        per = "1 row" if spec.rows_per_block == 1 else f"{spec.rows_per_block} rows"
        assert grid == f"{ctas} CTA{'' if ctas == 1 else 's'} x {spec.threads} threads, {per} per CTA"
    else:
        assert grid == (f"stage 1: {grids[0]} CTAs x {spec.threads} threads, 1 chunk per CTA; stage 2: {grids[1]} "
                        f"CTA{'' if grids[1] == 1 else 's'} x {spec.threads} threads, 1 row per CTA")


@pytest.mark.parametrize("k, n, rows", [(256, 131072, 1), (1024, 262144, 3)])
def test_a_split_in_one_launch_is_said_so(k, n, rows):
    """A policy whose split section sets one_launch: the split line's workspace holds the
    tickets too, and the grid line is the one launch's grid (stage 2's, for a loader that
    launches twice, in brackets)."""
    from topkgen import policy

    text = policy.default_policy_path().read_text()
    assert text.count("one_launch: false") == 2
    merging = policy.loads(text.replace("one_launch: false", "one_launch: true"), source="one_launch")
    answer = explain(merging, "sm_90", "float32", k, n, rows=rows)
    spec, plan = answer.kernel, answer.selection.split
    assert spec.merges and plan is not None and plan.one_launch
    (one,) = [-(-stage.grid_rows // spec.rows_per_block) for stage in stages(rows, n, k, True, plan)]
    assert _line(str(answer), "grid:") == (
        f"one launch: {one} CTAs x {spec.threads} threads, 1 chunk per CTA, each row's last CTA then merging "
        f"(as two: then {rows} CTA{'' if rows == 1 else 's'} x {spec.threads} threads, 1 row per CTA)")
    assert _line(str(answer), "split:").endswith(
        f"merges {plan.candidates} candidates per row in the same launch (the tickets in the workspace too); "
        f"workspace {plan.workspace_bytes} bytes")
    assert plan.workspace_bytes == plan.tickets_offset + 4 * rows


def test_register_kernels_are_not_said_to_run_one_cta_per_row(default_policy):
    answer = explain(default_policy, "sm_90", "float32", 8, 512, rows=100)
    assert answer.kernel.family == "register" and answer.kernel.rows_per_block == 4
    text = str(answer)
    assert "one CTA per row" not in text
    assert _line(text, "split:") == "none: each CTA takes 4 whole rows"
    assert _line(text, "grid:") == "25 CTAs x 128 threads, 4 rows per CTA"
    unknown = str(explain(default_policy, "sm_90", "float32", 8, 512))
    assert _line(unknown, "grid:") == "ceil(rows / 4) CTAs x 128 threads, 4 rows per CTA (no batch size given)"
    assert _line(str(explain(default_policy, "sm_90", "float32", 8, 512, rows=0)), "grid:") == \
        "none: an empty batch launches nothing"


def test_the_radix_grid_without_a_batch_size(default_policy):
    text = str(explain(default_policy, "sm_100", "bfloat16", 256, 131072))
    assert _line(text, "grid:") == "rows CTAs x 128 threads, 1 row per CTA (no batch size given)"
