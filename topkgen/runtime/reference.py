"""numpy top-k with exactly the kernels' contract.

For each row: the k values (input dtype) and int64 indices, sorted descending for largest and
ascending for smallest. NaN (any sign or payload) ranks above every number in both directions,
so it comes first for largest and last for smallest; -0.0 ranks just below +0.0; ties go to
the lower index. bfloat16 is accepted as ml_dtypes.bfloat16 or as raw uint16 with
dtype="bfloat16".
"""

from __future__ import annotations

import numpy as np

# (bits dtype, sign bit, exponent mask) per dtype.
_FORMATS = {"float32": (np.uint32, 0x80000000, 0x7F800000), "bfloat16": (np.uint16, 0x8000, 0x7F80),
            "float16": (np.uint16, 0x8000, 0x7C00)}


def dtype_name(x: np.ndarray, dtype: str | None = None) -> str:
    """The topkgen dtype name of an array (raw uint16 needs dtype= to say which 16-bit float)."""
    if dtype is not None:
        if dtype not in _FORMATS:
            raise ValueError(f"dtype: {dtype!r} is not one of {', '.join(_FORMATS)}")
        return dtype
    name = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}.get(str(x.dtype))
    if name is None:
        raise ValueError(f"dtype: arrays of {x.dtype} are not supported (float32, bfloat16, float16)")
    return name


def select_keys(x: np.ndarray, largest: bool = True, dtype: str | None = None) -> np.ndarray:
    """The selection key of every element as uint32: larger key ranks first."""
    name = dtype_name(x, dtype)
    bits_t, sign, exp = _FORMATS[name]
    bits = np.ascontiguousarray(x).view(bits_t).astype(np.uint32)
    full = np.uint32(0xFFFFFFFF if bits_t is np.uint32 else 0xFFFF)
    nan = (bits & np.uint32(~sign & int(full))) > exp
    key = np.where(bits & np.uint32(sign), ~bits & full, bits | np.uint32(sign))
    key = np.where(nan, full, key).astype(np.uint32)
    return key if largest else (~key & full).astype(np.uint32)


def topk(x: np.ndarray, k: int, *, largest: bool = True, dtype: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Top-k over the last axis of a [..., n] array; returns (values, int64 indices)."""
    x = np.asarray(x)
    n = x.shape[-1]
    if not 1 <= k <= n:
        raise ValueError(f"k: must be in [1, n={n}], got {k}")
    rows = x.reshape(-1, n)
    keys = select_keys(rows, largest, dtype).astype(np.int64)
    index = np.broadcast_to(np.arange(n, dtype=np.int64), rows.shape)
    order = np.lexsort((index, -keys), axis=-1)[:, :k]
    values = np.take_along_axis(rows, order, axis=-1)
    return values.reshape(*x.shape[:-1], k), order.reshape(*x.shape[:-1], k)
