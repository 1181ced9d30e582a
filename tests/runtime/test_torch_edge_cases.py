"""torch.topk's edge cases, as a caller moving from it meets them (issue 32): k = 0 returns
empty results of shape [..., 0] and launches nothing; the order of the results is by value,
largest first (smallest first with largest=False)."""

from __future__ import annotations

import numpy as np
import pytest

from topkgen.runtime import TopK, TopKError


@pytest.fixture(scope="module")
def op(built_bundle):
    return TopK(built_bundle, arch="sm_90", backend="emulator")


def test_k_0_returns_empty_results_as_torch_topk_does(op):
    x = np.random.default_rng(0).standard_normal((3, 4, 100)).astype(np.float32)
    values, indices = op(x, 0)
    assert (values.shape, values.dtype, indices.shape, indices.dtype) == ((3, 4, 0), np.float32, (3, 4, 0), np.int64)
    values, indices = op(x, 0, largest=False, deterministic=True)
    assert values.shape == indices.shape == (3, 4, 0)
    assert op._loaded == {}  # nothing loaded, nothing compiled


def test_k_0_with_out_checks_and_returns_out(op):
    x = np.ones((2, 50), np.float32)
    out = (np.empty((2, 0), np.float32), np.empty((2, 0), np.int64))
    got = op(x, 0, out=out)
    assert got[0] is out[0] and got[1] is out[1]
    with pytest.raises(TopKError, match=r"^out\[0\] \(values\): expected a contiguous array of shape \[2, 0\]"):
        op(x, 0, out=(np.empty((2, 1), np.float32), out[1]))


def test_a_negative_k_is_refused_saying_0_is_allowed(op):
    with pytest.raises(TopKError, match=r"^k: must be >= 0 \(0 returns empty results\), got -1$"):
        op(np.ones((2, 50), np.float32), -1)


def test_results_are_sorted_largest_first_or_smallest_first(op):
    x = np.random.default_rng(1).permutation(200).astype(np.float32).reshape(2, 100)
    values, indices = op(x, 5)
    assert values.tolist() == [sorted(row, reverse=True)[:5] for row in x.tolist()]
    assert np.array_equal(np.take_along_axis(x, indices, -1), values)
    values, _ = op(x, 5, largest=False)
    assert values.tolist() == [sorted(row)[:5] for row in x.tolist()]
