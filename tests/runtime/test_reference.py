"""topkgen.runtime.reference implements the kernel contract exactly."""

from __future__ import annotations

import numpy as np
import pytest

from topkgen.runtime import reference


def test_nan_ranks_above_every_number_in_both_directions():
    x = np.array([1.0, np.nan, -np.inf, np.inf, -np.nan, 0.0], np.float32)
    vals, idx = reference.topk(x, 6, largest=True)
    assert idx.tolist() == [1, 4, 3, 0, 5, 2]
    vals, idx = reference.topk(x, 6, largest=False)
    assert idx.tolist() == [2, 5, 0, 3, 1, 4]


def test_negative_zero_ranks_just_below_positive_zero():
    x = np.array([0.0, -0.0, -0.0, 0.0, -1e-45], np.float32)
    _, idx = reference.topk(x, 5)
    assert idx.tolist() == [0, 3, 1, 2, 4]


def test_ties_go_to_the_lower_index():
    x = np.array([[2, 5, 5, 1, 5]], np.float32)
    _, idx = reference.topk(x, 2)
    assert idx.tolist() == [[1, 2]]
    _, idx = reference.topk(x, 2, largest=False)
    assert idx.tolist() == [[3, 0]]


def test_bfloat16_raw_bits_and_ml_dtypes_agree():
    import ml_dtypes
    x = np.array([1.5, -2.0, 3.0, np.nan], ml_dtypes.bfloat16)
    a = reference.topk(x, 3)
    b = reference.topk(x.view(np.uint16), 3, dtype="bfloat16")
    assert a[1].tolist() == b[1].tolist() == [3, 2, 0]


def test_bad_arguments():
    with pytest.raises(ValueError, match="k:"):
        reference.topk(np.zeros(3, np.float32), 4)
    with pytest.raises(ValueError, match="dtype:"):
        reference.topk(np.zeros(3, np.float64), 1)
