"""The GPU path's launches against the cubins themselves, without a GPU.

The driver copies each kernel argument by the size the cubin records for that parameter
(tests/support/cubin_info.py reads those records). Two checks:
- every AOT kernel's cubin takes exactly the parameters its manifest entry lists, in that
  order and with those C types' sizes (the C++ loader packs by the manifest's names);
- the Python runtime's cuda backend, run against a stand-in for cuda.core that accepts
  what the real one accepts (str symbol names are refused as cuda.bindings refuses them;
  arguments go through cuda.core's own ParamHolder, read back at the cubin's sizes: a
  Python int is an intptr_t, a numpy scalar its own type), launches every AOT kernel, a split and a JIT kernel with arguments
  the cubin takes, in a block its launch bounds allow, and raises the dynamic shared memory
  limit whenever static plus dynamic shared memory passes the driver's default of 48 KiB.
"""

from __future__ import annotations

import ctypes
import json
import types

import numpy as np
import pytest

from topkgen import runtime

from topkgen.runtime import cuda_backend
from topkgen.runtime.backend import _Work
from topkgen.policy import SHARED_BYTES_PER_BLOCK

from ..support.cubin_info import kernel_info

C_SIZES = {"int": 4, "long long": 8}
DEFAULT_SHARED_LIMIT = 48 * 1024  # CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: static + dynamic without opt-in


def c_size(ctype: str) -> int:
    return 8 if ctype.endswith("*") else C_SIZES[ctype]


def test_every_cubin_takes_the_parameters_its_manifest_lists(built_bundle):
    manifest = json.loads((built_bundle / "manifest.json").read_text())
    assert manifest["kernels"]
    for entry in manifest["kernels"]:
        info = kernel_info((built_bundle / entry["cubin"]).read_bytes(), entry["symbol"])
        sizes = [c_size(p["ctype"]) for p in entry["params"]]
        offsets, at = [], 0
        for size in sizes:  # the C layout: each parameter at a multiple of its size
            at = -(-at // size) * size
            offsets.append(at)
            at += size
        assert [(p.ordinal, p.offset, p.size) for p in info.params] == list(zip(range(len(sizes)), offsets, sizes)), \
            entry["name"]
        assert info.param_bytes == at, entry["name"]
        assert info.max_threads is not None and info.max_threads[0] >= entry["launch"]["threads_per_block"], entry["name"]
        shared = entry["resources"]["static_shared_bytes"] + entry["launch"]["dynamic_shared_bytes"]
        assert shared <= SHARED_BYTES_PER_BLOCK[entry["arch"]], entry["name"]


# ----------------------------------------------------------------------------- a stand-in for cuda.core

def _arg_size(arg) -> int:
    """The bytes cuda.core's ParamHolder passes for an argument (cuda/core/_kernel_arg_handler.pyx)."""
    if isinstance(arg, bool):
        pytest.fail("a bool argument: cuda.core passes it as a C++ bool (0.5+) or int (before)")
    if isinstance(arg, int):
        return 8  # intptr_t: "treat it as a pointer address"
    if isinstance(arg, np.generic) and arg.dtype.kind in "iuf":
        return arg.dtype.itemsize
    pytest.fail(f"cuda.core refuses a kernel argument of type {type(arg).__name__}")


def _param_holder():
    """cuda.core's own argument packer (it needs no GPU), wherever this version keeps it."""
    try:
        from cuda.core.experimental._kernel_arg_handler import ParamHolder
    except ImportError:
        from cuda.core._kernel_arg_handler import ParamHolder
    return ParamHolder


def _as_the_driver_reads(args, params) -> list[int]:
    """The values the driver copies: `size` bytes of each argument as cuda.core packs it."""
    holder = _param_holder()(list(args))
    slots = (ctypes.c_void_p * len(args)).from_address(holder.ptr)
    types_ = {4: ctypes.c_int32, 8: ctypes.c_int64}
    return [types_[p.size].from_address(slots[i]).value for i, p in enumerate(params)]


class FakeStream:
    def __init__(self, handle: int = 0) -> None:
        self.handle = handle

    @staticmethod
    def from_handle(handle: int) -> "FakeStream":
        assert isinstance(handle, int)
        return FakeStream(handle)


class FakeBuffer:
    def __init__(self, handle: int, size: int) -> None:
        self.handle, self.size, self.closed_on = handle, size, None

    def close(self, stream=None) -> None:
        self.closed_on = stream


class FakeKernel:
    def __init__(self, symbol: str, cubin: bytes) -> None:
        self.symbol, self.info = symbol, kernel_info(cubin, symbol)
        self.max_dynamic_shared = None  # raised by the backend's _allow_dynamic_shared


class FakeObjectCode:
    def __init__(self, cubin: bytes, symbol_mapping: dict | None) -> None:
        self.cubin, self.symbol_mapping = cubin, symbol_mapping or {}

    @staticmethod
    def from_cubin(module: bytes, *, name: str = "", symbol_mapping: dict | None = None) -> "FakeObjectCode":
        assert isinstance(module, bytes)
        return FakeObjectCode(module, symbol_mapping)

    def get_kernel(self, name):
        # cuda.core: `name = self._sym_map[name]` falling back to `name.encode()`, then
        # cuLibraryGetKernel(handle, name), whose `char*` parameter refuses a str.
        try:
            symbol = self.symbol_mapping[name]
        except KeyError:
            symbol = name.encode()
        if not isinstance(symbol, bytes):
            raise TypeError(f"expected bytes, {type(symbol).__name__} found")
        return FakeKernel(symbol.decode(), self.cubin)


class FakeDevice:
    def __init__(self, log: dict) -> None:
        self.log, self.device_id, self.compute_capability = log, 0, (9, 0)
        self.default_stream = FakeStream(0)
        self.properties = types.SimpleNamespace(multiprocessor_count=132)  # an H200, as the policy's split assumes

    def set_current(self) -> None:
        pass

    def allocate(self, size: int, *, stream) -> FakeBuffer:
        assert isinstance(stream, FakeStream)
        buffer = FakeBuffer(0x7000_0000_0000 + 0x1_0000_0000 * len(self.log["buffers"]), size)
        self.log["buffers"].append(buffer)
        return buffer


class DeviceArray:
    """An array at a made-up device address, through __cuda_array_interface__."""

    def __init__(self, shape: tuple[int, ...], typestr: str, ptr: int) -> None:
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False), "strides": None,
                                         "version": 3}


@pytest.fixture
def fake_core(monkeypatch):
    log: dict = {"launches": [], "buffers": [], "cleared": []}

    def launch(stream, config, kernel, *args):
        log["launches"].append((stream, config, kernel, args))

    def launch_config(*, grid, block, shmem_size=None):
        assert all(isinstance(v, int) and not isinstance(v, bool) for v in (grid, block, shmem_size or 0))
        return types.SimpleNamespace(grid=grid, block=block, shmem_size=shmem_size or 0)

    core = types.SimpleNamespace(Device=lambda: FakeDevice(log), ObjectCode=FakeObjectCode, LaunchConfig=launch_config,
                                 launch=launch, Stream=FakeStream, view_dlpack=None)
    monkeypatch.setattr(cuda_backend, "_cuda_core", lambda: core)

    def allow(self, kernel, nbytes):
        kernel.max_dynamic_shared = nbytes

    monkeypatch.setattr(cuda_backend._CudaBackend, "_allow_dynamic_shared", allow)

    def clear(self, address, nbytes, stream):  # a memset on the launch stream (a split's tickets)
        assert isinstance(stream, FakeStream)
        log["cleared"].append((address, nbytes, stream, len(log["launches"])))

    monkeypatch.setattr(cuda_backend._CudaBackend, "_clear", clear)
    return log


def _check_launch(log_entry, entry: dict, static_shared: int) -> dict:
    """One launch against the cubin and the manifest entry; returns its arguments by name."""
    stream, config, kernel, args = log_entry
    name = entry["name"]
    assert isinstance(stream, FakeStream), name
    assert kernel.symbol == entry["symbol"], name
    assert [_arg_size(a) for a in args] == [p.size for p in kernel.info.params], name
    assert _as_the_driver_reads(args, kernel.info.params) == [int(a) for a in args], name
    for arg, param in zip(args, entry["params"]):  # a pointer goes as a Python int (0: null), a scalar as numpy
        assert isinstance(arg, int) == param["ctype"].endswith("*"), (name, param)
    assert config.block == entry["launch"]["threads_per_block"] <= kernel.info.max_threads[0], name
    assert 1 <= config.grid <= 2**31 - 1, name
    by_name = {p["name"]: (a if isinstance(a, int) else int(a)) for p, a in zip(entry["params"], args)}
    # schema 6: the launch gets the shared memory its kernel is told (launch.shared_bytes), at most the maximum
    assert config.shmem_size == by_name.get("shared_bytes", 0) <= entry["launch"]["dynamic_shared_bytes"], name
    if static_shared + config.shmem_size > DEFAULT_SHARED_LIMIT:  # else the launch fails: CUDA_ERROR_INVALID_VALUE
        assert (kernel.max_dynamic_shared or 0) >= config.shmem_size, f"{name}: no opt-in for {config.shmem_size} B"
    return by_name


def _shared_rule(launch: dict, dtype: str):
    """The manifest entry's shared memory rule (launch.dynamic_shared_bytes, shared_buffer_bytes)."""
    from topkgen.policy import DTYPE_SIZES
    from topkgen.policy.split import SharedMemory

    return SharedMemory(launch["dynamic_shared_bytes"], launch["shared_buffer_bytes"], DTYPE_SIZES[dtype])


def _arrays(dtype: str, rows: int, n: int, k: int):
    typestr = {"float32": "<f4", "bfloat16": "<u2", "float16": "<f2"}[dtype]
    return (DeviceArray((rows, n), typestr, 0x1000_0000), DeviceArray((rows, k), typestr, 0x2000_0000),
            DeviceArray((rows, k), "<i8", 0x3000_0000))


def test_cuda_backend_launches_every_aot_kernel_as_its_cubin_expects(built_bundle, fake_core, gpu_check,
                                                                     monkeypatch):
    manifest = json.loads((built_bundle / "manifest.json").read_text())
    entries = {e["name"]: e for e in manifest["kernels"] if e["arch"] == "sm_90"}
    monkeypatch.setenv("TOPKGEN_DISABLE_JIT", "1")
    op = runtime.TopK(built_bundle, backend="cuda")
    assert op.arch == "sm_90"
    cases = gpu_check.aot_launch_cases(manifest, "sm_90")
    assert {c[0] for c in cases} == set(entries)
    for name, dtype, k, n, det in cases:
        x, values, indices = _arrays(dtype, 5, n, k)
        for largest in (True, False):
            fake_core["launches"].clear()
            op(x, k, largest=largest, deterministic=det, out=(values, indices), dtype=dtype, stream=FakeStream(7))
            (launch,) = fake_core["launches"]
            entry = entries[name]
            args = _check_launch(launch, entry, entry["resources"]["static_shared_bytes"])
            expect = {"x": 0x1000_0000, "values": 0x2000_0000, "indices": 0x3000_0000, "rows": 5, "n": n, "k": k,
                      "largest": int(largest), "flags": 0}
            if entry["family"] == "radix":  # and (schema 6) the shared memory its row needs, also its launch's
                expect |= {"x_indices": 0, "chunk": n, "row_stride": n,
                           "shared_bytes": _shared_rule(entry["launch"], dtype).bytes_for(n)}
            expect |= {"lengths": 0, "starts": 0, "window_bytes": 0, "split_n": 0}  # dense rows: null windows
            assert args == expect, name


def test_cuda_backend_split_rows_pass_the_workspace_as_both_stages_expect(built_bundle, fake_core):
    manifest = json.loads((built_bundle / "manifest.json").read_text())
    entries = {e["name"]: e for e in manifest["kernels"]}
    op = runtime.TopK(built_bundle, backend="cuda")
    dtype, k, n, rows = "float32", 16, 262144, 4
    plan = op.plan(dtype, k, n, rows)
    assert plan is not None and plan.chunks > 1
    x, values, indices = _arrays(dtype, rows, n, k)
    op(x, k, out=(values, indices), stream=FakeStream(7))
    first, second = fake_core["launches"]
    (buffer,) = fake_core["buffers"]  # no workspace passed: one allocation on the stream, freed behind the launches
    assert buffer.size >= plan.workspace_bytes and buffer.closed_on is first[0]
    entry = entries[op.choose(dtype, k, n, rows=rows).kernel]
    one, two = (_check_launch(launch, entry, entry["resources"]["static_shared_bytes"]) for launch in (first, second))
    assert (one["x"], one["x_indices"], one["values"], one["indices"]) == \
        (0x1000_0000, 0, buffer.handle + plan.values_offset, buffer.handle)
    assert (two["x"], two["x_indices"], two["values"], two["indices"]) == \
        (buffer.handle + plan.values_offset, buffer.handle, 0x2000_0000, 0x3000_0000)
    assert first[1].grid * entry["launch"]["rows_per_block"] >= rows * plan.chunks
    assert second[1].grid * entry["launch"]["rows_per_block"] >= rows
    assert (one["n"], one["chunk"], one["row_stride"]) == (n, plan.chunk, n)
    assert (two["n"], two["chunk"], two["row_stride"]) == (plan.candidates,) * 3
    rule = _shared_rule(entry["launch"], dtype)  # schema 6: stage 1 reads its last chunk, stage 2 the candidates
    assert (one["shared_bytes"], two["shared_bytes"]) == (rule.bytes_for(plan.last_chunk), rule.bytes_for(plan.candidates))
    assert (first[1].shmem_size, second[1].shmem_size) == (one["shared_bytes"], two["shared_bytes"])


@pytest.mark.parametrize("ragged", [False, True])
def test_cuda_backend_split_rows_launch_once_with_the_tickets_zeroed_in_the_workspace(one_launch_bundle, fake_core,
                                                                                        ragged):
    """A split whose kernel merges (schema 7): one launch, stage 1's, its candidates in the
    workspace (allocated on the stream, or the caller's), its tickets past them zeroed on the
    same stream before the launch, the output and the request's flags as the merge's, the
    larger of the two stages' shared memory, and a ragged batch's windows."""
    from topkgen.manifest.params import OUTPUT_FLAGS

    manifest = json.loads((one_launch_bundle / "manifest.json").read_text())
    (entry,) = manifest["kernels"]
    assert [p["name"] for p in entry["params"]][-4:] == ["tickets", "merged_values", "merged_indices", "merged_flags"]
    op = runtime.TopK(one_launch_bundle, backend="cuda")
    dtype, k, n, rows = "float32", 16, 262144, 4
    plan = op.plan(dtype, k, n, rows)
    assert plan is not None and plan.chunks == 32 and plan.one_launch
    assert op.workspace_bytes(dtype, k, n, rows) == plan.workspace_bytes == plan.tickets_offset + 4 * rows
    x, values, indices = _arrays(dtype, rows, n, k)
    windows = {}
    if ragged:
        windows = {"lengths": DeviceArray((rows,), "<i4", 0x4000_0000), "starts": DeviceArray((rows,), "<i4", 0x5000_0000),
                   "workspace": DeviceArray((plan.workspace_bytes,), "|u1", 0x6000_0000)}
    op(x, k, out=(values, indices), stream=FakeStream(7), sorted=not ragged, **windows)
    (launch,) = fake_core["launches"]
    if ragged:
        assert fake_core["buffers"] == []  # the caller's workspace: no allocation
        base = 0x6000_0000
    else:
        (buffer,) = fake_core["buffers"]  # no workspace passed: one allocation on the stream, freed behind the launch
        assert buffer.size >= plan.workspace_bytes and buffer.closed_on is launch[0]
        base = buffer.handle
    assert fake_core["cleared"] == [(base + plan.tickets_offset, 4 * rows, launch[0], 0)]
    one = _check_launch(launch, entry, entry["resources"]["static_shared_bytes"])
    assert (one["x"], one["x_indices"], one["values"], one["indices"]) == \
        (0x1000_0000, 0, base + plan.values_offset, base)
    assert (one["tickets"], one["merged_values"], one["merged_indices"]) == \
        (base + plan.tickets_offset, 0x2000_0000, 0x3000_0000)
    assert (one["flags"], one["merged_flags"]) == (OUTPUT_FLAGS["unsorted"], OUTPUT_FLAGS["unsorted"] * ragged)
    assert launch[1].grid * entry["launch"]["rows_per_block"] >= rows * plan.chunks
    assert (one["n"], one["chunk"], one["row_stride"], one["split_n"]) == (n, plan.chunk, n, 0)
    assert (one["lengths"], one["starts"], one["window_bytes"]) == ((0x4000_0000, 0x5000_0000, 4) if ragged else (0, 0, 0))
    rule = _shared_rule(entry["launch"], dtype)  # schema 6: the larger of the chunk's and the merge's
    assert one["shared_bytes"] == launch[1].shmem_size == max(rule.bytes_for(plan.last_chunk),
                                                              rule.bytes_for(plan.candidates))


@pytest.mark.parametrize("k,n,rows", [(16, 1000, 2), (256, 5000, 2), (16, 262144, 4), (5000, 20000, 2)])
def test_cuda_backend_writes_int32_indices_and_skips_the_sort_through_the_kernels_flags(built_bundle, fake_core,
                                                                                       k, n, rows):
    """index_dtype="int32" and sorted=False reach the kernels as their `flags` (no pass after
    them: one launch, or a split's two, and nothing else), for device arrays that are not
    torch tensors: a register kernel, a radix kernel, a split and the large-k path (JIT,
    compiled here by NVRTC), whose candidates then go to scratch the backend allocates."""
    from topkgen.build.compile import compile_kernel
    from topkgen.manifest.params import OUTPUT_FLAGS

    manifest = json.loads((built_bundle / "manifest.json").read_text())
    entries = {e["name"]: e for e in manifest["kernels"] + manifest["jit_kernels"] if e["arch"] == "sm_90"}
    op = runtime.TopK(built_bundle, backend="cuda")
    choice = op.choose("float32", k, n, rows=rows)
    entry = entries[choice.kernel]
    x, values, _ = _arrays("float32", rows, n, k)
    indices = DeviceArray((rows, k), "<i4", 0x3000_0000)
    out = op(x, k, sorted=False, index_dtype="int32", out=(values, indices), stream=FakeStream(7))
    assert out[1] is indices
    flags = OUTPUT_FLAGS["unsorted"] | OUTPUT_FLAGS["int32_indices"]
    static = entry["resources"]["static_shared_bytes"] if "resources" in entry else \
        compile_kernel((built_bundle / entry["source"]).read_text(), entry["name"], "sm_90").resources.static_shared_bytes
    launches = [_check_launch(launch, entry, static) for launch in fake_core["launches"]]
    assert len(launches) == choice.chunks if choice.chunks == 1 else len(launches) == 2
    assert launches[-1]["flags"] == flags and launches[-1]["indices"] == 0x3000_0000
    if choice.chunks > 1:  # stage 1 writes the workspace's int64 candidates: the unsorted bit alone
        assert launches[0]["flags"] == OUTPUT_FLAGS["unsorted"]
    assert ("scratch" in launches[-1]) == (entry["work"] == "large")
    if "scratch" in launches[-1]:
        (buffer,) = fake_core["buffers"]
        assert launches[-1]["scratch"] == buffer.handle and buffer.size == op.workspace_bytes(
            "float32", k, n, rows, index_dtype="int32") == rows * k * 8
        assert op.workspace_bytes("float32", k, n, rows) == 0
    else:
        assert choice.chunks > 1 or not fake_core["buffers"]
@pytest.mark.parametrize("typestr, width", [("<i4", 4), ("<i8", 8)])
def test_cuda_backend_ragged_rows_pass_their_windows_to_both_stages(built_bundle, fake_core, typestr, width):
    """A ragged split batch (issue 30): the same kernel and chunks as the dense call (from n),
    the lengths and starts pointers and their width to both stages, stage 2 stage 1's n, and
    nothing allocated or read on the host when a workspace is passed."""
    manifest = json.loads((built_bundle / "manifest.json").read_text())
    entries = {e["name"]: e for e in manifest["kernels"]}
    op = runtime.TopK(built_bundle, backend="cuda")
    dtype, k, n, rows = "float32", 16, 262144, 4
    plan = op.plan(dtype, k, n, rows)
    x, values, indices = _arrays(dtype, rows, n, k)
    lengths, starts = DeviceArray((rows,), typestr, 0x4000_0000), DeviceArray((rows,), typestr, 0x5000_0000)
    workspace = DeviceArray((plan.workspace_bytes,), "|u1", 0x6000_0000)
    op(x, k, out=(values, indices), stream=FakeStream(7), lengths=lengths, starts=starts, workspace=workspace)
    assert fake_core["buffers"] == []  # the caller's workspace: no allocation
    first, second = fake_core["launches"]
    entry = entries[op.choose(dtype, k, n, rows=rows).kernel]
    one, two = (_check_launch(launch, entry, entry["resources"]["static_shared_bytes"]) for launch in (first, second))
    for args in (one, two):
        assert (args["lengths"], args["starts"], args["window_bytes"]) == (0x4000_0000, 0x5000_0000, width)
    assert (one["split_n"], two["split_n"]) == (0, n)
    assert (one["chunk"], two["n"]) == (plan.chunk, plan.candidates)
    with pytest.raises(runtime.TopKError, match=f"starts: expected {np.dtype(typestr).name} elements"):
        other = "<i8" if typestr == "<i4" else "<i4"
        op(x, k, out=(values, indices), lengths=lengths, starts=DeviceArray((rows,), other, 0x5000_0000))


def test_cuda_backend_jit_kernels_are_launched_as_compiled(built_bundle, fake_core):
    """float16 is served by JIT: the bundle's source, compiled here by NVRTC."""
    from topkgen.build.compile import compile_kernel

    manifest = json.loads((built_bundle / "manifest.json").read_text())
    op = runtime.TopK(built_bundle, backend="cuda")
    dtype, k, n = "float16", 100, 30000
    entry = next(e for e in manifest["jit_kernels"] if e["name"] == op.choose(dtype, k, n).kernel)
    x, values, indices = _arrays(dtype, 3, n, k)
    op(x, k, out=(values, indices), stream=FakeStream(7))
    (launch,) = fake_core["launches"]
    static = compile_kernel((built_bundle / entry["source"]).read_text(), entry["name"], "sm_90").resources
    _check_launch(launch, entry, static.static_shared_bytes)


def test_cuda_backend_raises_the_shared_limit_below_48_kib_of_dynamic_shared_memory(built_bundle, fake_core):
    """A policy's shared_row_bytes may leave dynamic shared memory under 48 KiB while static
    plus dynamic pass it (K=1024's 16.2 KiB of static and 40 KiB of rows): the launch then
    needs the raised limit too. Same kernel, same launch as the runtime's, other launch record."""
    from topkgen.policy.split import stages

    manifest = json.loads((built_bundle / "manifest.json").read_text())
    entry = next(e for e in manifest["kernels"] if e["arch"] == "sm_90" and e["k"] == 1024)
    assert entry["resources"]["static_shared_bytes"] + 40960 > DEFAULT_SHARED_LIMIT
    backend = cuda_backend._CudaBackend()
    kernel = backend.load_aot(entry["name"], (built_bundle / entry["cubin"]).read_bytes(), entry["symbol"], "")
    x, values, indices = _arrays("float32", 2, 5000, 1000)
    view = backend.view(x, None)
    work = _Work(kernel, entry["name"], runtime.Launch(entry["launch"]["threads_per_block"], 1, 40960),
                         entry["params"], stages(2, 5000, 1000, True, None), None)
    for _ in range(2):
        backend.run(work, view, 1000, backend.check(view, 1000, (values, indices), None, None), FakeStream(7))
    entry = {**entry, "launch": {**entry["launch"], "dynamic_shared_bytes": 40960}}
    for launch in fake_core["launches"]:
        _check_launch(launch, entry, entry["resources"]["static_shared_bytes"])


def test_cuda_backend_takes_a_torch_stream_by_its_handle(built_bundle, fake_core):
    """torch.cuda.Stream has `cuda_stream` (an int); the __cuda_stream__ protocol only in
    recent torch: the launch goes on that stream either way."""
    op = runtime.TopK(built_bundle, backend="cuda")
    x, values, indices = _arrays("float32", 2, 1000, 16)
    op(x, 16, out=(values, indices), stream=types.SimpleNamespace(cuda_stream=0x5150))
    (launch,) = fake_core["launches"]
    assert launch[0].handle == 0x5150


@pytest.mark.parametrize("dtype,values_type,indices_type,message", [
    ("float32", "<f4", "<i4", "out[1] (indices): expected int64 elements, got int32"),
    ("bfloat16", "<f4", "<i8", "out[0] (values): expected bfloat16 or uint16 elements, got float32"),
    ("float32", "<u2", "<i8", "out[0] (values): expected float32 elements, got uint16"),
])
def test_cuda_backend_refuses_out_arrays_of_another_type_before_launching(built_bundle, fake_core, dtype,
                                                                           values_type, indices_type, message):
    """The kernels write x's type and int64: a narrower `out` would be written past its end."""
    op = runtime.TopK(built_bundle, backend="cuda")
    x, _, _ = _arrays(dtype, 2, 1000, 16)
    out = (DeviceArray((2, 16), values_type, 0x2000_0000), DeviceArray((2, 16), indices_type, 0x3000_0000))
    with pytest.raises(runtime.TopKError) as err:
        op(x, 16, out=out, dtype=dtype, stream=FakeStream(7))
    assert str(err.value) == message and not fake_core["launches"]


def test_fake_get_kernel_refuses_a_str_symbol_as_cuda_bindings_does():
    """The stand-in's one strictness that the tests above rely on, held to the real binding."""
    driver = pytest.importorskip("cuda.bindings.driver")
    with pytest.raises(TypeError, match="expected bytes, str found"):
        driver.cuLibraryGetKernel(driver.CUlibrary(), "topk_x")
    with pytest.raises(TypeError):
        FakeObjectCode.from_cubin(b"", symbol_mapping={"a": "topk_x"}).get_kernel("a")


def test_the_cuda_backend_refuses_an_arch_whose_cubins_this_gpu_cannot_run(built_bundle, fake_core):
    """TopK(bundle, arch="sm_100", backend="cuda") on a 9.0 GPU was built, and its first call
    failed in the driver's cubin load; it is refused by name when created."""
    assert runtime.TopK(built_bundle, arch="sm_90", backend="cuda").arch == "sm_90"
    with pytest.raises(runtime.TopKError) as err:
        runtime.TopK(built_bundle, arch="sm_100", backend="cuda")
    assert str(err.value) == ("arch: 'sm_100' kernels do not run on this GPU (sm_90); pass arch='sm_90' or leave "
                              "arch out (the backend takes the GPU's)")
