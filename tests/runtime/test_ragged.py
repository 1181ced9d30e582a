"""Ragged batches on the emulator through TopK (issue 30, point 5): lengths drawn from
{0, 1, k - 1, k, k + 1, n} and at random, windows at the row's start, middle and end and
across split-chunk boundaries, on every kernel family and work rung the default policy
serves (register ladder and exact register kernels, fixed-vector and dynamic radix, a split
row, the large-k path), every dtype, both directions and both modes, int32 and int64 lengths.
Each row is checked against the reference over its window alone, its padding exactly; in
deterministic mode the row also equals a dense call on the window where the same kernel
serves it.

The whole product is too slow for CI: each run draws a seeded sample of directions, modes and
length types for the fixed shapes (the seed is in every failure message;
TOPKGEN_SAMPLE_SEED=N replays one)."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest

from topkgen.runtime import TopK, TopKError

from ..support.ragged_cases import check_row, draw_windows
from ..support.topk_cases import make_rows

SEED = int(os.environ.get("TOPKGEN_SAMPLE_SEED", random.SystemRandom().randrange(1 << 30)))

# (what it serves, dtype, k, n, rows): the shapes, each served by another kernel of the policy
# (test_the_shapes_reach_every_family checks which).
SHAPES = [
    ("register ladder", "float32", 9, 700, 9),
    ("register ladder", "bfloat16", 16, 1024, 9),
    ("register exact", "float32", 20, 256, 9),
    ("radix fixed_vec", "float32", 50, 1000, 9),
    ("radix dynamic", "float16", 100, 20000, 9),
    ("radix dynamic", "float32", 1000, 40000, 8),
    ("split", "float32", 64, 131072, 8),
    ("large k", "bfloat16", 5000, 9000, 8),
]


@pytest.fixture(scope="module")
def op(built_bundle):
    return TopK(built_bundle, arch="sm_90", backend="emulator")


def _case(i: int, shape: tuple, seed: int) -> tuple:
    rng = random.Random(seed * 1000 + i)
    return shape + (rng.random() < 0.5, rng.random() < 0.5, rng.choice(("int32", "int64")))


def run_ragged(op, what, dtype, k, n, rows, largest, det, length_dtype, seed, dense_rows=2):
    rng = np.random.default_rng([seed, k, n])
    choice = op.choose(dtype, k, n, det, rows)
    plan = op.plan(dtype, k, n, rows, det)
    boundaries = tuple(c * plan.chunk for c in range(1, plan.chunks)) if plan is not None else ()
    lengths, starts = draw_windows(rows, k, n, rng, length_dtype, boundaries[:2])
    x = make_rows(dtype, rows, n, seed=int(rng.integers(1 << 30)))
    label = (f"seed {seed} (TOPKGEN_SAMPLE_SEED): {what} {dtype} k={k} n={n} rows={rows} "
             f"{'largest' if largest else 'smallest'} {'det' if det else 'fast'} {length_dtype} lengths, "
             f"{choice.kernel} x{choice.chunks}")
    values, indices = op(x, k, largest=largest, deterministic=det, lengths=lengths, starts=starts)
    assert values.shape == indices.shape == (rows, k), label
    for r in range(rows):
        check_row(x[r], values[r], indices[r], k, int(lengths[r]), int(starts[r]), largest, det, dtype,
                  f"{label}, row {r} window [{starts[r]}, {starts[r] + lengths[r]})")
    if det:  # the same rows alone, dense, on the same kernel (no other compile): bit for bit
        again = op(x, k, largest=largest, deterministic=det, lengths=lengths, starts=starts)
        np.testing.assert_array_equal(again[1], indices, err_msg=f"{label}: not the same run to run")
        same = [r for r in range(rows) if lengths[r] >= k
                and op.choose(dtype, k, int(lengths[r]), det, 1).kernel == choice.kernel]
        for r in same[:dense_rows]:
            window = np.ascontiguousarray(x[r:r + 1, starts[r]:starts[r] + lengths[r]])
            v, i = op(window, k, largest=largest, deterministic=True)
            np.testing.assert_array_equal(indices[r], i[0] + starts[r], err_msg=f"{label}: row {r} alone differs")
            np.testing.assert_array_equal(values[r].view(np.uint8), v[0].view(np.uint8),
                                          err_msg=f"{label}: row {r} alone differs")
    return choice


def test_the_shapes_reach_every_family(op):
    # each shape's kernel, by its spec's family and work rung (and exact n), and the split
    def served(dtype, k, n, rows):
        choice = op.choose(dtype, k, n, True, rows)
        spec = op._specs[choice.kernel]
        return spec.family, spec.work, choice.chunks

    got = {what: served(dtype, k, n, rows) for what, dtype, k, n, rows in SHAPES}
    assert got["register ladder"][:2] == ("register", "ladder")
    assert got["register exact"][:2] == ("register", "exact")
    assert got["radix fixed_vec"][:2] == ("radix", "fixed_vec")
    assert got["radix dynamic"][:2] == ("radix", "dynamic")
    assert got["split"][0] == "radix" and got["split"][2] > 1
    assert got["large k"][:2] == ("radix", "large")


@pytest.mark.parametrize("i", range(len(SHAPES)), ids=[f"{s[0]}-{s[1]}-k{s[2]}-n{s[3]}" for s in SHAPES])
def test_ragged_rows_are_their_windows(op, i):
    run_ragged(op, *_case(i, SHAPES[i], SEED), SEED)


def test_both_directions_and_modes_on_one_kernel(op):
    # every (largest, deterministic) pair on the register ladder, each dtype, int32 and int64
    for largest in (True, False):
        for det in (True, False):
            for dtype in ("float32", "bfloat16", "float16"):
                run_ragged(op, "register ladder", dtype, 7, 300, 7, largest, det,
                           "int32" if largest == det else "int64", SEED, dense_rows=0)


def test_a_split_row_across_its_chunks(op):
    # windows that start in one chunk and end in another, and ones inside the last chunk
    dtype, k, n, det = "bfloat16", 64, 131072, True
    plan = op.plan(dtype, k, n, 4, det)
    assert plan is not None and plan.chunks > 2
    c = plan.chunk
    starts = np.array([c - 5, 2 * c - 1, (plan.chunks - 1) * c + 3, 0], np.int32)
    lengths = np.array([c + 10, k - 1, n - starts[2], 3 * c + k], np.int32)
    x = make_rows(dtype, 4, n, seed=SEED)
    values, indices = op(x, k, deterministic=det, lengths=lengths, starts=starts)
    for r in range(4):
        check_row(x[r], values[r], indices[r], k, int(lengths[r]), int(starts[r]), True, det, dtype,
                  f"seed {SEED}: split row {r}")


def test_bad_windows_are_refused_naming_the_row(op):
    x = np.zeros((3, 500), np.float32)
    cases = [(np.array([10, 501, 3]), None, "lengths: row 1 has length 501, outside \\[0, n\\] = \\[0, 500\\]"),
             (np.array([10, -1, 3]), None, "lengths: row 1 has length -1"),
             (np.array([10, 10, 3]), np.array([0, 0, -2]), "starts: row 2 has start -2"),
             (np.array([10, 100, 3]), np.array([0, 450, 0]), "starts: row 1's window \\[450, 550\\)"),
             (np.array([1, 2], np.int32), None, "lengths: expected a contiguous array of shape \\[3\\]"),
             (np.array([1, 2, 3], np.int16), None, "lengths: expected int32 or int64 elements, got int16"),
             (np.array([1, 2, 3], np.int32), np.array([0, 0, 0], np.int64), "starts: expected int32 elements"),
             ([1, 2, 3], None, "lengths: the emulator backend takes numpy arrays, got list")]
    for lengths, starts, message in cases:
        with pytest.raises(TopKError, match=message):
            op(x, 4, lengths=lengths, starts=starts)
    with pytest.raises(TopKError, match="starts: given without lengths"):
        op(x, 4, starts=np.zeros(3, np.int64))
    with pytest.raises(TopKError, match="check: expected True or False"):
        op(x, 4, lengths=np.array([1, 2, 3]), check="yes")


def test_dense_calls_pass_null_windows(op):
    # no lengths: every launch's window pointers are null and window_bytes 0
    from topkgen.policy.split import stages

    for plan in (None, op.plan("float32", 64, 131072, 1)):
        for stage in stages(1, 131072, 64, True, plan):
            assert stage.buffers["lengths"] is None and stage.buffers["starts"] is None
            assert stage.scalars["window_bytes"] == 0 and stage.scalars["split_n"] == 0


@pytest.mark.parametrize("dtype, k, n", [("float32", 9, 700), ("float32", 50, 1000)])
def test_the_kernels_clamp_windows_outside_the_row(op, dtype, k, n):
    # what the GPU does with no check (the runtime's emulator refuses these before launching):
    # the kernel clamps S to [0, n], then L to [0, n - S]
    from topkgen.policy.split import stages
    from topkgen.runtime import arguments
    from topkgen.runtime.backend import Launch

    lengths = np.array([n + 100, -5, n // 2, 50, 3], np.int64)
    starts = np.array([0, 10, n - 100, -20, n + 7], np.int64)
    clamped_starts = np.clip(starts, 0, n)
    clamped_lengths = np.clip(lengths, 0, n - clamped_starts)
    rows = len(lengths)
    x = make_rows(dtype, rows, n, seed=SEED)
    choice = op.choose(dtype, k, n, True, rows)
    entry = op._entries[choice.kernel]
    launch = Launch.of(entry)
    values, indices = np.empty((rows, k), x.dtype), np.empty((rows, k), np.int64)
    (stage,) = stages(rows, n, k, True, None, window_bytes=8, starts=True, shared=launch.shared)
    pointers = {"x": x, "values": values, "indices": indices, "lengths": lengths, "starts": starts}
    op._kernel(choice).launch(choice.kernel, launch.grid(rows), launch.threads,
                              arguments(entry["params"], stage, pointers, None),
                              shared_bytes=stage.shared_bytes)
    for r in range(rows):
        check_row(x[r], values[r], indices[r], k, int(clamped_lengths[r]), int(clamped_starts[r]), True, True, dtype,
                  f"seed {SEED}: {choice.kernel} row {r} window [{starts[r]}, {starts[r] + lengths[r]}) clamped")


def test_an_exact_n_radix_kernel_reads_each_window(legacy_policy):
    # the legacy policy's exact-N radix kernels (n a compile-time constant) take a ragged
    # batch's windows too: a window is no longer n elements, so n comes from the window
    from topkgen.build.render import render
    from topkgen.emulator import compile_source
    from topkgen.manifest.params import params
    from topkgen.policy import all_kernels
    from topkgen.policy.split import stages
    from topkgen.runtime import arguments

    spec = next(s for s in all_kernels(legacy_policy, "sm_90")
                if s.family == "radix" and s.work == "exact" and s.mode == "deterministic" and s.dtype == "float32")
    k, n = spec.k, spec.exact_n
    rows = 8
    lengths, starts = draw_windows(rows, k, n, np.random.default_rng(SEED), "int32")
    x = make_rows("float32", rows, n, seed=SEED)
    values, indices = np.empty((rows, k), np.float32), np.empty((rows, k), np.int64)
    (stage,) = stages(rows, n, k, True, None, window_bytes=4, starts=True, shared=spec.shared)
    compile_source(render(spec), name=spec.name).launch(
        spec.name, -(-rows // spec.rows_per_block), spec.threads,
        arguments(params(spec), stage, {"x": x, "values": values, "indices": indices, "lengths": lengths,
                                        "starts": starts}, None), shared_bytes=stage.shared_bytes)
    for r in range(rows):
        check_row(x[r], values[r], indices[r], k, int(lengths[r]), int(starts[r]), True, True, "float32",
                  f"seed {SEED}: {spec.name} row {r}")
