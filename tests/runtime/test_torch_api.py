"""What the cuda backend, tests/runtime/test_gpu.py and scripts/gpu_check.py call of torch, checked
against the installed torch without a GPU: each CUDA entry point exists and binds the
arguments we pass, and what runs on the CPU (tensor reading, dtype names, DLPack into
cuda.core, the host-side comparisons gpu_check makes) runs. Skipped where torch is not
installed (CI); the accelerator machine's torch is 2.11 (cu130), which this was written
against, and `make gpu-check` runs this file there before any kernel."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from topkgen import runtime  # noqa: E402

from topkgen.runtime import cuda_backend  # noqa: E402
from topkgen.runtime import TopKError  # noqa: E402



def _binds(fn, *args, **kwargs) -> None:
    inspect.signature(fn).bind(*args, **kwargs)


def test_the_cuda_entry_points_bind_our_arguments():
    cuda = torch.cuda
    _binds(cuda.ExternalStream, 0x1234, device=torch.device("cuda", 0))  # runtime._workspace
    _binds(cuda.ExternalStream, 0x1234)  # gpu_check.launchers
    _binds(cuda.Stream)
    _binds(cuda.stream, None)
    _binds(cuda.current_stream, torch.device("cuda", 0))
    _binds(cuda.Event, enable_timing=True)
    _binds(cuda.Event.record, cuda.Event(), None)
    _binds(cuda.Event.elapsed_time, cuda.Event(), cuda.Event())
    _binds(cuda.get_device_properties, 0)
    _binds(cuda.get_device_name, 0)
    _binds(cuda.clock_rate)
    _binds(cuda.synchronize)
    assert "L2_cache_size" in dir(torch._C._CudaDeviceProperties)  # gpu_check's L2 flush
    assert callable(torch.Generator().manual_seed)


def test_a_torch_stream_reaches_cuda_core_by_a_route_the_runtime_takes():
    """runtime._stream: the stream protocol (a method returning (0, handle)), or else the
    int `cuda_stream`, which every torch stream has."""
    assert "cuda_stream" in dir(torch.cuda.Stream) and "cuda_stream" in dir(torch.cuda.ExternalStream)
    if hasattr(torch.cuda.Stream, "__cuda_stream__"):
        assert callable(torch.cuda.Stream.__cuda_stream__)  # cuda.core warns for an attribute


def test_tensors_are_read_by_their_own_attributes():
    """_device_array's torch branch: a host tensor refused by name; dtype names as topkgen's."""
    x = torch.zeros(3, 4)
    assert type(x).__module__ == "torch"
    with pytest.raises(TopKError, match=r"^x: expected a CUDA tensor, got one on cpu$"):
        cuda_backend._device_array(x, "x")
    names = {t: str(t).removeprefix("torch.") for t in (torch.float32, torch.bfloat16, torch.float16, torch.uint16)}
    assert [runtime.dtype_name(n, None) for n in names.values()] == ["float32", "bfloat16", "float16", "bfloat16"]
    assert str(torch.int64).removeprefix("torch.") == "int64" and x.element_size() == 4 and x.stride() == (4, 1)


def test_dlpack_from_torch_into_cuda_core():
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    view = cuda_backend._cuda_core().view_dlpack(x)
    assert (view.ptr, tuple(view.shape), str(view.dtype)) == (x.data_ptr(), (3, 4), "float32")
    assert not view.is_device_accessible


def test_gpu_checks_host_side_comparisons_run():
    """cpp_against_python's host side, on CPU tensors: raw bits written for topkgen-cpp,
    its indices read back, gathered and compared."""
    for dtype, bits in ((torch.float32, torch.int32), (torch.bfloat16, torch.int16)):
        x = torch.randn(5, 300).to(dtype)
        values, indices = torch.topk(x, 7, dim=-1, largest=False, sorted=True)
        raw = x.cpu().view(bits)
        assert raw.numpy().dtype == np.dtype(str(bits).removeprefix("torch."))
        back = torch.frombuffer(bytearray(indices.numpy().tobytes()), dtype=torch.int64).view(5, 7)
        assert torch.equal(back, indices)
        assert torch.gather(x.cpu(), 1, back).view(bits).numpy().tobytes() == values.view(bits).numpy().tobytes()
    masked = torch.randn(4, 10)
    masked[torch.rand(masked.shape) < 0.9] = float("-inf")  # make_input's 90% -inf kind
    assert torch.full((2, 2), 0.75).dtype == torch.float32


def test_the_sm_clock_is_read_through_torch_or_cuda_bindings_nvml(gc, capsys):
    """gpu_check drops throttled batches by the SM clock: torch.cuda.clock_rate needs
    nvidia-ml-py, which torch does not pull in, so cuda-bindings' NVML serves where it has one.
    Without a driver both fail, and the log says so once."""
    try:
        from cuda.bindings import nvml
    except ImportError:
        nvml = None
    if nvml is not None:
        assert callable(nvml.init_v2) and callable(nvml.device_get_handle_by_index_v2)
        assert callable(nvml.device_get_clock_info) and int(nvml.ClockType.SM) == 1  # nvml.h: NVML_CLOCK_SM
    if runtime.gpu_unavailable() is None:
        clock = gc.sm_clock_mhz(torch)
        if clock is None:  # a measurement without throttle detection, not a failure
            pytest.skip(f"a GPU, but no NVML here: {capsys.readouterr().out.strip()}")
        assert clock > 0
        return
    assert gc.sm_clock_mhz(torch) is None and gc.sm_clock_mhz(torch) is None
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("no SM clock (torch: ") and line.endswith("throttled batches are not dropped")
