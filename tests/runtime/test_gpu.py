"""The runtime on a real GPU: the cuda backend against topkgen.runtime.reference and torch.topk.
Skipped cleanly where no GPU is present (CI and the developers' machines)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from topkgen.runtime import gpu_unavailable, reference

from ..support.topk_cases import check_topk, make_rows

REASON = gpu_unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"no GPU: {REASON}")

# (dtype, k, n, deterministic): one shape per rule of the default policy, plus JIT tiers and float16.
SHAPES = [
    ("float32", 16, 2048, False), ("bfloat16", 32, 256, True), ("float32", 16, 1024, False),
    ("float32", 10, 700, False), ("bfloat16", 60, 1500, True), ("float32", 300, 4000, False),
    ("float32", 64, 100000, False), ("bfloat16", 1000, 50000, True), ("float16", 100, 30000, True),
    ("float32", 5, 33, True),
]


@pytest.fixture(scope="module")
def op(tmp_path_factory):
    from topkgen.runtime import TopK
    from topkgen.runtime.cuda_backend import _CudaBackend

    arch = _CudaBackend().current_arch()
    out = tmp_path_factory.mktemp("gpu") / "bundle"
    subprocess.run([sys.executable, "-m", "topkgen", "build", "--arch", arch, "--out", str(out)], check=True)
    return TopK(out, backend="cuda")


def _on_device(op, x, k, largest, det, sorted_=True, index_dtype="int64"):
    from topkgen.runtime.gpu_arrays import DeviceArray
    from topkgen.runtime.cuda_backend import _cuda_core

    device = _cuda_core().Device()
    stream = device.default_stream
    dx = DeviceArray.from_host(np.ascontiguousarray(x), device, stream)
    values = DeviceArray.empty((*x.shape[:-1], k), x.dtype, device, stream)
    indices = DeviceArray.empty((*x.shape[:-1], k), np.dtype(index_dtype), device, stream)
    op(dx, k, largest=largest, deterministic=det, sorted=sorted_, index_dtype=index_dtype, out=(values, indices),
       stream=stream)
    stream.sync()
    return values.to_host(stream), indices.to_host(stream)


@pytest.mark.parametrize("dtype,k,n,det", SHAPES)
@pytest.mark.parametrize("largest", [True, False])
def test_cuda_backend_matches_the_reference(op, dtype, k, n, det, largest):
    x = make_rows(dtype, 7, n, seed=n + k)
    values, indices = _on_device(op, x, k, largest, det)
    sel = op.explain(dtype, k, n, det)
    check_topk(x, values, indices, k, largest, sel.kernel.mode == "deterministic", dtype,
               what=f"{sel.kernel.name} ({sel.source})")


@pytest.mark.parametrize("dtype,k,n,det", SHAPES)
def test_cuda_backend_matches_torch_topk(op, dtype, k, n, det):
    torch = pytest.importorskip("torch")
    tdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    x = torch.randn(33, n, device="cuda").to(tdtype)
    values, indices = op(x, k, deterministic=det)
    ref_values, _ = torch.topk(x, k, dim=-1, largest=True, sorted=True)
    torch.cuda.synchronize()
    assert torch.equal(values, ref_values)
    assert torch.equal(torch.gather(x, -1, indices), values)


def test_sliced_misaligned_rows_on_the_gpu(op):
    torch = pytest.importorskip("torch")
    base = torch.randn(4 * 1001 + 3, device="cuda")
    x = base[3:].view(4, 1001)  # every row starts off a 16-byte boundary
    values, indices = op(x, 50, deterministic=True)
    expect = torch.topk(x, 50, dim=-1)
    assert torch.equal(values, expect.values)


def test_jit_disabled_still_serves_aot_dtypes(op, monkeypatch):
    monkeypatch.setenv("TOPKGEN_DISABLE_JIT", "1")
    x = make_rows("float32", 3, 2048, seed=1)
    values, indices = _on_device(op, x, 16, True, False)
    check_topk(x, values, indices, 16, True, False, "float32")
    assert op.explain("float32", 16, 2048).source == "aot"



@pytest.mark.parametrize("dtype,k,n,rows,det", [("float32", 16, 2048, 3, False), ("float32", 40, 3000, 3, False),
                                                ("bfloat16", 700, 9000, 3, True), ("float32", 2048, 163840, 1, False),
                                                ("float32", 40000, 163840, 2, False), ("bfloat16", 5000, 20000, 2, True)])
def test_unsorted_int32_on_the_gpu(op, dtype, k, n, rows, det):
    """sorted=False and int32 indices, written by the kernels into cuda.core buffers (no
    torch): the sorted call's set; deterministic kernels return the sorted order itself. The
    large-k path (k=40000, 5000) takes its candidates in scratch the backend allocates."""
    x = make_rows(dtype, rows, n, seed=rows + k)
    values, indices = _on_device(op, x, k, True, det, sorted_=False, index_dtype="int32")
    assert indices.dtype == np.int32
    if det:
        check_topk(x, values, indices.astype(np.int64), k, True, True, dtype, what=f"unsorted det k={k}")
        return
    order = np.argsort(-reference.select_keys(values, True).astype(np.int64), axis=-1, kind="stable")
    values, indices = np.take_along_axis(values, order, -1), np.take_along_axis(indices.astype(np.int64), order, -1)
    check_topk(x, values, indices, k, True, False, dtype, what=f"unsorted int32 k={k}")


@pytest.mark.parametrize("dtype,k,n,rows,det", [("float32", 256, 131072, 1, True), ("float32", 16, 262144, 4, False),
                                                ("bfloat16", 1024, 262144, 16, True), ("float32", 1024, 131072, 64, True)])
def test_split_rows_on_the_gpu(op, dtype, k, n, rows, det):
    """Small batches of long rows run split (two launches through a workspace): against the
    reference, with the runtime's own workspace and with one passed in."""
    torch = pytest.importorskip("torch")
    assert op.choose(dtype, k, n, det, rows).chunks > 1
    x = make_rows(dtype, rows, n, seed=rows + k)
    values, indices = _on_device(op, x, k, True, det)
    check_topk(x, values, indices, k, True, det, dtype, what=f"split {rows} x {n} k={k}")
    tdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    tx = torch.randn(rows, n, device="cuda").to(tdtype)
    workspace = torch.empty(op.workspace_bytes(dtype, k, n, rows, det), dtype=torch.uint8, device="cuda")
    got_values, got_indices = op(tx, k, deterministic=det, workspace=workspace)
    ref_values, _ = torch.topk(tx, k, dim=-1)
    torch.cuda.synchronize()
    assert torch.equal(got_values, ref_values) and torch.equal(torch.gather(tx, -1, got_indices), got_values)


def test_arrays_are_found_on_the_device_that_holds_them(op):
    """runtime.check_device's sources on a real GPU: the driver's answer for a bare
    __cuda_array_interface__ (cuPointerGetAttributes) and torch's device index. A wrong answer
    here (None) would let an array on another GPU through unrefused."""
    from topkgen import runtime
    from topkgen.runtime import cuda_backend
    from topkgen.runtime.gpu_arrays import DeviceArray

    device = cuda_backend._cuda_core().Device()
    stream = device.default_stream
    array = DeviceArray.empty((4, 8), np.float32, device, stream)
    assert runtime.array_device(array) == device.device_id == op._backend.device_id
    torch = pytest.importorskip("torch")
    assert runtime.array_device(torch.empty(4, device="cuda")) == torch.cuda.current_device()


def test_gpu_check_reads_the_clock_of_the_benchmarked_gpu():
    """scripts/gpu_check.py read the SM clock of NVML's device 0, which is not the
    benchmark's GPU under CUDA_VISIBLE_DEVICES or on another current device. It names the
    device by its PCI bus id: NVML's handle for it is the same GPU (same UUID) as CUDA's."""
    import importlib.util
    from pathlib import Path

    from topkgen.runtime.cuda_backend import _cuda_core

    nvml = pytest.importorskip("cuda.bindings.nvml")
    path = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check", path)
    gpu_check = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = gpu_check
    spec.loader.exec_module(gpu_check)
    nvml.init_v2()
    device = _cuda_core().Device()  # the current one, as the benchmark's
    handle = nvml.device_get_handle_by_pci_bus_id_v2(gpu_check.pci_bus_id(device.device_id))
    assert nvml.device_get_uuid(handle).lower().removeprefix("gpu-") == device.uuid.lower()
    assert nvml.device_get_clock_info(handle, nvml.ClockType.SM) > 0
