"""The runtime API's arguments, as a hostile caller passes them: every one the runtime cannot
serve is refused with a TopKError naming it, before any work is done or anything written, and
arguments that mean the same are taken the same way by every method (emulator backend; the
cuda backend shares the checks)."""

from __future__ import annotations

import numpy as np
import pytest

from topkgen.runtime import TopK, TopKError

from .topk_cases import make_rows


@pytest.fixture(scope="module")
def op(built_bundle):
    return TopK(built_bundle, arch="sm_90", backend="emulator")


def test_numpy_integers_are_taken_by_every_method(op):
    """What x.shape or arithmetic on arrays gives is an integer everywhere, not only in __call__."""
    k, n, rows = np.int64(64), np.int32(4096), np.uint8(3)
    assert op.choose("float32", k, n, rows=rows) == op.choose("float32", 64, 4096, rows=3)
    assert op.plan("float32", k, n, rows) == op.plan("float32", 64, 4096, 3)
    assert op.workspace_bytes("float32", k, n, rows) == op.workspace_bytes("float32", 64, 4096, 3)
    assert str(op.explain("float32", k, n, rows=rows)) == str(op.explain("float32", 64, 4096, rows=3))
    x = make_rows("float32", 3, 4096, seed=1)
    assert all(np.array_equal(a, b) for a, b in zip(op(x, k), op(x, 64)))
    for bad in (True, np.True_, 64.0, "64", None):
        with pytest.raises(TopKError, match=r"^k: must be an integer, got "):
            op.workspace_bytes("float32", bad, 4096, 3)
    with pytest.raises(TopKError, match=r"^n: must be an integer, got 4096\.0$"):
        op.choose("float32", 64, 4096.0)
    with pytest.raises(TopKError, match=r"^rows: must be an integer, got False$"):
        op.plan("float32", 64, 4096, False)
    with pytest.raises(TopKError, match=r"^k: must be an integer, got True$"):
        op(x, True)


def test_a_batch_of_no_rows_needs_no_workspace(op):
    """A call on 0 rows launches nothing; the methods that size its workspace agree."""
    assert op.workspace_bytes("float32", 16, 262144, 1) > 0  # one row of this length is split
    assert op.workspace_bytes("float32", 16, 262144, 0) == 0
    assert op.plan("float32", 16, 262144, 0) is None
    assert op.choose("float32", 16, 262144, rows=0) == op.choose("float32", 16, 262144)
    values, indices = op(np.zeros((0, 262144), np.float32), 16)
    assert values.shape == indices.shape == (0, 16)
    with pytest.raises(TopKError, match=r"^rows: must be >= 0, got -1$"):
        op.workspace_bytes("float32", 16, 262144, -1)


def test_dtypes_are_named_as_on_the_command_line(op):
    """The CLI's short spellings (one table, topkgen.suggest's) name the same dtypes here."""
    assert op.choose("bf16", 64, 4096) == op.choose("bfloat16", 64, 4096)
    assert op.workspace_bytes("FP32", 16, 262144, 1) == op.workspace_bytes("float32", 16, 262144, 1)
    assert op.explain("half", 8, 100).kernel.dtype == "float16"
    x = make_rows("float32", 2, 300, seed=2)
    assert all(np.array_equal(a, b) for a, b in zip(op(x, 5, dtype="fp32"), op(x, 5)))
    raw = make_rows("float16", 2, 300, seed=3)
    assert all(np.array_equal(a.view(np.uint16), b.view(np.uint16))
               for a, b in zip(op(raw.view(np.uint16), 5, dtype="fp16"), op(raw, 5)))
    with pytest.raises(TopKError, match=r"^dtype: 'fp16' \(float16\) does not match the array's float32$"):
        op(x, 5, dtype="fp16")
    with pytest.raises(TopKError, match=r"^dtype: raw uint16 input must be bfloat16 or float16, got 'f32' \(float32\)$"):
        op(raw.view(np.uint16), 5, dtype="f32")
    with pytest.raises(TopKError, match=r"^dtype: expected a name such as 'float32' or 'bf16', got <class"):
        op.choose(np.float32, 5, 300)
    with pytest.raises(TopKError, match=r"^dtype: expected a name"):
        op(x, 5, dtype=np.dtype(np.float32))


def test_big_endian_arrays_are_refused_for_their_byte_order(op):
    x = make_rows("float32", 2, 300, seed=4)
    swapped = x.astype(">f4")
    message = (r"^x: byte order: its elements are big-endian \(>f4\), the kernels read the machine's; "
               r"convert with x\.astype\(x\.dtype\.newbyteorder\('='\)\)$")
    with pytest.raises(TopKError, match=message):
        op(swapped, 5)
    converted = swapped.astype(swapped.dtype.newbyteorder("="))  # what the message says to do
    assert all(np.array_equal(a, b) for a, b in zip(op(converted, 5), op(x, 5)))
    from topkgen.runtime import _device_array, dtype_name

    class Interface:  # a device array as the cuda backend reads it, big-endian
        __cuda_array_interface__ = {"typestr": ">f4", "shape": (2, 300), "strides": None, "data": (1 << 40, False),
                                    "version": 3}

    with pytest.raises(TopKError, match=message):
        dtype_name(_device_array(Interface(), "x")[3], None)


def test_the_constructor_names_an_argument_of_the_wrong_type(built_bundle):
    with pytest.raises(TopKError, match=r"^arch: expected a name such as 'sm_90' \(a str\), got int 90$"):
        TopK(built_bundle, arch=90, backend="emulator")
    with pytest.raises(TopKError, match=r"^bundle: expected a path \(str or os\.PathLike\), got NoneType None$"):
        TopK(None, arch="sm_90", backend="emulator")
    with pytest.raises(TopKError, match=r"^bundle: expected a path .*, got bytes b'out'$"):
        TopK(b"out", arch="sm_90", backend="emulator")
    with pytest.raises(TopKError, match=r"^backend: \['emulator'\] is not one of cuda, emulator$"):
        TopK(built_bundle, arch="sm_90", backend=["emulator"])
    assert TopK(str(built_bundle), arch="sm_90", backend="emulator").arch == "sm_90"


def test_a_0_d_array_has_no_rows_to_take_the_top_of(op):
    for x in (np.array(3.0, np.float32), np.array(3, np.uint16)):
        with pytest.raises(TopKError, match=r"^x: expected at least one dimension of size >= 1, got shape \(\)$"):
            op(x, 1)
    values, indices = op(np.array([3.0, 1.0, 2.0], np.float32), 1)  # one dimension: one row
    assert (values.tolist(), indices.tolist()) == ([3.0], [0])
