"""A minimal device array for host inputs on the cuda backend (`topkgen run`, the GPU
tests): cuda.core memory exposed through __cuda_array_interface__."""

from __future__ import annotations

from typing import Any

import numpy as np


class DeviceArray:
    def __init__(self, buffer: Any, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.buffer, self.shape, self.dtype = buffer, tuple(shape), np.dtype(dtype)

    @classmethod
    def empty(cls, shape: tuple[int, ...], dtype: Any, device: Any, stream: Any) -> "DeviceArray":
        nbytes = max(1, int(np.prod(shape)) * np.dtype(dtype).itemsize)
        return cls(device.allocate(nbytes, stream=stream), shape, np.dtype(dtype))

    @classmethod
    def from_host(cls, array: np.ndarray, device: Any, stream: Any) -> "DeviceArray":
        from cuda.bindings import driver

        out = cls.empty(array.shape, array.dtype, device, stream)
        (err,) = driver.cuMemcpyHtoDAsync(int(out.buffer.handle), array.ctypes.data, array.nbytes,
                                          int(stream.handle))
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuMemcpyHtoDAsync: {err}")
        stream.sync()
        return out

    def to_host(self, stream: Any) -> np.ndarray:
        from cuda.bindings import driver

        host = np.empty(self.shape, self.dtype)
        (err,) = driver.cuMemcpyDtoHAsync(host.ctypes.data, int(self.buffer.handle), host.nbytes, int(stream.handle))
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuMemcpyDtoHAsync: {err}")
        stream.sync()
        return host

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        typestr = "<u2" if self.dtype.name == "bfloat16" else self.dtype.str
        return {"shape": self.shape, "typestr": typestr, "data": (int(self.buffer.handle), False),
                "strides": None, "version": 3}
