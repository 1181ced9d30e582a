"""Index arithmetic of the kernels' row access for rows up to 2^31 - 1 elements, without
touching 8 GB: the row lives in a sparse mapping whose first and last pages alone are
readable, behind an 8 GiB guard of inaccessible address space, and the test drives only
step 0 and the last steps of the row. An index that wraps to a negative int reads inside
the guard, which the emulator reports as a fault.

Stable entry point (a rewrite of the row access must keep it, or adapt the test kernel in
tests/support/kernels/row_index.cu and nothing else):
    topk::RowView<Bits, THREADS, BODY_VECTORS, TAIL_STEPS, UNROLL> view(const Bits* row, int n);
    int view.steps();                                   // steps that cover the row
    view.for_each<false>(f, first_step, end_step);
        // calls f(uint4 piece, int first, int count) for this thread's pieces of those steps:
        // count elements (topk::piece_element) at indices first, first + 1, ...
What must hold: every key a step returns is the row's element at its index, no element is
returned twice, and the last steps reach the row's last elements.
"""

from __future__ import annotations

import ctypes
import mmap
from pathlib import Path

import numpy as np
import pytest

from topkgen.emulator import compile_source
from topkgen.build.render import device_library

KERNEL = Path(__file__).resolve().parents[1] / "support" / "kernels" / "row_index.cu"
GUARD = (8 << 30) + (1 << 20)  # more than any wrapped int index reaches before the row
EDGE = 4 << 20                 # readable bytes at each end of the row
MAX_N = 2**31 - 1
LAST_STEPS = 6
UNROLL_MAX = 4  # vectors per thread a step in the test kernels
PROT_NONE, MAP_NORESERVE = 0, 0x4000  # Linux values; this Python's mmap module lacks them

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


def pattern(index: np.ndarray, bits: int) -> np.ndarray:
    """The key stored at each index: distinct neighbours, so a misplaced read shows."""
    return ((index.astype(np.uint64) * np.uint64(2654435761)) >> np.uint64(7)) & np.uint64((1 << bits) - 1)


class SparseRow:
    """A row of n elements at `address`, readable only within EDGE bytes of either end."""

    def __init__(self, n: int, itemsize: int, offset: int) -> None:
        page = mmap.PAGESIZE
        row_bytes = n * itemsize
        self.length = GUARD + offset + row_bytes + page + (1 << 20)
        base = _libc.mmap(None, self.length, PROT_NONE,
                          mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
        if base in (None, ctypes.c_void_p(-1).value):
            pytest.skip(f"cannot reserve {self.length >> 30} GiB of address space (errno {ctypes.get_errno()})")
        self.base = base
        self.address = base + GUARD + offset
        self.itemsize, self.n = itemsize, n
        dtype = {4: np.uint32, 2: np.uint16}[itemsize]
        for lo, hi in ((0, min(n, EDGE // itemsize)), (max(0, n - EDGE // itemsize), n)):
            start = (self.address + lo * itemsize) // page * page
            end = -(-(self.address + hi * itemsize) // page) * page
            if _libc.mprotect(start, end - start, mmap.PROT_READ | mmap.PROT_WRITE) != 0:
                raise OSError(ctypes.get_errno(), "mprotect")
            view = np.ctypeslib.as_array((ctypes.c_ubyte * ((hi - lo) * itemsize)).from_address(
                self.address + lo * itemsize)).view(dtype)
            view[:] = pattern(np.arange(lo, hi), 8 * itemsize).astype(dtype)

    def close(self) -> None:
        _libc.munmap(self.base, self.length)


@pytest.fixture(scope="module")
def module():
    return compile_source(device_library() + KERNEL.read_text(), name="row_index")


CASES = [  # kernel, threads, itemsize, n, byte offset of the row start
    ("rows_f32_t256_fixed4", 256, 4, MAX_N, 0),
    ("rows_f32_t256_fixed4", 256, 4, MAX_N - 2, 4),
    ("rows_f32_t256_runtime", 256, 4, MAX_N, 8),
    ("rows_f32_t256_runtime", 256, 4, 2**31 - 4 * 256, 0),
    ("rows_f32_t1024_fixed4", 1024, 4, MAX_N - 4096, 12),
    ("rows_b16_t256_fixed4", 256, 2, MAX_N, 2),
    ("rows_b16_t1024_runtime", 1024, 2, MAX_N, 14),
]


@pytest.mark.parametrize("kernel,threads,itemsize,n,offset", CASES,
                         ids=[f"{c[0]}-n{c[3]}-off{c[4]}" for c in CASES])
def test_row_end_reads_inside_the_row(module, kernel, threads, itemsize, n, offset):
    row = SparseRow(n, itemsize, offset)
    try:
        slots = threads * (1 + LAST_STEPS * UNROLL_MAX) * 8
        indices, keys = np.full(slots, -1, np.int64), np.zeros(slots, np.uint32)
        module.launch(kernel, 1, threads, [np.uint64(row.address), np.int32(n), np.int32(LAST_STEPS), indices, keys])
    finally:
        row.close()
    visited = indices >= 0
    got, got_keys = indices[visited], keys[visited]
    assert got.size and (got < n).all(), "an index outside the row"
    assert len(np.unique(got)) == got.size, "an element loaded twice"
    np.testing.assert_array_equal(got_keys, pattern(got, 8 * itemsize).astype(np.uint32),
                                  err_msg="a key that is not the row's element at its index")
    assert set(range(n - 64, n)) <= set(got.tolist()), "the last steps do not reach the row's end"
