"""The kernels' output flags (manifest schema 5), run on the emulator with the arguments a
runtime call gives them: `unsorted` skips the final sort (the warp sort of K <= 64, the block
sort above it, the large-k path's global sort) and returns the sorted launch's set; a
deterministic kernel sorts anyway (the order it returns is the sorted one, bit for bit);
`int32_indices` makes the kernel write int32 indices into an array of exactly rows x k int32
(the emulator's guard zones fail a launch that writes past it), and the large-k path then
takes its candidates in `scratch`. The skipped sort is read off the "sort and output"
phase's counters, barriers and shuffles."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

from topkgen import policy as pol
from topkgen.build.render import render
from topkgen.emulator import compile_source
from topkgen.manifest.params import OUTPUT_FLAGS, output_flags, params
from topkgen.policy.planning import largest_rung
from topkgen.policy.split import scratch_bytes, stages
from topkgen.runtime import arguments, reference

from ..support.topk_cases import BITS, make_rows

SORT = "sort and output"


@lru_cache(maxsize=None)
def _module(spec):
    return compile_source(render(spec), name=spec.name)


def _spec(dtype: str, k: int, n: int, deterministic: bool):
    return pol.select(pol.load(), "sm_90", dtype, k, n, deterministic=deterministic).kernel


def _launch(spec, x: np.ndarray, k: int, sorted_: bool = True, index_dtype: str = "int64"):
    rows, n = x.shape
    values = np.zeros((rows, k), x.dtype)
    indices = np.full((rows, k), -1, np.dtype(index_dtype))  # exactly rows x k of the index type
    takes_scratch = "scratch" in {p["name"] for p in params(spec)}
    scratch = takes_scratch and index_dtype == "int32"
    pointers = {"x": x, "values": values, "indices": indices}
    if scratch:
        pointers["scratch"] = np.zeros(scratch_bytes(rows, k), np.uint8)
    (stage,) = stages(rows, n, k, True, None, flags=output_flags(sorted_, index_dtype), scratch=scratch,
                      shared=spec.shared)
    counts = _module(spec).launch(spec.name, (rows + spec.rows_per_block - 1) // spec.rows_per_block, spec.threads,
                                  arguments(params(spec), stage, pointers, None),
                                  shared_bytes=stage.shared_bytes, counters=True)
    return values, indices, counts


def _sort_work(counts) -> tuple[int, int]:
    phase = counts.phases.get(SORT)
    return (phase.barriers, phase.shuffles) if phase is not None else (0, 0)


def _same_set(x, values, indices, k, dtype, what):
    """Each row's (index, value) pairs are a correct top k: the reference's keys, distinct
    indices, values that are the input at those indices."""
    ref_values, _ = reference.topk(x, k, largest=True)
    idx = indices.astype(np.int64)
    for r in range(x.shape[0]):
        assert len(set(idx[r].tolist())) == k, f"{what}: row {r} repeats an index"
    np.testing.assert_array_equal(values.view(BITS[dtype]), np.take_along_axis(x, idx, -1).view(BITS[dtype]),
                                  err_msg=f"{what}: values are not the input at the indices")
    got = np.sort(reference.select_keys(values, True).astype(np.int64), axis=-1)
    want = np.sort(reference.select_keys(ref_values, True).astype(np.int64), axis=-1)
    np.testing.assert_array_equal(got, want, err_msg=f"{what}: not the top-k keys")


# (dtype, k, n): the warp sort (K <= 64), the block sort, the large-k path (k above every rung).
CASES = [("float32", 40, 3000), ("float32", 256, 5000), ("bfloat16", 700, 9000)]


@pytest.mark.parametrize("dtype,k,n", CASES + [("bfloat16", None, 12000)])
def test_unsorted_skips_the_final_sort_and_returns_the_sorted_set(dtype, k, n):
    if k is None:  # the large-k path: above the largest K rung
        k = largest_rung(pol.load(), "sm_90", dtype) + 1000
    spec = _spec(dtype, k, n, False)
    x = make_rows(dtype, 3, n, seed=k)
    sv, si, sc = _launch(spec, x, k)
    uv, ui, uc = _launch(spec, x, k, sorted_=False)
    what = f"{spec.name} k={k}"
    _same_set(x, sv, si, k, dtype, what + " sorted")
    _same_set(x, uv, ui, k, dtype, what + " unsorted")
    sorted_keys = reference.select_keys(sv, True).astype(np.int64)
    assert (np.diff(sorted_keys, axis=-1) <= 0).all(), what  # the sorted launch is sorted
    barriers, shuffles = _sort_work(sc)
    assert barriers + shuffles > 0, what
    assert _sort_work(uc) == (0, 0), f"{what}: the unsorted launch still sorts: {_sort_work(uc)}"
    assert uc.barriers < sc.barriers or uc.shuffles < sc.shuffles, what


@pytest.mark.parametrize("dtype,k,n", CASES)
def test_a_deterministic_kernel_returns_the_sorted_order_unsorted(dtype, k, n):
    spec = _spec(dtype, k, n, True)
    x = make_rows(dtype, 3, n, seed=k + 1)
    sv, si, sc = _launch(spec, x, k)
    uv, ui, uc = _launch(spec, x, k, sorted_=False)
    ref_values, ref_indices = reference.topk(x, k, largest=True)
    np.testing.assert_array_equal(si, ref_indices)
    np.testing.assert_array_equal(ui, si)
    np.testing.assert_array_equal(uv.view(BITS[dtype]), sv.view(BITS[dtype]))
    assert _sort_work(uc) == _sort_work(sc)


@pytest.mark.parametrize("dtype,k,n,deterministic", [(d, k, n, det) for d, k, n in CASES for det in (False, True)]
                         + [("float32", 16, 1000, True)])
def test_int32_indices_are_written_by_the_kernel(dtype, k, n, deterministic):
    """The int32 launch writes what the int64 one does, into 4-byte slots; the array holds
    exactly rows x k of them, so a kernel writing 8-byte indices fails the guard check."""
    spec = _spec(dtype, k, n, deterministic)
    x = make_rows(dtype, 2, n, seed=k + 2)
    wv, wi, _ = _launch(spec, x, k)
    nv, ni, _ = _launch(spec, x, k, index_dtype="int32")
    assert ni.dtype == np.int32
    if deterministic:
        np.testing.assert_array_equal(ni.astype(np.int64), wi)
        np.testing.assert_array_equal(nv.view(BITS[dtype]), wv.view(BITS[dtype]))
    else:
        _same_set(x, nv, ni, k, dtype, f"{spec.name} int32")


def test_the_large_k_path_takes_int32_indices_through_scratch():
    dtype, n = "float32", 9000
    k = largest_rung(pol.load(), "sm_90", dtype) + 17
    spec = _spec(dtype, k, n, True)
    names = [p["name"] for p in params(spec)]
    assert spec.work == "large" and names[-1] == "scratch" and "flags" in names
    x = make_rows(dtype, 2, n, seed=5)
    for sorted_ in (True, False):
        v, i, _ = _launch(spec, x, k, sorted_=sorted_, index_dtype="int32")
        ref_values, ref_indices = reference.topk(x, k, largest=True)
        np.testing.assert_array_equal(i.astype(np.int64), ref_indices)
        np.testing.assert_array_equal(v.view(BITS[dtype]), ref_values.view(BITS[dtype]))


def test_the_flag_bits_are_the_templates():
    """topkgen.manifest.params.OUTPUT_FLAGS (what the manifest states) and the numbers the
    kernels test (templates/topk_common.cuh) are one table."""
    import re

    from topkgen.build.render import template_dir

    text = (template_dir() / "topk_common.cuh").read_text()
    found = re.search(r"constexpr int kUnsorted = (\d+), kInt32Indices = (\d+);", text)
    assert found is not None
    assert OUTPUT_FLAGS == {"unsorted": int(found[1]), "int32_indices": int(found[2])}


@pytest.mark.parametrize("dtype,k,n", [("float32", 128, 3000), ("bfloat16", 256, 5000), ("float32", 512, 6000),
                                       ("bfloat16", 1024, 9000)])
def test_the_block_sort_holds_8_candidates_a_thread(dtype, k, n):
    """A holding thread takes 8 candidates: K <= 256 sorts on one warp, whose only barrier is
    the one after the sort; above, warps hold runs of 256, and each merge of runs costs a
    barrier to share them and one per stage across warps (one candidate a thread took 10
    barriers at K = 256)."""
    spec = _spec(dtype, k, n, False)
    assert spec.k == k, spec.name
    rows = 2
    x = make_rows(dtype, rows, n, seed=k + 3)
    values, indices, counts = _launch(spec, x, k)
    _same_set(x, values, indices, k, dtype, spec.name)
    assert (np.diff(reference.select_keys(values, True).astype(np.int64), axis=-1) <= 0).all(), spec.name
    merges = range(1, (k // 256).bit_length())  # runs of 256 merged into 512, 1024: s stages each
    assert counts.phases[SORT].barriers == rows * (1 + sum(1 + s for s in merges)), spec.name
