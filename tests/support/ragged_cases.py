"""Ragged batches (issue 30) as the runtime and CLI tests draw and check them: each row's window
[starts[r], starts[r] + lengths[r]) and what the call must return for it, read from the
numpy reference over the window alone (and padding: index -1, value -inf for the largest,
+inf for the smallest, past the window's candidates)."""

from __future__ import annotations

import numpy as np

from topkgen.runtime import reference

from .topk_cases import BITS, SPECIAL_BITS


def special_lengths(k: int, n: int) -> list[int]:
    """The lengths every case includes: 0, 1, k - 1, k, k + 1 and n (those within [0, n])."""
    return sorted({length for length in (0, 1, k - 1, k, k + 1, n) if 0 <= length <= n})


def draw_windows(rows: int, k: int, n: int, rng: np.random.Generator, dtype: str = "int64",
                 boundaries: tuple[int, ...] = ()) -> tuple[np.ndarray, np.ndarray]:
    """Lengths from special_lengths then at random; starts at the row's start, middle and end
    in turn, and across each of `boundaries` (a split's chunk boundaries: a window that
    starts just before one and ends past it)."""
    specials = special_lengths(k, n)
    lengths = np.array([specials[r] if r < len(specials) else int(rng.integers(0, n + 1)) for r in range(rows)])
    starts = np.empty(rows, np.int64)
    for r in range(rows):
        room = n - lengths[r]
        starts[r] = (0, room // 2, room)[r % 3]
    for i, b in enumerate(boundaries):
        r = len(specials) + i
        if r < rows:
            lengths[r] = min(n, max(k + 1, int(rng.integers(1, n + 1))))
            starts[r] = max(0, min(b - int(rng.integers(1, k + 2)), n - lengths[r]))
    return lengths.astype(dtype), starts.astype(dtype)


def pad_bits(dtype: str, largest: bool) -> int:
    """The padding value's bits: -inf for the largest, +inf for the smallest."""
    _, _, pos_inf, neg_inf = SPECIAL_BITS[dtype][:4]
    return neg_inf if largest else pos_inf


def check_row(x_row: np.ndarray, values: np.ndarray, indices: np.ndarray, k: int, length: int, start: int,
              largest: bool, deterministic: bool, dtype: str, what: str) -> None:
    """One row of a ragged call against the reference over its window alone."""
    bits_t = BITS[dtype]
    taken = min(k, length)
    indices = indices.astype(np.int64)
    assert (indices[taken:] == -1).all(), f"{what}: padded indices are {indices[taken:]}"
    assert (values[taken:].view(bits_t) == pad_bits(dtype, largest)).all(), \
        f"{what}: padded values are {values[taken:]}"
    if taken == 0:
        return
    window = x_row[start:start + length][None]
    ref_values, ref_indices = reference.topk(window, taken, largest=largest)
    got_values, got_indices = values[:taken], indices[:taken]
    if deterministic:
        np.testing.assert_array_equal(got_indices, ref_indices[0] + start, err_msg=f"{what}: indices differ")
        np.testing.assert_array_equal(got_values.view(bits_t), ref_values[0].view(bits_t),
                                      err_msg=f"{what}: values differ")
        return
    assert ((got_indices >= start) & (got_indices < start + length)).all(), f"{what}: an index outside the window"
    assert len(np.unique(got_indices)) == taken, f"{what}: an index repeats"
    np.testing.assert_array_equal(got_values.view(bits_t), x_row[got_indices].view(bits_t),
                                  err_msg=f"{what}: values are not the inputs at the returned indices")
    np.testing.assert_array_equal(reference.select_keys(got_values, largest),
                                  reference.select_keys(ref_values[0], largest),
                                  err_msg=f"{what}: the selected keys differ from the reference")
