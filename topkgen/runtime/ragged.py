"""Ragged batches: `TopK(...)(x, k, lengths=L, starts=S)`. Row r's candidates are
x[r, S[r] : S[r] + L[r]]; the kernel and any split are chosen from x's row length n (the
bound), and the kernels read L and S on the device (topk_common.cuh, topk::Window), so a call
makes no host read, no synchronisation and (with a workspace) no allocation. Both arrays are
int32 or int64, one entry per row, of one type; the kernels take a pointer to each and the
element width (`window_bytes`).

Bad windows: the emulator refuses a length or start outside [0, n], or S + L > n, naming the
row, on every call (it holds the arrays on the host). On the GPU the kernels clamp each
window to its row (S to [0, n], then L to [0, n - S]) and nothing is read on the host, unless
the call asks for `check=True`, which copies both arrays to the host first (a synchronising
copy) and refuses as the emulator does."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from topkgen.runtime.backend import TopKError

WINDOW_DTYPES = {"int32": 4, "int64": 8}


@dataclass(frozen=True)
class Windows:
    """A call's ragged batch as its launches pass it: the lengths (and starts) buffers by
    the names of the kernel parameters, and their element width."""

    window_bytes: int
    pointers: dict[str, Any]

    @property
    def has_starts(self) -> bool:
        return "starts" in self.pointers


def check_array(label: str, shape: tuple[int, ...], found_shape: tuple[int, ...], contiguous: bool, found: str,
                lengths_dtype: str | None = None) -> int:
    """One window array's layout: one entry per row of x (x's leading shape, or flat), C
    order, int32 or int64 (`starts` of the lengths' type). Returns its element width."""
    rows = int(np.prod(shape)) if shape else 1
    if tuple(found_shape) not in (tuple(shape), (rows,)) or not contiguous:
        raise TopKError(f"{label}: expected a contiguous array of shape {list(shape)} (one entry per row of x), got "
                        f"{'a non-contiguous one of ' if tuple(found_shape) in (tuple(shape), (rows,)) else ''}"
                        f"{list(found_shape)}")
    if found not in WINDOW_DTYPES:
        raise TopKError(f"{label}: expected int32 or int64 elements, got {found}")
    if lengths_dtype is not None and found != lengths_dtype:
        raise TopKError(f"{label}: expected {lengths_dtype} elements, as lengths holds (the kernels read both with "
                        f"one width), got {found}")
    return WINDOW_DTYPES[found]


def check_values(lengths: np.ndarray, starts: np.ndarray | None, n: int) -> None:
    """Refuse a window outside the row, naming the first row that has one: a length or start
    outside [0, n], or start + length > n."""
    lengths = lengths.reshape(-1).astype(np.int64)
    for label, array in (("lengths", lengths), ("starts", None if starts is None else starts.reshape(-1))):
        if array is None:
            continue
        bad = np.flatnonzero((array < 0) | (array > n))
        if bad.size:
            r = int(bad[0])
            raise TopKError(f"{label}: row {r} has {label[:-1]} {int(array[r])}, outside [0, n] = [0, {n}]")
    if starts is not None:
        ends = starts.reshape(-1).astype(np.int64) + lengths
        bad = np.flatnonzero(ends > n)
        if bad.size:
            r = int(bad[0])
            raise TopKError(f"starts: row {r}'s window [{int(starts.reshape(-1)[r])}, {int(ends[r])}) (starts + "
                            f"lengths) ends past the row's n = {n}")
