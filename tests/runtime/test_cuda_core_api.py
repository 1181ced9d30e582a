"""The cuda backend's use of cuda-core and cuda-bindings, checked against the versions
installed here by shape: no GPU is needed to import them, read their classes or view a host
array. cuda-core moved out of cuda.core.experimental (0.5 to 0.7 kept it only to warn, 1.0
removed it) and renamed or hid some of what the backend reads; the runtime picks each by
feature detection, and these tests fail if the installed version lacks one of them."""

from __future__ import annotations

from dataclasses import replace

import importlib
import warnings

import numpy as np
import pytest

pytest.importorskip("cuda.core")

from topkgen import runtime  # noqa: E402

from topkgen.runtime import cuda_backend  # noqa: E402
from topkgen.runtime import TopKError  # noqa: E402

# What topkgen.runtime, topkgen.runtime.gpu_arrays and scripts/gpu_check.py read of each class.
USED = {
    "Device": ("set_current", "compute_capability", "allocate", "create_stream", "default_stream", "device_id",
               "pci_bus_id", "properties"),
    "ObjectCode": ("from_cubin", "from_ptx", "get_kernel"),
    "Stream": ("from_handle", "handle", "sync"),
    "Buffer": ("handle", "close"),
}


def _package():
    import cuda.core

    return cuda.core if hasattr(cuda.core, "Device") else importlib.import_module("cuda.core.experimental")


def test_cuda_core_resolves_without_a_deprecation_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cuda_backend._cuda_core.cache_clear()  # resolved anew, under this filter
        core = cuda_backend._cuda_core()
    for name in ("Device", "ObjectCode", "LaunchConfig", "launch", "Stream", "view_dlpack"):
        assert callable(getattr(core, name)), name


def test_the_classes_have_what_the_backend_reads():
    package = _package()
    for cls, attributes in USED.items():
        missing = [a for a in attributes if not hasattr(getattr(package, cls), a)]
        assert not missing, f"cuda.core {cls} lacks {missing}"
    kernel = package.Kernel
    assert hasattr(kernel, "handle") or hasattr(kernel, "_handle"), "cuda_backend._kernel_handle finds no handle"
    # Device.properties (the SM count a split batch is planned for: cuda_backend.sm_count)
    properties = importlib.import_module(package.Device.__module__).DeviceProperties
    assert hasattr(properties, "multiprocessor_count"), "cuda.core DeviceProperties lacks multiprocessor_count"


def test_nvml_has_what_gpu_check_reads_the_clock_with():
    """scripts/gpu_check.py finds the benchmarked GPU in NVML by its PCI bus id (cuda.core's
    Device.pci_bus_id, in USED above), where cuda-bindings carries NVML (later 13.x wheels)."""
    nvml = pytest.importorskip("cuda.bindings.nvml")
    for name in ("init_v2", "device_get_handle_by_pci_bus_id_v2", "device_get_clock_info", "ClockType"):
        assert hasattr(nvml, name), f"cuda.bindings.nvml lacks {name}"
    assert hasattr(nvml.ClockType, "SM")


def test_kernel_handles_convert_as_the_shared_memory_opt_in_converts_them():
    from cuda.bindings import driver

    assert int(driver.CUkernel(0x7F00_1234)) == 0x7F00_1234
    attribute = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    assert int(attribute) == 8  # cuda.h's value: the attribute the C++ loader sets too
    assert callable(driver.cuKernelSetAttribute) and callable(driver.cuFuncSetAttribute)


def test_a_dlpack_view_gives_pointer_shape_and_type():
    """view_dlpack (from_dlpack from 0.5 on, the constructor before) on a host array: the
    fields _device_array reads, and the host array refused as no device array."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    view = cuda_backend._cuda_core().view_dlpack(x)
    assert (view.ptr, tuple(view.shape), str(view.dtype)) == (x.ctypes.data, (3, 4), "float32")
    assert view.strides in (None, (4, 1)) and not view.is_device_accessible

    class DLPackOnly:  # neither torch nor __cuda_array_interface__: the DLPack path
        def __init__(self, array):
            self.array = array

        def __dlpack__(self, **kwargs):
            return self.array.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self.array.__dlpack_device__()

    with pytest.raises(TopKError, match=r"^x: expected a device array \(__cuda_array_interface__ or DLPack\), "
                                        r"got DLPackOnly$"):
        cuda_backend._device_array(DLPackOnly(x), "x")


def _driver_absent() -> tuple[type, str]:
    """What a driver call raises on this machine (no libcuda): the answer of a call whose
    arguments cuda-bindings accepted. Skips where a driver exists (the GPU tests run there)."""
    from cuda.bindings import driver

    if runtime.gpu_unavailable() is None:
        pytest.skip("a CUDA driver is present: the GPU tests make these calls for real")
    try:
        driver.cuInit(0)
    except Exception as err:
        return type(err), str(err)
    pytest.skip("cuInit answers here: the driver library loads")


def test_the_shared_memory_opt_in_binds_its_arguments_for_every_handle_type():
    """allow_dynamic_shared with each handle a cuda.core release hands out (1.x: Kernel.handle
    is a CUkernel; 0.4: a CUkernel, or a CUfunction from the module API on a pre-12 driver; an
    address as int) reaches the driver: cuda-bindings converted every argument, which it does
    before it loads libcuda (a wrong type is refused there, as the last call shows)."""
    from cuda.bindings import driver

    absent = _driver_absent()
    handles = [driver.CUkernel(0x7F00_1234), driver.CUfunction(0x7F00_1234), 0x7F00_1234]
    kernel = _package().Kernel
    if hasattr(kernel, "from_handle"):  # 1.x: a real Kernel around a foreign CUkernel address
        handle = cuda_backend._kernel_handle(kernel.from_handle(0x7F00_1234))
        assert isinstance(handle, (driver.CUkernel, int)) and int(handle) == 0x7F00_1234
        handles.append(handle)
    for handle in handles:
        with pytest.raises(Exception) as info:
            runtime.allow_dynamic_shared(handle, 200_000, 0)
        assert (type(info.value), str(info.value)) == absent, type(handle)
    attribute = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    with pytest.raises(TypeError):  # a device that is no integer: refused before the driver is sought
        driver.cuKernelSetAttribute(attribute, 200_000, driver.CUkernel(0x7F00_1234), "0")


def test_the_tickets_memset_binds_its_arguments():
    """The cuda backend zeroes a split's tickets without torch with cuMemsetD8Async(address,
    0, bytes, stream handle): cuda-bindings converts each argument before it seeks libcuda, so
    the call reaches the driver (absent here); a stream that is no handle is refused before."""
    from cuda.bindings import driver

    absent = _driver_absent()
    with pytest.raises(Exception) as info:
        driver.cuMemsetD8Async(0x7F00_1234, 0, 64, 0x7F00_5678)
    assert (type(info.value), str(info.value)) == absent
    with pytest.raises(TypeError):
        driver.cuMemsetD8Async(0x7F00_1234, 0, 64, "stream")


def _param_holder():
    """cuda.core's packer of launch arguments (what launch() hands cuLaunchKernelEx)."""
    for name in ("cuda.core._kernel_arg_handler", "cuda.core.experimental._kernel_arg_handler"):
        try:
            return importlib.import_module(name).ParamHolder
        except ImportError:
            continue
    pytest.fail("cuda.core has no _kernel_arg_handler.ParamHolder in this version: check how launch() packs "
                "arguments (runtime.arguments passes pointers as int, the rest as numpy scalars)")


def test_launch_arguments_are_packed_with_the_kernels_c_types():
    """Both launches of a split radix kernel, and its one launch (tickets): runtime.arguments'
    list packed by the installed cuda.core (as launch() packs it), read back at each
    parameter's C type."""
    import ctypes

    from topkgen import policy
    from topkgen.manifest.params import params
    from topkgen.policy.split import ChunkPlan, stages

    merging = policy.loads(policy.default_policy_path().read_text().replace("one_launch: false", "one_launch: true"),
                           source="one_launch")
    spec = next(s for s in policy.all_kernels(merging, "sm_90")
                if "tickets" in [p["name"] for p in params(s)] and s.dtype == "float32")
    plan = ChunkPlan(3, 262144, 1000, 8, 4)
    pointers = {"x": 0x7F00_0000_1000, "values": 0x7F00_0000_2000, "indices": 0x7F00_0000_3000,
                "candidate_indices": 0x7F00_0000_4000, "candidate_values": 0x7F00_0000_8000,
                "tickets": 0x7F00_0000_9000}
    ctypes_of = {"int": ctypes.c_int32, "long long": ctypes.c_int64}
    ParamHolder = _param_holder()
    launches = [*stages(3, 262144, 1000, True, plan, shared=spec.shared),  # shared_bytes: each launch's
                *stages(3, 262144, 1000, True, replace(plan, one_launch=True), shared=spec.shared, flags=2)]
    assert [stage.buffers["tickets"] for stage in launches] == [None, None, "tickets"]
    for stage in launches:
        args = runtime.arguments(params(spec), stage, pointers, 0)
        holder = ParamHolder(args)
        slots = (ctypes.c_void_p * len(args)).from_address(holder.ptr)
        for slot, param in zip(slots, params(spec)):
            name, ctype = param["name"], param["ctype"]
            if ctype.endswith("*"):
                buffer = stage.buffers[name]
                expect = 0 if buffer is None else pointers[buffer]
                assert ctypes.c_uint64.from_address(slot).value == expect, name
            else:
                assert ctypes_of[ctype].from_address(slot).value == stage.scalars[name], name
