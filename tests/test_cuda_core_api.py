"""The cuda backend's use of cuda-core and cuda-bindings, checked against the versions
installed here by shape: no GPU is needed to import them, read their classes or view a host
array. cuda-core moved out of cuda.core.experimental (0.5 to 0.7 kept it only to warn, 1.0
removed it) and renamed or hid some of what the backend reads; the runtime picks each by
feature detection, and these tests fail if the installed version lacks one of them."""

from __future__ import annotations

import importlib
import warnings

import numpy as np
import pytest

pytest.importorskip("cuda.core")

from topkgen import runtime  # noqa: E402
from topkgen.runtime import TopKError  # noqa: E402

# What topkgen.runtime, topkgen.gpu_arrays and scripts/gpu_check.py read of each class.
USED = {
    "Device": ("set_current", "compute_capability", "allocate", "create_stream", "default_stream", "device_id"),
    "ObjectCode": ("from_cubin", "get_kernel"),
    "Stream": ("from_handle", "handle", "sync"),
    "Buffer": ("handle", "close"),
}


def _package():
    import cuda.core

    return cuda.core if hasattr(cuda.core, "Device") else importlib.import_module("cuda.core.experimental")


def test_cuda_core_resolves_without_a_deprecation_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        runtime._cuda_core.cache_clear()  # resolved anew, under this filter
        core = runtime._cuda_core()
    for name in ("Device", "ObjectCode", "LaunchConfig", "launch", "Stream", "view_dlpack"):
        assert callable(getattr(core, name)), name


def test_the_classes_have_what_the_backend_reads():
    package = _package()
    for cls, attributes in USED.items():
        missing = [a for a in attributes if not hasattr(getattr(package, cls), a)]
        assert not missing, f"cuda.core {cls} lacks {missing}"
    kernel = package.Kernel
    assert hasattr(kernel, "handle") or hasattr(kernel, "_handle"), "runtime._kernel_handle finds no handle"


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
    view = runtime._cuda_core().view_dlpack(x)
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
        runtime._device_array(DLPackOnly(x), "x")
