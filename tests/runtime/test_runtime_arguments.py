"""The runtime API's arguments, as a hostile caller passes them: every one the runtime cannot
serve is refused with a TopKError naming it, before any work is done or anything written, and
arguments that mean the same are taken the same way by every method (emulator backend; the
cuda backend shares the checks)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from topkgen.runtime import TopK, TopKError

from ..support.topk_cases import make_rows


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


def test_yes_no_arguments_are_bools_not_whatever_python_finds_truthy(op):
    """`largest="no"` served the largest and `deterministic="no"` the deterministic kernel:
    a string, None or a number is refused by name; numpy's bools are taken as bools."""
    x = make_rows("float32", 2, 4096, seed=3)
    smallest = op(x, 8, largest=False)
    assert all(np.array_equal(a, b) for a, b in zip(op(x, 8, largest=np.False_), smallest))
    assert op.choose("float32", 64, 4096, np.True_) == op.choose("float32", 64, 4096, True)
    for bad in ("no", None, 0, 1.0):
        with pytest.raises(TopKError, match=rf"^largest: expected True or False, got {re.escape(repr(bad))}$"):
            op(x, 8, largest=bad)
        with pytest.raises(TopKError, match=rf"^deterministic: expected True or False, got {re.escape(repr(bad))}$"):
            op(x, 8, deterministic=bad)
        for method in (op.choose, op.explain):
            with pytest.raises(TopKError, match=r"^deterministic: expected True or False"):
                method("float32", 8, 4096, bad)
        for method in (op.plan, op.workspace_bytes):
            with pytest.raises(TopKError, match=r"^deterministic: expected True or False"):
                method("float32", 8, 4096, 2, bad)


def test_a_batch_of_no_rows_needs_no_workspace(op):
    """A call on 0 rows launches nothing; the methods that size its workspace agree."""
    assert op.workspace_bytes("float32", 16, 262144, 1) > 0  # one row of this length is split
    assert op.workspace_bytes("float32", 16, 262144, 0) == 0
    assert op.plan("float32", 16, 262144, 0) is None
    assert op.choose("float32", 16, 262144, rows=0) == op.choose("float32", 16, 262144)
    explained = op.explain("float32", 16, 262144, rows=0)  # once "(no batch size given)", rows null
    assert explained.record()["request"]["rows"] == 0 and explained.split_words() == "none: an empty batch launches nothing"
    values, indices = op(np.zeros((0, 262144), np.float32), 16)
    assert values.shape == indices.shape == (0, 16)
    with pytest.raises(TopKError, match=r"^rows: must be >= 0, got -1$"):
        op.workspace_bytes("float32", 16, 262144, -1)


def test_sizing_a_workspace_needs_the_batch_size(op):
    """rows=None (choose's "batch unknown", served unsplit) sized no workspace: 0 bytes, while
    the call on one row of 262144 needs one. plan and workspace_bytes refuse it by name."""
    assert op.workspace_bytes("float32", 16, 262144, 1) > 0
    for method in (op.plan, op.workspace_bytes):
        with pytest.raises(TopKError) as err:
            method("float32", 16, 262144, None)
        assert str(err.value) == ("rows: expected the batch's row count (an integer), got None: how a batch splits, "
                                  "and the workspace it needs, depend on it")


def test_dtypes_are_named_as_on_the_command_line(op):
    """The CLI's short spellings (one table, topkgen.common.suggest's) name the same dtypes here."""
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
    with pytest.raises(TopKError, match=r"^dtype: raw uint16 input must be bfloat16 or float16, got 'f32' \(float32\)"):
        op(raw.view(np.uint16), 5, dtype="f32")
    with pytest.raises(TopKError, match=r"^dtype: expected a name such as 'float32' or 'bf16', got <class"):
        op.choose(np.float32, 5, 300)
    with pytest.raises(TopKError, match=r"^dtype: expected a name"):
        op(x, 5, dtype=np.dtype(np.float32))


def test_a_mistyped_dtype_gets_the_same_words_from_every_method(op):
    """choose, plan, workspace_bytes and explain said "'flaot32' is not in the bundle (known:
    ...)" and suggested nothing, while dtype= on a call and the command line's --dtype name
    the choices and suggest float32 (suggest.unknown_dtype's words, all of them)."""
    expect = ("dtype: 'flaot32' is not one of float32, bfloat16, float16 (or fp32, f32, bf16, fp16, f16, half); "
              "did you mean float32?")
    for method, arguments in ((op.choose, (64, 4096)), (op.explain, (64, 4096)), (op.plan, (64, 4096, 3)),
                              (op.workspace_bytes, (64, 4096, 3))):
        with pytest.raises(TopKError) as err:
            method("flaot32", *arguments)
        assert str(err.value) == expect, method.__name__
    with pytest.raises(TopKError) as err:
        op(make_rows("float32", 2, 300, seed=11), 5, dtype="flaot32")
    assert str(err.value) == expect


def test_big_endian_arrays_are_refused_for_their_byte_order(op):
    x = make_rows("float32", 2, 300, seed=4)
    swapped = x.astype(">f4")
    message = (r"^x: byte order: its elements are big-endian \(>f4\), the kernels read the machine's; "
               r"convert with x\.astype\(x\.dtype\.newbyteorder\('='\)\)$")
    with pytest.raises(TopKError, match=message):
        op(swapped, 5)
    converted = swapped.astype(swapped.dtype.newbyteorder("="))  # what the message says to do
    assert all(np.array_equal(a, b) for a, b in zip(op(converted, 5), op(x, 5)))
    from topkgen.runtime import dtype_name
    from topkgen.runtime.cuda_backend import _device_array

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


def _sentinel(shape, dtype) -> np.ndarray:
    return np.full(shape, 7, dtype)


def test_bad_out_arrays_are_refused_before_any_work(op):
    """Each refusal leaves the arrays as they were (nothing launched, nothing written)."""
    x = make_rows("float32", 2, 300, seed=5)
    good = (_sentinel((2, 4), np.float32), _sentinel((2, 4), np.int64))
    read_only = _sentinel((2, 4), np.float32)
    read_only.flags.writeable = False
    bad = {
        "out: expected a pair of arrays (values, indices), got a tuple of 3": (*good, good[1].copy()),
        "out: expected a pair of arrays (values, indices), got a ndarray": good[0],
        "out[0] (values): the emulator backend takes numpy arrays, got list": ([[7.0] * 4] * 2, good[1]),
        "out[1] (indices): the emulator backend takes numpy arrays, got list": (good[0], [[7] * 4] * 2),
        "out[0] (values): the array is read-only": (read_only, good[1]),
        "out[1] (indices): expected int64 elements, got int32": (good[0], _sentinel((2, 4), np.int32)),
        "out[0] (values): expected float32 elements, got float64": (_sentinel((2, 4), np.float64), good[1]),
        "out[0] (values): expected a contiguous array of shape [2, 4], got [2, 5]": (_sentinel((2, 5), np.float32),
                                                                                   good[1]),
        "out[1] (indices): expected a contiguous array of shape [2, 4], got a non-contiguous one of [2, 4]":
            (good[0], _sentinel((4, 2), np.int64).T),
    }
    for message, out in bad.items():
        with pytest.raises(TopKError) as err:
            op(x, 4, out=out)
        assert str(err.value) == message
        for array in (out if isinstance(out, tuple) else (out,)):
            assert np.all(np.asarray(array) == 7), message
    values, indices = op(x, 4, out=list(good))  # a list of two arrays is a pair too
    assert values is good[0] and indices is good[1] and np.array_equal(values, op(x, 4)[0])


def test_every_argument_is_checked_before_a_kernel_is_loaded_or_compiled(built_bundle):
    """__call__ loaded the kernel (JIT-compiling it where the bundle leaves it to JIT) and only
    then checked out= and workspace=: a bad out cost a compile, and the backends refused in
    different orders. Now nothing is loaded for a refused call (the runtime's loaded-kernel
    set stays empty); the same call with good arguments loads its kernel."""
    op = TopK(built_bundle, arch="sm_90", backend="emulator")  # its own: nothing loaded yet
    x = make_rows("float16", 2, 3000, seed=12)
    assert op.choose("float16", 7, 3000).source == "jit"  # float16: compiled on first use
    good = (np.zeros((2, 7), np.float16), np.zeros((2, 7), np.int64))
    bad = {"out[0] (values): expected a contiguous array of shape [2, 7], got [2, 8]":
               (np.zeros((2, 8), np.float16), good[1]),
           "out[1] (indices): expected int64 elements, got int32": (good[0], np.zeros((2, 7), np.int32)),
           "out: expected a pair of arrays (values, indices), got a ndarray": good[0]}
    for message, out in bad.items():
        with pytest.raises(TopKError) as err:
            op(x, 7, out=out)
        assert str(err.value) == message
        assert op._loaded == {}, message
    split = make_rows("float32", 1, 262144, seed=13)
    need = op.workspace_bytes("float32", 16, 262144, 1)
    with pytest.raises(TopKError) as err:  # too small for the split: known before the kernel is
        op(split, 16, workspace=np.zeros(need + 64, np.uint8)[:need - 16])
    assert str(err.value) == f"workspace: {need - 16} bytes, this call needs {need} (TopK.workspace_bytes)"
    assert op._loaded == {}
    op(x, 7, out=good)
    assert list(op._loaded) == [op.choose("float16", 7, 3000).kernel]


def test_16_bit_values_may_be_written_as_their_uint16_bits(op):
    """As the cuda backend always has: an `out` values array of uint16 takes bfloat16 or
    float16 results as raw bits (the convention raw 16-bit input follows), whatever x holds."""
    for dtype in ("bfloat16", "float16"):
        x = make_rows(dtype, 3, 500, seed=6)
        want_values, want_indices = op(x, 10)
        for given in (x, x.view(np.uint16)):
            for values_type in (x.dtype, np.uint16):
                out = (np.zeros((3, 10), values_type), np.zeros((3, 10), np.int64))
                op(given, 10, out=out, dtype=dtype)
                assert np.array_equal(out[0].view(np.uint16), want_values.view(np.uint16)), (dtype, values_type)
                assert np.array_equal(out[1], want_indices)
    with pytest.raises(TopKError, match=r"^out\[0\] \(values\): expected float32 elements, got uint16$"):
        op(make_rows("float32", 3, 500, seed=6), 10, out=(np.zeros((3, 10), np.uint16), np.zeros((3, 10), np.int64)))


def test_a_workspace_is_a_writeable_contiguous_array_of_bytes(op):
    """Checked whether or not the call splits, so that a caller learns it on the first call."""
    need = op.workspace_bytes("float32", 16, 262144, 1)
    assert need > 0 and op.workspace_bytes("float32", 16, 300, 2) == 0
    read_only = np.zeros(need, np.uint8)
    read_only.flags.writeable = False
    bad = {"workspace: an array of object cannot hold the candidates; pass bytes (a uint8 array)":
               np.empty(need // 8 + 1, object),
           "workspace: must be contiguous": np.zeros(2 * need, np.uint8)[::2],
           "workspace: the array is read-only": read_only,
           "workspace: the emulator backend takes numpy arrays, got bytearray": bytearray(need)}
    for x in (np.zeros((1, 262144), np.float32), np.zeros((2, 300), np.float32)):  # split, and not
        for message, workspace in bad.items():
            with pytest.raises(TopKError) as err:
                op(x, 16, workspace=workspace)
            assert str(err.value) == message


def test_a_workspace_or_out_that_shares_memory_with_another_array_is_refused(op):
    """The launches read x while CTAs write the candidates and the outputs in no order: on a
    GPU any overlap races, and a workspace over x would overwrite the caller's input."""
    x = make_rows("float32", 1, 262144, seed=7)
    need = op.workspace_bytes("float32", 16, 262144, 1)
    assert 0 < need <= x.nbytes  # x's own bytes would hold the workspace: the call splits
    before = x.copy()
    buffer = np.zeros(need + 4096, np.uint8)  # 16-byte aligned, as numpy allocates
    values, indices = buffer[need:need + 64].view(np.float32).reshape(1, 16), buffer[need + 128:].view(np.int64)[:16]
    bad = {
        "workspace: shares memory with x; the kernels write workspace while they read or write x: pass separate arrays":
            dict(workspace=x.view(np.uint8)),
        "workspace: shares memory with out[0] (values); the kernels write workspace while they read or write "
        "out[0] (values): pass separate arrays": dict(out=(values, indices.reshape(1, 16)), workspace=buffer),
        "out[0] (values): shares memory with x; the kernels write out[0] (values) while they read or write x: "
        "pass separate arrays": dict(out=(x[:, :16], np.zeros((1, 16), np.int64))),
        "out[1] (indices): shares memory with out[0] (values); the kernels write out[1] (indices) while they read "
        "or write out[0] (values): pass separate arrays": dict(out=(values, buffer[need:need + 128].view(np.int64)
                                                                    .reshape(1, 16))),
    }
    for message, arguments in bad.items():
        with pytest.raises(TopKError) as err:
            op(x, 16, **arguments)
        assert str(err.value) == message
        assert np.array_equal(x, before) and not buffer.any()  # refused before anything was written
    small = make_rows("float32", 2, 300, seed=8)
    assert op.plan("float32", 16, 300, 2) is None
    with pytest.raises(TopKError, match="^workspace: shares memory with x;"):  # whether or not the call splits
        op(small, 16, workspace=small.view(np.uint8))
    # One allocation cut into parts that do not overlap serves as workspace and outputs.
    got = op(x, 16, out=(values, indices.reshape(1, 16)), workspace=buffer[:need])
    assert got[0] is values and all(np.array_equal(a, b) for a, b in zip(got, op(x, 16)))


def test_the_cuda_backend_refuses_overlaps_by_the_same_rule(op):
    """Device arrays' ranges, from their pointers and sizes as the cuda backend reads them,
    go through the same check (no GPU needed: the refusal comes before any launch)."""
    pytest.importorskip("cuda.core")
    from topkgen import runtime
    from topkgen.runtime import cuda_backend
    from topkgen.runtime.backend import _Work

    class Device:  # a device array as cupy or numba expose one
        def __init__(self, typestr, shape, ptr):
            self.__cuda_array_interface__ = {"typestr": typestr, "shape": shape, "strides": None,
                                             "data": (ptr, False), "version": 3}

    base, rows, n, k = 1 << 40, 1, 262144, 16
    plan = op.plan("float32", k, n, rows)
    backend = object.__new__(cuda_backend._CudaBackend)  # its checks alone: no device is opened
    backend.device_id = 0  # as on a machine whose current device is its first
    x = Device("<f4", (rows, n), base)
    view = backend.view(x, None)
    values, indices = Device("<f4", (rows, k), base + (1 << 30)), Device("<i8", (rows, k), base + (2 << 30))
    cases = {
        "workspace: shares memory with x": Device("|u1", (plan.workspace_bytes,), base + 4 * n - 256),
        "workspace: shares memory with out[1] (indices)": Device("|u1", (plan.workspace_bytes,), base + (2 << 30)),
    }
    for message, workspace in cases.items():
        with pytest.raises(TopKError, match=f"^{re.escape(message)};"):
            backend.check(view, k, (values, indices), workspace, plan)
    with pytest.raises(TopKError, match=r"^out\[0\] \(values\): shares memory with x;"):
        backend.check(view, k, (Device("<f4", (rows, k), base + 64), indices), None, plan)
    with pytest.raises(TopKError, match=r"^out\[1\] \(indices\): shares memory with out\[0\] \(values\);"):
        backend.check(view, k, (values, Device("<i8", (rows, k), base + (1 << 30) + 32)), None, plan)

    # An output or workspace its exporter marks read-only (the interface's data[1]) is
    # refused, as the emulator refuses a read-only numpy array: the kernels would write it.
    def read_only(array):
        array.__cuda_array_interface__["data"] = (array.__cuda_array_interface__["data"][0], True)
        return array

    for label, arguments in {"out[0] (values)": ((read_only(Device("<f4", (rows, k), base + (1 << 30))), indices), None),
                             "out[1] (indices)": ((values, read_only(Device("<i8", (rows, k), base + (2 << 30)))), None),
                             "workspace": ((values, indices),
                                           read_only(Device("|u1", (plan.workspace_bytes,), base + (3 << 30))))}.items():
        with pytest.raises(TopKError, match=rf"^{re.escape(label)}: the array is read-only$"):
            backend.check(view, k, *arguments, plan)
    read_only_x = backend.view(read_only(Device("<f4", (rows, n), base)), None)  # x is only read: it passes
    checks_only = _Work(None, "", runtime.Launch(256, 1, 0), [], [], None)  # no launch to make
    checked = backend.check(read_only_x, k, (values, indices), None, None)
    assert backend.run(checks_only, read_only_x, k, checked, None) == (values, indices)

    # An empty batch launches nothing, so backend.run returns the outputs check passed: an empty
    # workspace, wherever it points, passes them (it is never touched); a misaligned one does not.
    empty = backend.view(Device("<f4", (0, n), base), None)
    none = _Work(None, "", runtime.Launch(256, 1, 0), [], [], None)
    outputs = (Device("<f4", (0, k), base + (1 << 30)), Device("<i8", (0, k), base + (2 << 30)))
    checked = backend.check(empty, k, outputs, Device("|u1", (0,), base + (3 << 30) + 3), None)
    assert backend.run(none, empty, k, checked, None) == outputs
    with pytest.raises(TopKError, match="^workspace: must start at a multiple of 16 bytes"):
        backend.check(empty, k, outputs, Device("|u1", (64,), base + (3 << 30) + 3), None)


class _OnDevice:
    """A device array as cupy exposes one: __cuda_array_interface__ for its memory, and
    DLPack's __dlpack_device__ for where that memory is ((2, id): kDLCUDA, one device's;
    (13, id): kDLCUDAManaged, every device's)."""

    def __init__(self, typestr, shape, ptr, device=(2, 0)):
        self.__cuda_array_interface__ = {"typestr": typestr, "shape": shape, "strides": None, "data": (ptr, False),
                                         "version": 3}
        self.device = device

    def __dlpack_device__(self):
        return self.device


def test_arrays_on_another_gpu_than_the_backends_are_refused_naming_both(op):
    """The cuda backend read x, out and workspace by address in its own device's context: an
    array on cuda:1 with a TopK on device 0 was read with the wrong context. Each is refused,
    naming both devices, before anything is loaded; managed memory (every device reads it)
    and the backend's own device pass (no GPU needed: the checks come first)."""
    from topkgen import runtime
    from topkgen.runtime import cuda_backend

    backend = object.__new__(cuda_backend._CudaBackend)  # its checks alone: no device is opened
    backend.device_id = 0
    base, rows, n, k = 1 << 40, 1, 262144, 16
    plan = op.plan("float32", k, n, rows)

    def refusal(label, found):
        return (f"{label}: on CUDA device {found}, but this TopK runs on device 0 (the device current when it was "
                f"created): move it to device 0, or use a TopK created while device {found} is current")

    with pytest.raises(TopKError) as err:
        backend.view(_OnDevice("<f4", (rows, n), base, (2, 1)), None)
    assert str(err.value) == refusal("x", 1)
    view = backend.view(_OnDevice("<f4", (rows, n), base), None)
    values, indices = _OnDevice("<f4", (rows, k), base + (1 << 30)), _OnDevice("<i8", (rows, k), base + (2 << 30))
    workspace = _OnDevice("|u1", (plan.workspace_bytes,), base + (3 << 30))
    elsewhere = {"out[0] (values)": ((_OnDevice("<f4", (rows, k), base + (1 << 30), (2, 3)), indices), workspace),
                 "out[1] (indices)": ((values, _OnDevice("<i8", (rows, k), base + (2 << 30), (2, 3))), workspace),
                 "workspace": ((values, indices), _OnDevice("|u1", (plan.workspace_bytes,), base + (3 << 30), (2, 3)))}
    for label, (out, space) in elsewhere.items():
        with pytest.raises(TopKError) as err:
            backend.check(view, k, out, space, plan)
        assert str(err.value) == refusal(label, 3)
    managed = _OnDevice("|u1", (plan.workspace_bytes,), base + (3 << 30), (13, 1))
    assert backend.check(view, k, (values, indices), managed, plan).workspace == (base + (3 << 30),
                                                                                 plan.workspace_bytes)
    assert backend.check(view, k, (values, indices), workspace, plan).pointers["x"] == base
    # The rule itself, as any caller may use it: an exporter that names no device (a bare
    # __cuda_array_interface__ whose address no driver here knows) is not refused.
    runtime.check_device("x", _OnDevice("<f4", (1, 8), base, (2, 5)), 5)
    runtime.check_device("x", _Bare(base), 7)
    assert runtime.array_device(_OnDevice("<f4", (1, 8), base, (2, 5))) == 5
    assert runtime.array_device(_OnDevice("<f4", (1, 8), base, (3, 5))) is None  # pinned host memory


class _Bare:
    def __init__(self, ptr):
        self.__cuda_array_interface__ = {"typestr": "<f4", "shape": (1, 8), "strides": None, "data": (ptr, False),
                                         "version": 3}


def test_a_masked_x_is_refused_not_read_whole(op):
    """The kernels read every element: a numpy.ma array (or a device array whose
    __cuda_array_interface__ has a mask) returned its masked elements as top values."""
    x = np.ma.masked_array(make_rows("float32", 2, 300, seed=9), mask=False)
    x[:, 0] = np.ma.masked
    x.data[:, 0] = 1e30  # what a masked slot may hold: it must never come back as a value
    message = "x: a masked array: the kernels would read its masked elements as values; fill them first " \
              "(x.filled(-inf) for the largest)"
    with pytest.raises(TopKError) as err:
        op(x, 5)
    assert str(err.value) == message
    values, _ = op(x.filled(-np.inf), 5)
    assert (values < 1e30).all()
    pytest.importorskip("cuda.core")
    from topkgen.runtime.cuda_backend import _device_array

    class Masked:  # a device array with a mask, as numba's interface allows
        __cuda_array_interface__ = {"typestr": "<f4", "shape": (2, 300), "strides": None, "data": (1 << 40, False),
                                    "version": 3, "mask": object()}

    with pytest.raises(TopKError) as err:
        _device_array(Masked(), "x")
    assert str(err.value) == message


def test_a_stream_that_is_no_stream_is_refused_by_name(op):
    """stream="0", 1.5, -1 or True reached cuda.core only after the kernel was loaded, and
    failed there with its exception; both backends refuse it first (the emulator takes the
    same streams as the cuda backend, and ignores them)."""
    x = make_rows("float32", 2, 300, seed=10)
    want = op(x, 5)

    class TorchLike:  # a stream through the protocol, and one an older torch exposes
        def __cuda_stream__(self):
            return (0, 0)

    class OldTorch:
        cuda_stream = 0

    for stream in (None, 0, 7, TorchLike(), OldTorch()):
        assert all(np.array_equal(a, b) for a, b in zip(op(x, 5, stream=stream), want))
    for stream in ("0", 1.5, -1, True, object()):
        with pytest.raises(TopKError) as err:
            op(x, 5, stream=stream)
        assert str(err.value) == ("stream: expected a CUDA stream (a cuda.core Stream, an object with __cuda_stream__ "
                                  "such as torch.cuda.Stream, or a stream handle as an int >= 0), got "
                                  f"{type(stream).__name__} {stream!r}")


def test_an_empty_last_dimension_is_named_as_n(op):
    """Shape (2, 0) was told "expected at least one dimension of size >= 1", which it has."""
    for shape in ((2, 0), (0,), (3, 2, 0)):
        with pytest.raises(TopKError) as err:
            op(np.zeros(shape, np.float32), 1)
        assert str(err.value) == f"x: n (its last dimension) must be >= 1, got shape {shape}"


def test_leading_dimensions_whose_product_passes_64_bits_are_too_many_rows():
    """A device array claiming (2^32, 2^32, n) was 0 rows (numpy's int64 product wrapped):
    an empty batch, answered by launching nothing. It is 2^64 rows, refused."""
    pytest.importorskip("cuda.core")
    from topkgen.runtime import cuda_backend

    class Device:
        __cuda_array_interface__ = {"typestr": "<f4", "shape": (2**32, 2**32, 300), "strides": None,
                                    "data": (1 << 40, False), "version": 3}

    backend = object.__new__(cuda_backend._CudaBackend)  # its checks alone: no device is opened
    backend.device_id = 0  # as on a machine whose current device is its first
    with pytest.raises(TopKError) as err:
        backend.view(Device(), None)
    assert str(err.value) == f"x: {2**64} rows is more than the kernels' 2^31 - 1"


def test_a_mistyped_dtype_is_named_as_no_dtype_not_as_a_mismatch(op):
    """dtype="flaot32" on float32 input was told "does not match the array's float32"; it is
    no dtype at all, and gets the command line's words and suggestion."""
    x = make_rows("float32", 2, 300, seed=11)
    for bad, meant in (("flaot32", "; did you mean float32?"), ("float64", ""), ("", "")):
        for array in (x, x.view(np.uint16)[:, :300]):
            with pytest.raises(TopKError) as err:
                op(array, 5, dtype=bad)
            assert str(err.value) == (f"dtype: {bad!r} is not one of float32, bfloat16, float16 "
                                      f"(or fp32, f32, bf16, fp16, f16, half){meant}")
