"""Every k a user asks for, on the emulator through TopK: k in {1025, 2047, 2048, 2049, 4095,
4096, 4097, 10000, 65536, n - 1, n} over rows of up to 300,000 elements (the K=2048/4096
rungs, the large-k path and split rows), normal, uniform, ties, all-equal, NaN of both signs,
+-0 and 99% -inf rows, float32, bfloat16 and float16, largest and smallest, fast and
deterministic, sorted and unsorted, int64 and int32 indices.

The whole product is thousands of cases; each run draws a seeded sample of it (the seed is in
every failure message; TOPKGEN_SAMPLE_SEED=N replays one), plus fixed cases that every run
checks: k = n on the longest row, a split row at K=2048, and one case of every k."""

from __future__ import annotations

import itertools
import os
import random

import numpy as np
import pytest

from topkgen import policy as pol
from topkgen.runtime import TopK, reference

from ..support.topk_cases import BITS, NUMPY_DTYPES, SPECIAL_BITS

KS = (1025, 2047, 2048, 2049, 4095, 4096, 4097, 10000, 65536, "n-1", "n")
DATA = ("normal", "uniform", "ties", "all_equal", "nan_both_signs", "signed_zero", "neg_inf_99")
DTYPES = ("float32", "bfloat16", "float16")
SEED = int(os.environ.get("TOPKGEN_SAMPLE_SEED", random.SystemRandom().randrange(1 << 30)))
SAMPLE = 14


def make_row(dtype: str, n: int, data: str, rng: np.random.Generator) -> np.ndarray:
    t, bits_t = NUMPY_DTYPES[dtype], BITS[dtype]
    if data == "normal":
        return rng.standard_normal(n).astype(np.float32).astype(t)
    if data == "uniform":
        return rng.random(n).astype(np.float32).astype(t)
    if data == "ties":
        return rng.choice(np.array([-2.0, 0.0, 1.0, 3.0], np.float32), size=n).astype(t)
    if data == "all_equal":
        return np.full(n, 7.0, np.float32).astype(t)
    qnan, neg_nan, _, neg_inf = SPECIAL_BITS[dtype][:4]
    row = rng.standard_normal(n).astype(np.float32).astype(t)
    bits = row.view(bits_t)
    if data == "nan_both_signs":
        where = rng.random(n)
        bits[where < 0.02] = qnan
        bits[where > 0.98] = neg_nan
    elif data == "signed_zero":
        zeros = rng.random(n) < 0.5
        bits[zeros] = np.where(rng.random(int(zeros.sum())) < 0.5, 0, 1 << (8 * np.dtype(bits_t).itemsize - 1))
    else:  # 99% -inf
        bits[rng.random(n) < 0.99] = neg_inf
    return row


def check(x, values, indices, k, largest, deterministic, sorted_, index_dtype, dtype, what):
    ref_values, ref_indices = reference.topk(x, k, largest=largest)
    bits_t = BITS[dtype]
    assert indices.dtype == np.dtype(index_dtype), what
    indices = indices.astype(np.int64)
    if deterministic:  # the sorted call's result, bit for bit (unsorted: the same set, any stable order)
        if not sorted_:
            order = np.lexsort((indices, -reference.select_keys(values, largest).astype(np.int64)), axis=-1)
            values, indices = np.take_along_axis(values, order, -1), np.take_along_axis(indices, order, -1)
        np.testing.assert_array_equal(indices, ref_indices, err_msg=f"{what}: indices differ")
        np.testing.assert_array_equal(values.view(bits_t), ref_values.view(bits_t), err_msg=f"{what}: values differ")
        return
    rows, n = x.reshape(-1, x.shape[-1]).shape
    idx = indices.reshape(rows, k)
    assert ((idx >= 0) & (idx < n)).all(), f"{what}: index out of range"
    for r in range(rows):
        assert len(np.unique(idx[r])) == k, f"{what}: row {r} repeats an index"
    gathered = np.take_along_axis(x.reshape(rows, n), idx, axis=-1)
    np.testing.assert_array_equal(values.reshape(rows, k).view(bits_t), gathered.view(bits_t),
                                  err_msg=f"{what}: values are not the inputs at the returned indices")
    got, want = reference.select_keys(values, largest), reference.select_keys(ref_values, largest)
    if not sorted_:
        got = -np.sort(-got.astype(np.int64), axis=-1)
    np.testing.assert_array_equal(got, want, err_msg=f"{what}: the selected keys differ from the reference")


def run_case(op, case, seed):
    k_name, n, rows, data, dtype, largest, det, sorted_, index_dtype = case
    k = {"n-1": n - 1, "n": n}.get(k_name, k_name)
    rng = np.random.default_rng([seed, n, k])
    x = np.stack([make_row(dtype, n, data, rng) for _ in range(rows)])
    what = (f"seed {seed} (TOPKGEN_SAMPLE_SEED): k={k} n={n} rows={rows} {data} {dtype} "
            f"{'largest' if largest else 'smallest'} {'det' if det else 'fast'} sorted={sorted_} {index_dtype}")
    values, indices = op(x, k, largest=largest, deterministic=det, sorted=sorted_, index_dtype=index_dtype)
    check(x, values, indices, k, largest, det, sorted_, index_dtype, dtype, what)
    if det:  # the same order run to run, sorted or not
        again = op(x, k, largest=largest, deterministic=det, sorted=sorted_, index_dtype=index_dtype)
        np.testing.assert_array_equal(again[1], indices, err_msg=f"{what}: not the same order run to run")
    return op.choose(dtype, k, n, det, rows)


def sample(seed: int) -> list[tuple]:
    rng = random.Random(seed)
    cases = []
    for k_name in KS:  # every k once a run, the rest of the case drawn
        low = {"n-1": 4098, "n": 4098}.get(k_name, k_name)
        n = rng.choice([low, low + 1, rng.randint(low, 300_000), 300_000]) if isinstance(low, int) else low
        cases.append((k_name, max(n, low + (k_name == "n-1")), 1, rng.choice(DATA), rng.choice(DTYPES),
                      rng.random() < 0.5, rng.random() < 0.5, rng.random() < 0.5, rng.choice(("int64", "int32"))))
    product = list(itertools.product(KS, DATA, DTYPES, (True, False), (True, False), (True, False),
                                     ("int64", "int32")))
    for k_name, data, dtype, largest, det, sorted_, index_dtype in rng.sample(product, SAMPLE):
        low = 4097 if k_name in ("n-1", "n") else k_name
        n = rng.randint(low + 1, 300_000) if rng.random() < 0.7 else low + 1
        cases.append((k_name, n, rng.choice((1, 2)), data, dtype, largest, det, sorted_, index_dtype))
    return cases


@pytest.fixture(scope="module")
def op(built_bundle):
    return TopK(built_bundle, arch="sm_90", backend="emulator")


def test_the_fixed_cases(op):
    # k = n on the longest row; the large-k path at n - 1; K=2048 split over chunks (1 row of 163840)
    for case in [("n", 300_000, 1, "ties", "float32", True, True, True, "int64"),
                 ("n-1", 300_000, 1, "nan_both_signs", "bfloat16", False, True, False, "int32"),
                 (2048, 163_840, 1, "normal", "bfloat16", True, True, True, "int32"),
                 (2048, 163_840, 1, "neg_inf_99", "float32", True, False, False, "int64"),
                 (4096, 262_144, 2, "signed_zero", "float16", False, False, True, "int64")]:
        choice = run_case(op, case, 0)
        if case[0] == 2048:
            assert choice.chunks > 1, "1 x 163840 at K=2048 runs split"
        if case[0] in ("n", "n-1"):
            assert choice.kernel.startswith("topk_radix_large_"), choice


def test_a_sample_of_every_k(op):
    for case in sample(SEED):
        choice = run_case(op, case, SEED)
        k = {"n-1": case[1] - 1, "n": case[1]}.get(case[0], case[0])
        assert (k > 4096) == choice.kernel.startswith("topk_radix_large_"), (SEED, case, choice)


def test_the_options_are_checked(op):
    from topkgen.runtime import TopKError

    x = np.zeros((1, 5000), np.float32)
    with pytest.raises(TopKError, match="index_dtype: expected 'int64' or 'int32', got 'int16'"):
        op(x, 2048, index_dtype="int16")
    with pytest.raises(TopKError, match="sorted: expected True or False"):
        op(x, 2048, sorted="no")
    with pytest.raises(TopKError, match="out\\[1\\] \\(indices\\): expected int32 elements, got int64"):
        op(x, 2048, index_dtype="int32", out=(np.empty((1, 2048), np.float32), np.empty((1, 2048), np.int64)))
    assert pol.N_MAX == 2**31 - 1
