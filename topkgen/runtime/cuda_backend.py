"""The cuda backend: cubins loaded with cuda.core and launched on the caller's stream, for any
array that exposes __cuda_array_interface__ or DLPack (torch, cupy) without importing torch.
cuda.core is imported on first use, so the emulator and the CLI run without a driver."""

from __future__ import annotations

import math
import sys
from functools import lru_cache
from typing import Any

import numpy as np

from topkgen.policy import DTYPE_SIZES
from topkgen.policy.split import ChunkPlan
from topkgen.runtime.ragged import Windows, check_array, check_values
from topkgen.runtime.backend import (
    MASKED, OUT_LABELS, NoGpuError, TopKError, _Arrays, _Backend, _View, _Work, _c_contiguous, _check_alignment,
    _check_disjoint, _check_out, _check_stream, _check_workspace_size, _check_x_contiguous, _out_pair,
    _value_types, arguments, dtype_name, workspace_need)


def gpu_unavailable() -> str | None:
    """Why no CUDA GPU can be used here, or None when one can."""
    try:
        from cuda.bindings import driver
    except ImportError as err:
        return f"cuda-bindings is not installed ({err})"
    try:
        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return f"the CUDA driver is not usable ({err.name})"
        err, count = driver.cuDeviceGetCount()
        if err != driver.CUresult.CUDA_SUCCESS or count < 1:
            return "no CUDA device"
    except Exception as err:  # libcuda missing entirely
        return f"the CUDA driver is not installed ({err})"
    return None


# ----------------------------------------------------------------------------- cuda

@lru_cache(maxsize=1)
def _cuda_core() -> Any:
    """cuda.core's objects, wherever this version keeps them, looked up once (every launch
    asks for them): the package itself where it holds them (1.0 removed
    cuda.core.experimental, the releases before it keep that only to warn, as 0.7 does),
    else experimental (0.4). `view_dlpack(obj)` views a DLPack array without stream
    ordering: by the from_dlpack classmethod where there is one (0.5 deprecated the
    constructor), else by the constructor."""
    import types

    import cuda.core

    core = cuda.core
    if hasattr(core, "Device"):
        from cuda.core.utils import StridedMemoryView
    else:
        from cuda.core import experimental as core
        from cuda.core.experimental.utils import StridedMemoryView
    if hasattr(StridedMemoryView, "from_dlpack"):
        def view_dlpack(obj: Any) -> Any:
            return StridedMemoryView.from_dlpack(obj, stream_ptr=-1)
    else:
        def view_dlpack(obj: Any) -> Any:
            return StridedMemoryView(obj, stream_ptr=-1)
    return types.SimpleNamespace(Device=core.Device, ObjectCode=core.ObjectCode, LaunchConfig=core.LaunchConfig,
                                 launch=core.launch, Stream=core.Stream, view_dlpack=view_dlpack)


def _kernel_handle(kernel: Any) -> Any:
    """The driver handle of a cuda.core Kernel: its public `handle` where the release has one
    (0.7 and 1.x do; some releases that hold a C++ handle keep no `_handle` that Python can
    read), else the private `_handle` (0.4)."""
    return kernel.handle if hasattr(kernel, "handle") else kernel._handle


def allow_dynamic_shared(handle: Any, nbytes: int, device_id: int) -> None:
    """Set a kernel's dynamic shared memory limit to `nbytes` (needed once static plus
    dynamic shared memory pass 48 KiB) on one device. cuda.core loads cubins as libraries
    (cuLibraryLoadData: 0.4 does where the driver is CUDA 12 or newer, 1.x always), so its
    handles are CUkernels, which take cuKernelSetAttribute with a device; a module's
    CUfunction (0.4 on an older driver) takes cuFuncSetAttribute. A handle that is neither
    is the address of a CUkernel."""
    from cuda.bindings import driver

    attribute = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    if isinstance(handle, driver.CUfunction):
        (err,) = driver.cuFuncSetAttribute(handle, attribute, nbytes)
    else:
        if not isinstance(handle, driver.CUkernel):
            handle = driver.CUkernel(int(handle))
        (err,) = driver.cuKernelSetAttribute(attribute, nbytes, handle, device_id)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise TopKError(f"this GPU cannot give a kernel {nbytes} bytes of dynamic shared memory ({err.name}); "
                        f"lower the policy's shared_row_bytes for this arch and rebuild")


class _CudaBackend(_Backend):
    """Device arrays through __cuda_array_interface__ or DLPack, kernels through cuda.core."""

    def __init__(self) -> None:
        try:
            Device = _cuda_core().Device

            self.device = Device()
            self.device.set_current()
        except Exception as err:  # no driver, no GPU
            raise NoGpuError(f"backend 'cuda': no usable GPU ({err})") from None
        self.device_id: int = self.device.device_id  # every array of a call must be this device's
        self._shared_allowed: dict[int, tuple[Any, int]] = {}  # id(kernel) -> (kernel, bytes allowed)
        self.targets: dict[str, str] = {}  # the bundle's load_order.targets: JIT for sm_90a where its cubins are

    def check_stream(self, stream: Any) -> None:
        if not isinstance(stream, _cuda_core().Stream):  # cuda.core's own, taken by type
            _check_stream(stream)

    def current_arch(self) -> str:
        major, minor = self.device.compute_capability
        return f"sm_{major}{minor}"

    def sm_count(self) -> int | None:
        return int(self.device.properties.multiprocessor_count)

    def view(self, x: Any, dtype: str | None) -> _View:
        ptr, shape, strides, found = _device_array(x, "x")
        check_device("x", x, self.device_id)
        name = dtype_name(found, dtype)
        _check_x_contiguous(_c_contiguous(shape, strides))
        return _View(x, name, shape, ptr)

    def windows(self, view: _View, lengths: Any, starts: Any, check: bool) -> Windows | None:
        """Device lengths (and starts), read by the kernels only: no host read unless `check`,
        which copies them to the host (the copy synchronises) and refuses a window outside
        the row as the emulator does. Unchecked, the kernels clamp each window to its row."""
        if lengths is None:
            return None
        shape, pointers, host = view.shape[:-1], {}, {}
        for label, array in (("lengths", lengths), ("starts", starts)):
            if array is None:
                continue
            ptr, found_shape, strides, found = _device_array(array, label)
            check_device(label, array, self.device_id)
            width = check_array(label, shape, found_shape, _c_contiguous(found_shape, strides), found,
                                None if label == "lengths" else host.get("dtype"))
            host["dtype"] = found
            pointers[label] = ptr
            if check:
                host[label] = _copy_to_host(ptr, (view.rows,), np.dtype(found))
        if check:
            check_values(host["lengths"], host.get("starts"), view.n)
        return Windows(width, pointers)

    def load_aot(self, name: str, cubin: bytes, symbol: str, source: str) -> Any:
        ObjectCode = _cuda_core().ObjectCode

        # By its symbol: get_kernel encodes a name it does not find in symbol_mapping, but
        # passes a mapped one as is to cuLibraryGetKernel, whose char* refuses a str.
        return ObjectCode.from_cubin(cubin).get_kernel(symbol)

    def load_ptx(self, name: str, ptx: bytes, symbol: str, source: str) -> Any:
        # cuda.core hands PTX to the driver (cuLibraryLoadData), whose JIT compiles it for the GPU
        return _cuda_core().ObjectCode.from_ptx(ptx).get_kernel(symbol)

    def load_jit(self, name: str, source: str) -> Any:
        from topkgen.build.compile import compile_kernel

        arch = self.current_arch()
        target = self.targets.get(arch, arch)  # an arch-specific arch's sources compile for sm_XYa, as its cubins
        compiled = compile_kernel(source, name, target)  # cached on disk, shared by processes
        return self.load_aot(name, compiled.cubin, compiled.symbol, source)

    def check(self, view: _View, k: int, out: Any, workspace: Any, plan: ChunkPlan | None,
              index_dtype: str = "int64", scratch_bytes: int = 0) -> _Arrays:
        shape = (*view.shape[:-1], k)
        size = DTYPE_SIZES[view.dtype]  # of uint16 values too
        pointers = {"x": int(view.ptr)}
        extents = [("x", view.ptr, view.ptr + view.rows * view.n * size)]
        if out is None:
            if _torch_of(view.array) is None:
                raise TopKError("out: pass (values, indices) device arrays for inputs that are not torch tensors")
        else:
            out = _out_pair(out)
            index_bytes = 4 if index_dtype == "int32" else 8
            for array, dtypes, label, itemsize in zip(out, (_value_types(view.dtype), (index_dtype,)), OUT_LABELS,
                                                      (size, index_bytes)):
                ptr, found_shape, strides, found = _device_array(array, label, written=True)
                check_device(label, array, self.device_id)
                _check_out(label, shape, found_shape, _c_contiguous(found_shape, strides), dtypes, found)
                pointers[label] = ptr
                extents.append((label, ptr, ptr + math.prod(shape) * itemsize))
        space = None  # (address, bytes) of the caller's workspace, checked whether or not this call splits
        if workspace is not None:
            space = _device_bytes(workspace, "workspace")
            check_device("workspace", workspace, self.device_id)
            if space[1]:  # an empty one is never read or written, wherever it points
                _check_alignment(space[0])
            if workspace_need(plan, scratch_bytes):
                _check_workspace_size(space[1], workspace_need(plan, scratch_bytes))
            extents.append(("workspace", space[0], space[0] + space[1]))
        _check_disjoint(extents)
        return _Arrays(out, space, pointers)

    def run(self, work: _Work, view: _View, k: int, arrays: _Arrays, stream: Any):
        core = _cuda_core()

        torch = _torch_of(view.array)
        if arrays.out is None:  # torch input (check refused any other): outputs on x's device
            shape = (*view.shape[:-1], k)
            values = torch.empty(shape, dtype=view.array.dtype, device=view.array.device)
            indices = torch.empty(shape, dtype=getattr(torch, work.index_dtype), device=view.array.device)
            pointers = {"x": arrays.pointers["x"], "values": values.data_ptr(), "indices": indices.data_ptr(),
                        **work.windows}
        else:
            values, indices = arrays.out
            pointers = {"x": arrays.pointers["x"], "values": arrays.pointers[OUT_LABELS[0]],
                        "indices": arrays.pointers[OUT_LABELS[1]], **work.windows}
        if not work.stages:  # an empty batch launches nothing
            return values, indices
        cuda_stream = self._stream(stream, view.array)
        release = None  # int32 indices are written by the kernels (their flags): no pass after them
        if work.plan is not None:
            base, release = self._workspace(work.plan.workspace_bytes, arrays.workspace, cuda_stream, torch,
                                            view.array)
            pointers["candidate_indices"], pointers["candidate_values"] = base, base + work.plan.values_offset
            if work.plan.one_launch:  # its tickets: zeroed on the stream before the launch
                pointers["tickets"] = base + work.plan.tickets_offset
                self._clear(pointers["tickets"], work.plan.workspace_bytes - work.plan.tickets_offset, cuda_stream)
        elif work.scratch_bytes:  # the large-k path's candidates, beside int32 indices
            pointers["scratch"], release = self._workspace(work.scratch_bytes, arrays.workspace, cuda_stream, torch,
                                                           view.array)
        # The driver's default limit on dynamic shared memory is 48 KiB less the kernel's
        # static shared memory (cuda.h, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES), so
        # any kernel launched with some gets its limit set, once, to the most a launch gets
        # (each launch gets its own, Stage.shared_bytes: manifest launch.shared_bytes).
        nbytes = work.launch.dynamic_shared_bytes
        if nbytes and self._shared_allowed.get(id(work.kernel), (None, 0))[1] < nbytes:
            self._allow_dynamic_shared(work.kernel, nbytes)
            self._shared_allowed[id(work.kernel)] = (work.kernel, nbytes)
        for stage in work.stages:
            config = core.LaunchConfig(grid=work.launch.grid(stage.grid_rows), block=work.launch.threads,
                                       shmem_size=stage.shared_bytes)
            # cuda.core passes Python ints as pointers (0: null) and numpy scalars with their C types.
            core.launch(cuda_stream, config, work.kernel, *arguments(work.params, stage, pointers, 0))
        if release is not None:
            release()
        return values, indices

    def _workspace(self, nbytes: int, space: tuple[int, int] | None, cuda_stream: Any, torch: Any, array: Any):
        """The workspace's device address (`nbytes`: what the call needs: a split's
        candidates, the large-k path's scratch), and what to call once the launches are enqueued.
        The caller's array costs no allocation. Otherwise the allocation is ordered on the
        launch stream and nothing waits: for torch inputs torch's caching allocator, with the
        launch stream current (it hands the block out again only to work queued after ours on
        that stream); else a cuda.core buffer from the device's memory pool, freed on the
        stream behind the launches."""
        if space is not None:  # its size checked by `check`
            return space[0], None
        if torch is not None:
            with torch.cuda.stream(torch.cuda.ExternalStream(int(cuda_stream.handle), device=array.device)):
                buffer = torch.empty(nbytes, dtype=torch.uint8, device=array.device)
            return buffer.data_ptr(), lambda: None  # dropped after the launches: reused in stream order
        buffer = self.device.allocate(nbytes, stream=cuda_stream)
        return int(buffer.handle), lambda: buffer.close(cuda_stream)

    def _clear(self, address: int, nbytes: int, cuda_stream: Any) -> None:
        """Zeroes `nbytes` of device memory on the launch stream (a split's tickets)."""
        from cuda.bindings import driver

        (err,) = driver.cuMemsetD8Async(address, 0, nbytes, int(cuda_stream.handle))
        if err != driver.CUresult.CUDA_SUCCESS:
            raise TopKError(f"cannot zero the split's tickets ({err.name})")

    def _allow_dynamic_shared(self, kernel: Any, nbytes: int) -> None:
        allow_dynamic_shared(_kernel_handle(kernel), nbytes, self.device.device_id)

    def _stream(self, stream: Any, array: Any) -> Any:
        Stream = _cuda_core().Stream

        if isinstance(stream, Stream):
            return stream
        if stream is None:
            torch = sys.modules.get("torch")
            if torch is not None and isinstance(array, torch.Tensor):
                stream = torch.cuda.current_stream(array.device).cuda_stream
            else:
                return self.device.default_stream
        if not isinstance(stream, int) and not hasattr(stream, "__cuda_stream__") \
                and isinstance(getattr(stream, "cuda_stream", None), int):
            stream = stream.cuda_stream  # a torch.cuda.Stream of a torch without the stream protocol
        if isinstance(stream, int):
            return Stream.from_handle(stream)
        return self.device.create_stream(stream)


def _copy_to_host(ptr: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A device array's contents on the host (check=True only: cuMemcpyDtoH waits for the GPU)."""
    from cuda.bindings import driver

    host = np.empty(shape, dtype)
    if host.nbytes:
        (err,) = driver.cuMemcpyDtoH(host.ctypes.data, ptr, host.nbytes)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise TopKError(f"check: cannot read the windows back from the GPU ({err.name})")
    return host


def _device_bytes(x: Any, label: str) -> tuple[int, int]:
    """(pointer, size in bytes) of a contiguous device array of any element type, read as
    _device_array reads every device array (so a cuda.core Buffer, DLPack only, serves too)."""
    ptr, shape, strides, name = _device_array(x, label, written=True)
    if not _c_contiguous(shape, strides):
        raise TopKError(f"{label}: expected a contiguous device array")
    if hasattr(x, "element_size"):  # torch
        itemsize = x.element_size()
    elif hasattr(x, "__cuda_array_interface__"):
        itemsize = int(x.__cuda_array_interface__["typestr"][2:])
    else:  # DLPack: StridedMemoryView's numpy dtype, by name (bfloat16 is ml_dtypes')
        import ml_dtypes  # noqa: F401 - registers bfloat16 with numpy

        itemsize = np.dtype(name).itemsize
    return ptr, math.prod(shape) * itemsize


def _torch_of(array: Any) -> Any:
    """torch, when `array` is a torch tensor (without importing torch: a caller that passes
    tensors has), else None."""
    torch = sys.modules.get("torch")
    return torch if torch is not None and isinstance(array, torch.Tensor) else None


# DLPack's device types (dlpack.h): kDLCUDA is one device's memory; kDLCUDAHost (pinned host)
# and kDLCUDAManaged memory are read by every device, so their ids name no device to check.
DLPACK_CUDA = 2


def array_device(x: Any) -> int | None:
    """The CUDA device whose memory holds a device array, as its exporter says: a torch
    tensor's x.device.index, a DLPack device (kDLCUDA, id); a bare __cuda_array_interface__
    names none (its pointer's context is implied), so the driver is asked of the pointer
    (`pointer_device`). None: memory every device reads (pinned host, managed), or an
    exporter or driver that does not say."""
    if type(x).__module__.startswith("torch") and hasattr(x, "data_ptr"):
        return x.device.index
    dlpack_device = getattr(x, "__dlpack_device__", None)
    if dlpack_device is not None:
        kind, ordinal = dlpack_device()
        return int(ordinal) if int(kind) == DLPACK_CUDA else None
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is not None:
        return pointer_device(int(cai["data"][0]))
    return None


def pointer_device(ptr: int) -> int | None:
    """The device ordinal of the device memory at `ptr` (cuPointerGetAttributes), or None:
    managed or host memory (every device reads it), an address no context knows, or no
    driver. The refusal this serves is a courtesy; an unknown address fails at launch as
    it always did."""
    try:
        from cuda.bindings import driver

        attribute = driver.CUpointer_attribute
        asked = [attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, attribute.CU_POINTER_ATTRIBUTE_IS_MANAGED,
                 attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL]
        err, (memory_type, managed, ordinal) = driver.cuPointerGetAttributes(len(asked), asked, ptr)
        if err != driver.CUresult.CUDA_SUCCESS or managed:
            return None
        if int(memory_type) != int(driver.CUmemorytype.CU_MEMORYTYPE_DEVICE):
            return None
        return int(ordinal)
    except Exception:  # no cuda-bindings, no libcuda: nothing to ask
        return None


def check_device(label: str, array: Any, device_id: int) -> None:
    """Refuse an array (x, out, workspace) on another GPU than the backend's: the kernels,
    launched in device `device_id`'s context, would read or write another device's
    addresses (a fault, or without one, some other memory)."""
    found = array_device(array)
    if found is not None and found != device_id:
        raise TopKError(f"{label}: on CUDA device {found}, but this TopK runs on device {device_id} (the device "
                        f"current when it was created): move it to device {device_id}, or use a TopK created "
                        f"while device {found} is current")


def _device_array(x: Any, label: str,
                  written: bool = False) -> tuple[int, tuple[int, ...], tuple[int, ...] | None, str]:
    """(pointer, shape, strides in elements or None, dtype name) of a device array; one
    the call writes (`written`: out, workspace) must not be marked read-only by its exporter.

    torch tensors are read through their own attributes (without importing torch): cuda.core
    cannot view bfloat16 through DLPack yet. Then __cuda_array_interface__, then DLPack."""
    if type(x).__module__.startswith("torch") and hasattr(x, "data_ptr"):
        if not x.is_cuda:
            raise TopKError(f"{label}: expected a CUDA tensor, got one on {x.device}")
        return x.data_ptr(), tuple(x.shape), tuple(x.stride()), str(x.dtype).removeprefix("torch.")
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is not None:
        itemsize = int(cai["typestr"][2:])
        if cai.get("strides") is not None and any(s % itemsize for s in cai["strides"]):
            # Elements off their own size's boundaries (a field of a record array): in
            # elements, floored, such strides would pass for contiguous rows.
            raise TopKError(f"{label}: strides {tuple(cai['strides'])} bytes are not multiples of its "
                            f"{itemsize}-byte elements: pass a contiguous array")
        if cai.get("mask") is not None:
            raise TopKError(f"{label}: {MASKED}")
        strides = None if cai.get("strides") is None else tuple(s // itemsize for s in cai["strides"])
        try:
            name = str(np.dtype(cai["typestr"]))  # "<u2": uint16, raw bfloat16 or float16 bits; ">f4" stays
        except TypeError:
            name = cai["typestr"]
        if written and cai["data"][1]:  # the interface's read-only flag
            raise TopKError(f"{label}: the array is read-only")
        return int(cai["data"][0]), tuple(cai["shape"]), strides, name
    if hasattr(x, "__dlpack__"):
        try:
            smv = _cuda_core().view_dlpack(x)
        except Exception as err:
            raise TopKError(f"{label}: cannot view the array through DLPack: {err}") from None
        if smv.is_device_accessible:
            if written and getattr(smv, "readonly", False):  # DLPack 1.0's read-only flag
                raise TopKError(f"{label}: the array is read-only")
            return smv.ptr, tuple(smv.shape), smv.strides, str(smv.dtype)
    raise TopKError(f"{label}: expected a device array (__cuda_array_interface__ or DLPack), got {type(x).__name__}")
